"""gqd's pass as users see it: a pending job's priority is the one it has when shown, and the
jobs a pass leaves out (behind the ones it looked at) still get a truthful reason.

A `Head` on an in-memory store, driven by its request and node handlers with a chosen clock.
"""

from __future__ import annotations

from gq import protocol
from gq.config import Config
from gq.head.auth import Caller
from gq.head.core import Head
from gq.head.views import pending_view as _pending_view
from gq.messages import read as read_message
from gq.sched.priority import priority
from gq.store import Store
from tests import headkit

OWNER = Caller(uid=1000, user="ann", proven=True)
T0 = 1_000_000.0


def _register(head: Head, gpus: int, now: float) -> None:
    running = [[j.id, j.restart_count] for j in head.index.placed()]
    with head.store.tx():
        head.handle_node("n0", read_message({"type": protocol.REGISTER, "node": "n0", "cpus": 8,
                                "mem": 1 << 34, "running": running,
                                "gpus": [{"index": i, "type": "fake", "memory": 1 << 34}
                                         for i in range(gpus)]}), now)


def _head() -> Head:
    head = Head(Config(path=""), Store(":memory:"), T0)
    _register(head, 2, T0)
    return head


def _submit(head: Head, now: float, gpus: int, qos: str = "normal", limit: int = 3600) -> int:
    return headkit.submit(head, now, OWNER, gpus=gpus, qos=qos, time_limit_s=limit)


_pass = headkit.schedule


def _queue(head: Head, now: float) -> dict[int, dict]:
    reply = head.handle_client({"type": protocol.QUEUE, "rid": 1}, OWNER, None, now)
    return {j["id"]: j for j in reply["jobs"]}


def test_a_pending_jobs_priority_is_the_one_it_has_when_shown() -> None:
    head = _head()
    running = _submit(head, T0, 2)
    waiting = _submit(head, T0, 2)
    _pass(head, T0)
    later = T0 + 7200  # its wait raised its response ratio since the pass
    want = priority(_pending_view(head.jobs[waiting]), later, head.policy)
    assert want != priority(_pending_view(head.jobs[waiting]), T0, head.policy)
    shown = _queue(head, later)
    assert shown[waiting]["priority"] == want
    one = head.handle_client({"type": protocol.SHOW, "rid": 1, "id": waiting}, OWNER, None, later)
    assert one["job"]["priority"] == want == sum(one["job"]["priority_factors"].values())
    # A running job shows the priority it started with.
    assert shown[running]["priority"] == priority(_pending_view(head.jobs[running]), T0,
                                                  head.policy)


def test_jobs_behind_the_ones_a_pass_looks_at_get_their_reason() -> None:
    head = _head()
    _submit(head, T0, 2)
    first = _submit(head, T0, 2)
    behind = [_submit(head, T0, 1) for _ in range(3)]
    _pass(head, T0)
    assert head.jobs[first].reason == "Resources"
    assert {head.jobs[j].reason for j in behind} == {"Priority"}
    # A higher QOS job goes first: the one that was first now waits behind it.
    pro = _submit(head, T0 + 1, 2, qos="pro")
    _pass(head, T0 + 1)
    assert head.jobs[pro].reason == "Resources" and head.jobs[first].reason == "Priority"
    # The node comes back with one GPU: 2-GPU jobs can never run there, the others wait.
    _register(head, 1, T0 + 2)
    _pass(head, T0 + 2)
    reasons = {j["id"]: j["reason"] for j in _queue(head, T0 + 2).values()
               if j["state"] == "PENDING"}
    assert reasons[first] == reasons[pro] == "ReqNodeNotAvail"
    assert {reasons[j] for j in behind} <= {"Resources", "Priority"}
    assert list(reasons.values()).count("Resources") <= 1
