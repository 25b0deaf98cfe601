"""`gq queue` and `gq show` from their option values, and what other commands share: the
client, state names.

Free of typer, so that the fast path (gq/cli/fast.py) runs the very same code as the typer
command (gq/cli/jobs.py).
"""

from __future__ import annotations


from gq import gcpause
from gq.cli import render
from gq.errors import UsageError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
          "PREEMPTED", "OUT_OF_MEMORY")
SHORT = {"PD": "PENDING", "R": "RUNNING", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
         "TO": "TIMEOUT", "NF": "NODE_FAIL", "PR": "PREEMPTED", "OOM": "OUT_OF_MEMORY"}


def client() -> Any:
    from gq.client import Client  # lazily: `gq --help` needs no zmq
    return Client()


def states(text: str | None) -> list[str] | None:
    """`--state`'s comma list (names or short forms, any case) as state names."""
    if not text:
        return None
    out = []
    for item in text.upper().split(","):
        state = SHORT.get(item, item)
        if state not in STATES:
            raise UsageError(f"bad state {item!r}: expected one of {', '.join(STATES)} "
                             "(or PD, R, CD, F, CA, TO, NF, PR, OOM)")
        out.append(state)
    return out


def queue(me: bool, user: str | None, state: str | None, all_jobs: bool, as_json: bool,
          parsable: bool, start: bool, jobs: str | None = None, fmt: str | None = None) -> int:
    """List pending and running jobs (like squeue); `jobs`: only these (comma-separated ids,
    an array's for all its tasks); `fmt`: squeue's -o format instead of the table."""
    wanted = states(state)
    if start:
        if wanted and "PENDING" not in wanted:
            raise UsageError("--start lists pending jobs only: leave out --state or include PD")
        wanted = ["PENDING"]
    refs = job_refs(jobs)
    fields = None if as_json or fmt else render.START_FIELDS if start else render.QUEUE_FIELDS
    with gcpause.paused():  # records and rows by the thousand: see gq.gcpause
        with client() as c:
            who = c._user if me else user
            # gqd's kept texts, joined as they are (-j filters records here; --start, and -o
            # which asks for its fields, add fields to them).
            if as_json and not refs and not start and not fmt:
                render.emit_jobs_json(c.queue_texts(user=who, states=wanted, all=all_jobs))
                return 0
            found = c.queue(user=who, states=wanted, all=all_jobs or bool(refs),
                            start=start or bool(fmt), fields=fields)
        if refs:
            found = [j for j in found if j["id"] in refs or j.get("array_job_id") in refs
                     or j.get("job_id") in refs]
        if as_json:
            render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "jobs": found})
        elif fmt:
            from gq.slurm import squeue
            squeue.print_format(fmt, found, header=True, prog="gq queue")
        else:
            render.listing(*(render.start_rows if start else render.queue_rows)(found), parsable)
    return 0


def job_refs(text: str | None) -> list[int | str]:
    """`-j`'s comma-separated job ids (`12`, `12_3`)."""
    from gq.arrays import parse_ref
    return [parse_ref(item) for item in (text or "").split(",") if item.strip()]


def show(job: str, as_json: bool, parsable: bool) -> int:
    """Show everything about one job (like scontrol show job)."""
    from gq.arrays import parse_ref
    with client() as c:
        data = c.show(parse_ref(job))
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, **data})
    elif parsable:
        render.parsable(["Field", "Value"], render.job_fields(data))
    else:
        render.show_job(data)
    return 0
