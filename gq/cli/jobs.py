"""`gq queue`, `show`, `cancel`, `wait`, `logs`: looking at jobs and acting on them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from gq.arrays import parse_ref
from gq.cli import query, render
from gq.cli.submission import exit_code_of
from gq.errors import RefusedError, UsageError
from gq.model import parse_duration, parse_signal

#: How often `gq logs --follow` looks for new output, in seconds.
FOLLOW_POLL_S = 0.25


def register(app: typer.Typer) -> None:
    app.command("queue")(queue)
    app.command("q", hidden=True)(queue)
    app.command("show")(show)
    app.command("cancel")(cancel)
    app.command("hold")(hold)
    app.command("release")(release)
    app.command("requeue")(requeue)
    app.command("update")(update)
    app.command("wait")(wait)
    app.command("logs")(logs)


def queue(
    me: bool = typer.Option(False, "--me", help="only my jobs"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only this user's jobs"),
    state: Optional[str] = typer.Option(None, "-t", "--state", help="only these states (comma list)"),
    all_jobs: bool = typer.Option(False, "-a", "--all", help="include jobs that ended in the last 5 minutes"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
    parsable: bool = typer.Option(False, "-p", "--parsable", help="'|' between fields, a header line first"),
    start: bool = typer.Option(False, "--start", help="pending jobs with their expected start time and nodes"),
    jobs: Optional[str] = typer.Option(None, "-j", "--jobs", help="only these jobs (comma list; an array's id: its tasks)"),
    fmt: Optional[str] = typer.Option(None, "-o", "--format", help="squeue's -o format, e.g. '%i %T %R'"),
) -> int:
    """List pending and running jobs (like squeue)."""
    return query.queue(me, user, state, all_jobs, as_json, parsable, start, jobs, fmt)


def show(job: str = typer.Argument(..., help="job id"),
         as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
         parsable: bool = typer.Option(False, "-p", "--parsable",
                                       help="one 'Field|Value' line per field, a header first")
         ) -> int:
    """Show everything about one job (like scontrol show job)."""
    return query.show(job, as_json, parsable)


def cancel(jobs: Optional[list[str]] = typer.Argument(None, help="job ids (an array's id: all its tasks; 123_7: one)"),
           signal: Optional[str] = typer.Option(None, "-s", "--signal", help="only send this signal (USR1, TERM, 10 ...) to the running jobs; they go on"),
           batch: bool = typer.Option(False, "-b", "--batch", help="with --signal: to the job's script only, not its whole process group"),
           user: Optional[str] = typer.Option(None, "-u", "--user", help="the live jobs of this user"),
           state: Optional[str] = typer.Option(None, "-t", "--state", help="... in these states (comma list, PD, R)"),
           name: Optional[str] = typer.Option(None, "-n", "--name", help="... of this name"),
           partition: Optional[str] = typer.Option(None, "-p", "--partition", help="... in this partition"),
           ) -> int:
    """Cancel jobs (like scancel): pending ones never start, running ones get SIGTERM then SIGKILL.
    With -u, -t, -n or -p: the live jobs matching all of them (yours only unless -u names a
    user), among the ids given if any."""
    flt = {k: v for k, v in (("user", user), ("name", name), ("partition", partition),
                             ("states", query.states(state))) if v}
    if not jobs and not flt:
        raise UsageError("nothing to cancel: give job ids, or -u, -t, -n or -p")
    if signal is None:
        if batch:
            raise UsageError("--batch needs --signal: it says which process gets the signal")
        return _act(jobs or [], "cancel", "cancelled",
                    lambda c, ids: c.cancel(ids, filter=flt or None), bool(flt))
    sig = parse_signal(signal)  # a bad name is a usage error here, before any request
    return _act(jobs or [], "signal", "signalled",
                lambda c, ids: c.cancel(ids, signal=sig.name, batch_only=batch or sig.batch_only,
                                        filter=flt or None), bool(flt))


def update(jobs: list[str] = typer.Argument(..., help="job ids (an array's id: all its pending tasks)"),
           time: Optional[str] = typer.Option(None, "-t", "--time", help="new time limit (owners may only lower it; UNLIMITED for none)"),
           qos: Optional[str] = typer.Option(None, "-q", "--qos", help="new QOS (owners: one of no higher priority)"),
           name: Optional[str] = typer.Option(None, "-J", "--name", help="new job name (running jobs too)"),
           ) -> int:
    """Change pending jobs' time limit, QOS or name (like scontrol update); admins may raise limits."""
    if time is None and qos is None and name is None:
        raise UsageError("nothing to update: give --time, --qos or --name")
    limit = None if time is None else 0 if time.strip().upper() in ("UNLIMITED", "INFINITE") \
        else parse_duration(time)
    return _act(jobs, "update", "updated",
                lambda c, ids: c.update(ids, time_limit_s=limit, qos=qos, name=name))


def hold(jobs: list[str] = typer.Argument(..., help="job ids (an array's id: all its pending tasks)")) -> int:
    """Keep pending jobs from starting until they are released (like scontrol hold)."""
    return _act(jobs, "hold", "held", lambda c, ids: c.hold(ids))


def release(jobs: list[str] = typer.Argument(..., help="job ids (an array's id: all its held tasks)")) -> int:
    """Let held jobs be scheduled again (like scontrol release)."""
    return _act(jobs, "release", "released", lambda c, ids: c.release(ids))


def requeue(jobs: list[str] = typer.Argument(..., help="job ids (an array's id: all its tasks)")) -> int:
    """Stop running jobs and queue them again as their next run (like scontrol requeue)."""
    return _act(jobs, "requeue", "requeued", lambda c, ids: c.requeue(ids))


def _act(jobs: list[str], verb: str, past: str, call: Any, filtered: bool = False) -> int:
    """Send one request for all the jobs; name each refused one and its reason on stderr.
    `filtered`: the request names jobs by filters too, and says how many it matched."""
    ids = [parse_ref(j) for j in jobs]
    with query.client() as client:
        result = call(client, ids)
    for job_id, why in result["errors"].items():
        render.message(f"cannot {verb} job {job_id}: {why}")
    tried = len(result.get("cancelled", [])) + len(result["errors"]) if filtered else len(ids)
    if result["errors"]:
        raise RefusedError(f"{len(result['errors'])} of {tried} job(s) not {past}")
    if filtered:
        render.message(f"{past} {tried} job(s)" if tried else "no live job matches")
    return 0


def wait(jobs: list[str] = typer.Argument(..., help="job ids"),
         as_json: bool = typer.Option(False, "--json", help="print the final records as JSON")) -> int:
    """Block until the jobs end; exit with the first failure's exit code, else 0."""
    ids = [parse_ref(j) for j in jobs]
    with query.client() as client:
        done = client.wait(ids)
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "jobs": done})
    codes = [exit_code_of(j) for j in done]
    return next((c for c in codes if c != 0), 0)


def logs(job: str = typer.Argument(..., help="job id"),
         follow: bool = typer.Option(False, "-f", "--follow", help="keep printing until the job ends"),
         err: bool = typer.Option(False, "--err", help="the job's stderr file instead of stdout")) -> int:
    """Print a job's output file."""
    job_id = parse_ref(job)
    with query.client() as client:
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
