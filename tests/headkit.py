"""An in-memory `Head` driven as gqd drives it: a submit in a transaction, a pass in one (for
the unit tests of gqd's own code, which take no sockets)."""

from __future__ import annotations

from typing import Any

from gq import protocol
from gq.head.auth import Caller
from gq.head.core import Head
from gq.model import JobSpec

#: The submitting user of these tests.
OWNER = Caller(uid=1000, user="ann", proven=True)


def submit(head: Head, now: float, caller: Caller = OWNER, **fields: Any) -> int:
    """One job of `fields` (a trivial script in /tmp unless given) submitted at `now`: its id."""
    spec = JobSpec(**{"script": "#!/bin/sh\ntrue\n", "cwd": "/tmp", **fields})
    with head.store.tx():
        reply = head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [spec.to_dict()]},
                                   caller, None, now)
    return reply["ids"][0]


def schedule(head: Head, now: float) -> None:
    """One pass at `now`, in its own transaction as gqd runs it."""
    with head.store.tx():
        head.schedule(now)
