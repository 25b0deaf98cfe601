"""Which live jobs a filtered request names (`gq cancel -u/-t/-n/-p`, scancel's filters): the
filter's fields all hold. Pure."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gq.errors import ProtocolError
from gq.head.auth import Caller
from gq.model import Job

#: Filter key -> whether its value is a list of strings (else one string).
KEYS = {"user": False, "states": True, "name": False, "partition": False, "account": False,
        "qos": False, "nodes": True}


def check(flt: Any) -> dict[str, Any]:
    """A filter as a request carries it, or ProtocolError."""
    if not isinstance(flt, dict) or set(flt) - set(KEYS):
        raise ProtocolError(f"filter: expected a map of {', '.join(KEYS)}")
    for key, value in flt.items():
        ok = value is None or (isinstance(value, list) and all(isinstance(v, str) for v in value)
                               if KEYS[key] else isinstance(value, str))
        if not ok:
            raise ProtocolError(f"filter: {key} has the wrong type")
    return flt


def matching(jobs: Iterable[Job], flt: dict[str, Any], caller: Caller,
             refs: list[Any] | None = None) -> list[int | str]:
    """The references (as requests name jobs) of the live jobs the filter names: only the caller's own unless it names
    a user or the caller is an admin; with `refs`, only among those jobs (or arrays)."""
    user = flt.get("user") or (None if caller.admin else caller.user)
    states = set(flt.get("states") or ())
    nodes = set(flt.get("nodes") or ())
    wanted = None if not refs else {str(r) for r in refs}
    out: list[int | str] = []
    for job in jobs:
        s = job.spec
        if job.state.terminal or (user and s.user != user) \
                or (states and job.state.value not in states) \
                or (flt.get("name") and s.name != flt["name"]) \
                or (flt.get("partition") and flt["partition"] not in (s.partition or "").split(","))\
                or (flt.get("account") and s.account != flt["account"]) \
                or (flt.get("qos") and s.qos != flt["qos"]) \
                or (nodes and not nodes & set(job.alloc)):
            continue
        if wanted is not None and not {job.ref, str(job.id), str(job.array_job_id)} & wanted:
            continue
        out.append(job.id if job.array_job_id is None else job.ref)
    return out
