"""`gq checkpoint`: inside a job, tell gqd that the job's run saved its progress now, so that a
preemption loses only the work since (gq/head/checkpoints.py). The run is the job's environment's
(GQ_JOB_ID, GQ_RESTART_COUNT); touching `$GQ_CHECKPOINT_DIR/.gq-checkpoint` does the same
without a gq client."""

from __future__ import annotations

import os

import typer

from gq.cli import query
from gq.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("checkpoint")(checkpoint)


def checkpoint(quiet: bool = typer.Option(False, "-q", "--quiet",
                                          help="print nothing")) -> int:
    """Inside a job: its run saved its progress now (a preemption loses only the work since)."""
    job_id, restart = run_of(os.environ)
    with query.client() as client:
        reply = client.checkpoint(job_id, restart)
    if not quiet:
        print(f"job {job_id} run {restart}: checkpoint at {reply.get('time')}"
              + ("" if reply.get("recorded") else " (an equal or later one was kept)"))
    return 0


def run_of(env: os._Environ[str] | dict[str, str]) -> tuple[int, int]:
    """(job id, restart) of the job this runs in, from its environment; UsageError outside a
    job."""
    raw_id, raw_restart = env.get("GQ_JOB_ID"), env.get("GQ_RESTART_COUNT", "0")
    if not raw_id:
        raise UsageError("gq checkpoint: not inside a job (GQ_JOB_ID is not set); it reports "
                         "the checkpoint of the job it runs in")
    try:
        return int(raw_id), int(raw_restart)
    except ValueError:
        raise UsageError(f"gq checkpoint: bad GQ_JOB_ID {raw_id!r} or GQ_RESTART_COUNT "
                         f"{raw_restart!r}: expected numbers") from None
