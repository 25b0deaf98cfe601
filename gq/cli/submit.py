"""`gq submit`: options, `#GQ`/`#SBATCH` directives, the job spec, and `--wait`."""

from __future__ import annotations

import os
import sys
import time as _time
from pathlib import Path
from typing import Any, Optional

import typer

from gq.cli import render
from gq.cli.clickcompat import ParameterSource
from gq.cli.clickcompat import UsageError as ClickUsageError
from gq.arrays import parse_array
from gq.cli.directives import directive_lines, translate_slurm
from gq.deps import parse_dependency
from gq.errors import UsageError
from gq.model import JobSpec, parse_duration, parse_signal, parse_size, parse_time

#: Options whose value directives may supply; the command line wins over both kinds of line.
_MERGEABLE = ("gpus", "nodes", "gpu_type", "gpu_mem", "cpus", "mem", "time", "qos", "name",
              "output", "error", "chdir", "export", "no_requeue", "job_signal", "array",
              "dependency", "kill_on_invalid_dep", "hold", "begin", "account", "share", "retries")


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)


def submit(
    ctx: typer.Context,
    script: Optional[str] = typer.Argument(None, help="batch script ('-' reads stdin)"),
    args: Optional[list[str]] = typer.Argument(None, help="arguments passed to the script"),
    wrap: Optional[str] = typer.Option(None, "--wrap", help="run this shell command instead of a script"),
    gpus: int = typer.Option(1, "-g", "--gpus", help="GPUs per node"),
    nodes: int = typer.Option(1, "-N", "--nodes", help="nodes, started together (gang)"),
    gpu_type: Optional[str] = typer.Option(None, "--gpu-type", help="GPU model, e.g. h100"),
    gpu_mem: Optional[str] = typer.Option(None, "--gpu-mem", help="minimum VRAM per GPU, e.g. 40G"),
    share: bool = typer.Option(False, "--share", help="share GPUs with other --share jobs while "
                               "their --gpu-mem sums fit in VRAM"),
    cpus: int = typer.Option(0, "-c", "--cpus", help="CPUs per node"),
    mem: Optional[str] = typer.Option(None, "--mem", help="memory per node, e.g. 64G"),
    time: Optional[str] = typer.Option(None, "-t", "--time", help="time limit: MM, HH:MM:SS, D-HH, 2h ..."),
    qos: Optional[str] = typer.Option(None, "-q", "--qos", help="quality of service (tier)"),
    name: Optional[str] = typer.Option(None, "-J", "--name", help="job name"),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="stdout file pattern (%j %x %u %A %a)"),
    error: Optional[str] = typer.Option(None, "-e", "--error", help="stderr file pattern (default: with stdout)"),
    chdir: Optional[str] = typer.Option(None, "-D", "--chdir", help="working directory"),
    export: str = typer.Option("ALL", "--export", help="ALL, NONE, or VAR[=VAL],... (with ALL, added)"),
    no_requeue: bool = typer.Option(False, "--no-requeue", help="never requeue after a node failure"),
    retries: Optional[int] = typer.Option(
        None, "--retries", metavar="N",
        help="requeue after a node fault at most N times, then end NODE_FAIL "
             "(default: [head] default_retries)"),
    job_signal: Optional[str] = typer.Option(
        None, "--signal", metavar="[B:]SIG[@SECONDS]",
        help="send SIG SECONDS (default 60) before the time limit, and instead of SIGTERM "
             "when preempted; B: only to the script's own process"),
    array: Optional[str] = typer.Option(
        None, "-a", "--array", metavar="INDICES[%LIMIT]",
        help="a job array: one task per index (0-99, 1,3,7, 0-99:2), at most LIMIT running"),
    dependency: Optional[str] = typer.Option(
        None, "-d", "--dependency", metavar="TYPE:ID[:ID][,...]",
        help="start after other jobs: after, afterany, afterok, afternotok, singleton; "
             "',' all of them, '?' any"),
    kill_on_invalid_dep: bool = typer.Option(
        False, "--kill-on-invalid-dep", help="cancel the job when its dependency can never be met"),
    hold: bool = typer.Option(False, "-H", "--hold", help="submit held: it waits for gq release"),
    begin: Optional[str] = typer.Option(
        None, "-b", "--begin", metavar="TIME", help="not before TIME: now+1h, 16:00, 2026-12-01T09:00"),
    account: Optional[str] = typer.Option(None, "-A", "--account", help="account charged in gq report"),
    wait: bool = typer.Option(False, "--wait", help="block until the job ends; exit with its exit code"),
    parsable: bool = typer.Option(False, "--parsable", help="print only the job id"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> int:
    """Submit a batch job (like sbatch)."""
    text, default_name = _script_text(script, wrap)
    values = _merge_directives(ctx, text)
    spec = build_spec(text, default_name, list(args or []), values)
    from gq.client import Client
    with Client() as client:
        job_id = client.submit([spec])[0]
        if parsable:
            print(job_id)
        elif as_json:
            render.emit_json({"id": job_id})
        else:
            print(f"Submitted batch job {job_id}")
        sys.stdout.flush()
        if wait:
            return exit_code_of(client.wait([job_id])[0])
    return 0


def _script_text(script: str | None, wrap: str | None) -> tuple[str, str]:
    if wrap is not None:
        if script:
            raise UsageError("give either a SCRIPT or --wrap, not both")
        return f"#!/bin/sh\n{wrap}\n", "wrap"
    if script is None or script == "-":
        if script is None and sys.stdin.isatty():
            raise UsageError("nothing to run: give a SCRIPT, '-' for stdin, or --wrap 'COMMAND'")
        return sys.stdin.read(), "stdin"
    try:
        text = Path(script).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read script {script!r}: {exc}") from None
    if not text.startswith("#!"):
        raise UsageError(f"{script}: this does not look like a batch script: the first line must "
                         "start with #! and an interpreter, e.g. #!/bin/bash")
    return text, os.path.basename(script)


def _merge_directives(ctx: typer.Context, text: str) -> dict[str, Any]:
    """Option values from `#SBATCH`, then `#GQ` lines, then the command line (last wins)."""
    values = {k: ctx.params[k] for k in _MERGEABLE}
    gq_words, slurm_words = directive_lines(text)
    warnings: list[str] = []
    layers = [translate_slurm(slurm_words, warnings), gq_words]
    for warning in warnings:
        render.message(warning)
    for words in layers:
        if not words:
            continue
        try:
            sub = ctx.command.make_context("submit", list(words), parent=ctx.parent)
        except ClickUsageError as exc:
            raise UsageError(f"bad directive in the script: {exc.format_message()}") from None
        for key in _MERGEABLE:
            if sub.get_parameter_source(key) == ParameterSource.COMMANDLINE and \
                    ctx.get_parameter_source(key) != ParameterSource.COMMANDLINE:
                values[key] = sub.params[key]
    return values


def build_spec(text: str, default_name: str, args: list[str], v: dict[str, Any]) -> JobSpec:
    """A JobSpec from option values, with every value checked here, before anything is sent."""
    if v["gpus"] < 0:
        raise UsageError(f"bad --gpus {v['gpus']}: must be 0 or more")
    if v["nodes"] < 1:
        raise UsageError(f"bad --nodes {v['nodes']}: must be 1 or more")
    if v["cpus"] < 0:
        raise UsageError(f"bad --cpus {v['cpus']}: must be 0 or more")
    if v["retries"] is not None and v["retries"] < 0:
        raise UsageError(f"bad --retries {v['retries']}: must be 0 or more")
    if v["retries"] and v["no_requeue"]:
        raise UsageError("--retries and --no-requeue contradict each other: --no-requeue means "
                         "no requeue at all (--retries 0 ends NODE_FAIL at the first node fault)")
    if v["share"] and not (v["gpu_mem"] and v["gpus"]):
        raise UsageError("--share needs --gpu-mem (the VRAM each of its GPUs must leave it), "
                         "e.g. --share --gpu-mem 20G, and at least one GPU")
    cwd = os.path.abspath(v["chdir"]) if v["chdir"] else os.getcwd()
    return JobSpec(
        script=text, name=v["name"] or default_name, args=args, user="", uid=os.getuid(),
        gid=os.getgid(), cwd=cwd, env=export_env(v["export"], dict(os.environ)),
        nodes=v["nodes"], gpus=v["gpus"], gpu_type=v["gpu_type"],
        gpu_mem=parse_size(v["gpu_mem"]) if v["gpu_mem"] else None, cpus=v["cpus"],
        mem=parse_size(v["mem"]) if v["mem"] else 0,
        time_limit_s=parse_duration(v["time"]) if v["time"] else None, qos=v["qos"],
        output=v["output"], error=v["error"], requeue=not v["no_requeue"],
        retries=v["retries"],
        signal=str(parse_signal(v["job_signal"])) if v["job_signal"] else None,
        hold=v["hold"], kill_on_invalid_dep=v["kill_on_invalid_dep"], account=v["account"],
        begin_time=parse_time(v["begin"], _time.time(), future=True) if v["begin"] else None,
        dependency=str(parse_dependency(v["dependency"])) if v["dependency"] else None,
        array=_checked_array(v["array"]), share=v["share"])


def _checked_array(text: str | None) -> str | None:
    if text is None:
        return None
    parse_array(text)  # a bad spec is a usage error here, before anything is sent
    return text.strip()


def export_env(export: str, environ: dict[str, str]) -> dict[str, str]:
    """Slurm's --export: ALL, NONE, or a list of VAR / VAR=VALUE (with ALL: added to everything)."""
    items = [i for i in export.split(",") if i]
    if not items:
        raise UsageError("bad --export '': expected ALL, NONE or VAR[=VALUE],...")
    env: dict[str, str] = {}
    for item in items:
        if item == "ALL":
            env.update(environ)
        elif item == "NONE":
            continue
        elif "=" in item:
            key, _, value = item.partition("=")
            env[key] = value
        elif item.replace("_", "").isalnum():
            if item in environ:
                env[item] = environ[item]
        else:
            raise UsageError(f"bad --export item {item!r}: expected ALL, NONE, VAR or VAR=VALUE")
    return env


def exit_code_of(job: dict[str, Any]) -> int:
    """The exit status `--wait` and `gq wait` return for a finished job."""
    if job["exit_code"] is not None:
        return int(job["exit_code"])
    return 0 if job["state"] == "COMPLETED" else 1
