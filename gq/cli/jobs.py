"""`gq queue`, `show`, `cancel`, `wait`, `logs`: looking at jobs and acting on them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from gq.cli import render
from gq.cli.submit import exit_code_of
from gq.errors import RefusedError, UsageError

_STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
           "PREEMPTED")
_SHORT = {"PD": "PENDING", "R": "RUNNING", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
          "TO": "TIMEOUT", "NF": "NODE_FAIL", "PR": "PREEMPTED"}
#: How often `gq logs --follow` looks for new output, in seconds.
FOLLOW_POLL_S = 0.25


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)
    app.command("q", hidden=True)(queue)
    app.command("show")(show)
    app.command("cancel")(cancel)
    app.command("wait")(wait)
    app.command("logs")(logs)


def _client():  # noqa: ANN202 - lazy import keeps `gq --help` fast
    from gq.client import Client
    return Client()


def _job_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"bad job id {text!r}: expected a number") from None
    if value <= 0:
        raise UsageError(f"bad job id {text!r}: expected a positive number")
    return value


def _states(text: Optional[str]) -> Optional[list[str]]:
    if not text:
        return None
    out = []
    for item in text.upper().split(","):
        state = _SHORT.get(item, item)
        if state not in _STATES:
            raise UsageError(f"bad state {item!r}: expected one of {', '.join(_STATES)} "
                             "(or PD, R, CD, F, CA, TO, NF, PR)")
        out.append(state)
    return out


def queue(
    me: bool = typer.Option(False, "--me", help="only my jobs"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only this user's jobs"),
    state: Optional[str] = typer.Option(None, "-t", "--state", help="only these states (comma list)"),
    all_jobs: bool = typer.Option(False, "-a", "--all", help="include jobs that ended in the last 5 minutes"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
) -> int:
    """List pending and running jobs (like squeue)."""
    with _client() as client:
        who = client._user if me else user
        jobs = client.queue(user=who, states=_states(state), all=all_jobs)
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "jobs": jobs})
    else:
        render.table(*render.queue_rows(jobs))
    return 0


def show(job: str = typer.Argument(..., help="job id"),
         as_json: bool = typer.Option(False, "--json", help="print a JSON document")) -> int:
    """Show everything about one job (like scontrol show job)."""
    with _client() as client:
        data = client.show(_job_id(job))
    if as_json:
        render.emit_json(data)
    else:
        render.show_job(data)
    return 0


def cancel(jobs: list[str] = typer.Argument(..., help="job ids")) -> int:
    """Cancel jobs (like scancel): pending ones never start, running ones get SIGTERM then SIGKILL."""
    ids = [_job_id(j) for j in jobs]
    with _client() as client:
        result = client.cancel(ids)
    for job_id, why in result["errors"].items():
        render.message(f"cannot cancel job {job_id}: {why}")
    if result["errors"]:
        raise RefusedError(f"{len(result['errors'])} of {len(ids)} job(s) not cancelled")
    return 0


def wait(jobs: list[str] = typer.Argument(..., help="job ids"),
         as_json: bool = typer.Option(False, "--json", help="print the final records as JSON")) -> int:
    """Block until the jobs end; exit with the first failure's exit code, else 0."""
    ids = [_job_id(j) for j in jobs]
    with _client() as client:
        done = client.wait(ids)
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "jobs": done})
    codes = [exit_code_of(j) for j in done]
    return next((c for c in codes if c != 0), 0)


def logs(job: str = typer.Argument(..., help="job id"),
         follow: bool = typer.Option(False, "-f", "--follow", help="keep printing until the job ends"),
         err: bool = typer.Option(False, "--err", help="the job's stderr file instead of stdout")) -> int:
    """Print a job's output file."""
    job_id = _job_id(job)
    with _client() as client:
        data = client.show(job_id)
        path = Path(data["stderr" if err else "stdout"])
        offset = _copy(path, 0)
        while follow and data["state"] in ("PENDING", "RUNNING"):
            time.sleep(FOLLOW_POLL_S)
            offset = _copy(path, offset)
            data = client.show(job_id)
        if follow:
            _copy(path, offset)
        elif not path.exists() and data["state"] != "PENDING":
            raise UsageError(f"job {job_id}'s output file {path} does not exist (yet)")
    return 0


def _copy(path: Path, offset: int) -> int:
    """Write what `path` has past `offset` to stdout; the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    sys.stdout.buffer.write(chunk)
    sys.stdout.flush()
    return offset + len(chunk)
