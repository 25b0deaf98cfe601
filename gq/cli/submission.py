"""`gq submit` from its option values: the script, its directives, the job spec, the request.

Free of typer, so that the fast path (gq/cli/fast.py) runs the very same code as the typer
command (gq/cli/submit.py); each passes its own parser for the words of directive lines.
"""

from __future__ import annotations

import os
import sys
import time as _time
from collections.abc import Callable
from typing import Any

from gq.cli.directives import directive_lines, translate_slurm
from gq.errors import UsageError
from gq.units import parse_duration, parse_size, parse_time, signal_parts, signal_text

#: Options whose value directives may supply; the command line wins over both kinds of line.
MERGEABLE = ("gpus", "nodes", "gpu_type", "gpu_mem", "cpus", "mem", "time", "qos", "name",
             "output", "error", "chdir", "export", "no_requeue", "job_signal", "array",
             "dependency", "kill_on_invalid_dep", "hold", "begin", "account", "share", "retries")

#: Option values and the names of those given on their line, from a command line's words.
Parsed = tuple[dict[str, Any], set[str]]


class Unparsed(Exception):
    """Words the fast path's parser leaves to typer (which then reads the whole command)."""


def run(text: str, default_name: str, params: dict[str, Any], given: set[str],
        parse_words: Callable[[list[str]], Parsed]) -> int:
    """Submit `text` (read by `script_text`) with the command line's option values `params`
    (`given`: those on the command line) and its directives (read by `parse_words`)."""
    values = merge_directives(text, params, given, parse_words)
    spec = build_spec(text, default_name, list(params["args"] or []), values)
    from gq.client import Client
    with Client() as client:
        job_id = client.submit([spec])[0]
        if params["parsable"]:
            print(job_id)
        elif params["as_json"]:
            from gq.cli import render
            render.emit_json({"id": job_id})
        else:
            print(f"Submitted batch job {job_id}")
        sys.stdout.flush()
        if params["wait"]:
            return exit_code_of(client.wait([job_id])[0])
    return 0


def script_text(script: str | None, wrap: str | None) -> tuple[str, str]:
    """The batch script's text and the job name it implies."""
    if wrap is not None:
        if script:
            raise UsageError("give either a SCRIPT or --wrap, not both")
        return f"#!/bin/sh\n{wrap}\n", "wrap"
    if script is None or script == "-":
        if script is None and sys.stdin.isatty():
            raise UsageError("nothing to run: give a SCRIPT, '-' for stdin, or --wrap 'COMMAND'")
        return sys.stdin.read(), "stdin"
    try:
        with open(script) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read script {script!r}: {exc}") from None
    if not text.startswith("#!"):
        raise UsageError(f"{script}: this does not look like a batch script: the first line must "
                         "start with #! and an interpreter, e.g. #!/bin/bash")
    return text, os.path.basename(script)


def merge_directives(text: str, params: dict[str, Any], given: set[str],
                     parse_words: Callable[[list[str]], Parsed]) -> dict[str, Any]:
    """Option values from `#SBATCH`, then `#GQ` lines, then the command line (last wins)."""
    values = {k: params[k] for k in MERGEABLE}
    gq_words, slurm_words = directive_lines(text)
    warnings: list[str] = []
    layers = [translate_slurm(slurm_words, warnings), gq_words]
    try:
        parsed = [parse_words(list(words)) for words in layers if words]
    except Unparsed:
        raise  # nothing printed: typer reads the command line again
    except Exception:
        _warn(warnings)  # before the error, as they come first in the script
        raise
    _warn(warnings)
    for sub, sub_given in parsed:
        for key in MERGEABLE:
            if key in sub_given and key not in given:
                values[key] = sub[key]
    return values


def _warn(warnings: list[str]) -> None:
    if warnings:
        from gq.cli import render  # not before: a plain submit prints no table
        for warning in warnings:
            render.message(warning)


def build_spec(text: str, default_name: str, args: list[str], v: dict[str, Any]
               ) -> dict[str, Any]:
    """A job spec from option values, with every value checked here, before anything is sent:
    every field of gq.model.JobSpec (its wire form), built without the dataclass, whose module
    would cost every `gq submit` more than the rest of its spec (tests/test_fast.py holds the
    two to each other)."""
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
    return dict(
        script=text, name=v["name"] or default_name, args=args, user="", uid=os.getuid(),
        gid=os.getgid(), cwd=cwd, env=export_env(v["export"], dict(os.environ)),
        nodes=v["nodes"], gpus=v["gpus"], gpu_type=v["gpu_type"],
        gpu_mem=parse_size(v["gpu_mem"]) if v["gpu_mem"] else None, cpus=v["cpus"],
        mem=parse_size(v["mem"]) if v["mem"] else 0,
        time_limit_s=parse_duration(v["time"]) if v["time"] else None, qos=v["qos"],
        output=v["output"], error=v["error"], requeue=not v["no_requeue"],
        retries=v["retries"],
        signal=signal_text(*signal_parts(v["job_signal"])) if v["job_signal"] else None,
        hold=v["hold"],
        begin_time=parse_time(v["begin"], _time.time(), future=True) if v["begin"] else None,
        dependency=_checked_dependency(v["dependency"]),
        kill_on_invalid_dep=v["kill_on_invalid_dep"], array=_checked_array(v["array"]),
        account=v["account"], share=v["share"])


def _checked_dependency(text: str | None) -> str | None:
    if not text:
        return None
    from gq.deps import parse_dependency
    return str(parse_dependency(text))


def _checked_array(text: str | None) -> str | None:
    if text is None:
        return None
    from gq.arrays import parse_array
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
