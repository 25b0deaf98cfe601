"""`gq submit`'s options for typer; what it does is gq/cli/submission.py's."""

from __future__ import annotations

from typing import Optional

import typer

from gq.cli import submission
from gq.cli.clickcompat import ParameterSource
from gq.cli.clickcompat import UsageError as ClickUsageError
from gq.errors import UsageError


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
    text, default_name = submission.script_text(script, wrap)
    given = {k for k in ctx.params if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    return submission.run(text, default_name, ctx.params, given,
                          lambda words: _parse_words(ctx, words))


def _parse_words(ctx: typer.Context, words: list[str]) -> submission.Parsed:
    """Directive words read as `gq submit`'s command line would be."""
    try:
        sub = ctx.command.make_context("submit", words, parent=ctx.parent)
    except ClickUsageError as exc:
        raise UsageError(f"bad directive in the script: {exc.format_message()}") from None
    return sub.params, {k for k in sub.params
                        if sub.get_parameter_source(k) == ParameterSource.COMMANDLINE}
