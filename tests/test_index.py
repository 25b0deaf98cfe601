"""The head's job index agrees with a scan of all its jobs, after any sequence of changes.

A `Head` (the real one, on an in-memory store) is driven through random submits, holds,
releases, passes, starts, ends, requeues, cancels, updates, node failures and re-registrations;
after every step each lookup of the index is compared with the same lookup done by scanning
`head.jobs`, as the head did before it had an index. A change the index missed shows up here.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gq import protocol
from gq.config import Config
from gq.errors import GqError
from gq.head import gate
from gq.head.auth import Caller
from gq.head.core import LAUNCH_RESEND_S, STOPPING, Head, _running_view
from gq.head.index import JobIndex
from gq.model import Job, JobSpec, JobState
from gq.store import Store

NODES = ("n0", "n1", "n2")
OWNER = Caller(uid=1000, user="ann", proven=True)
ADMIN = Caller(uid=1001, user="root-ish", proven=True, admin=True)
T0 = 1_000_000.0


def _head() -> Head:
    cfg = Config(path="")
    cfg.qos["free"].max_running_per_user = 2  # so that the limits' screen has work too
    # Time here is what the test says it is, for the head's timers too (gqd's run on the
    # monotonic clock).
    head = Head(cfg, Store(":memory:"), T0, steady=lambda now: now)
    for name in NODES:
        _register(head, name, T0, running=[])
    return head


def _register(head: Head, name: str, now: float, running: list[list[int]]) -> None:
    head.handle_node(name, {"type": protocol.REGISTER, "node": name, "cpus": 8, "mem": 1 << 34,
                            "gpus": [{"index": i, "type": "fake", "memory": 1 << 34}
                                     for i in range(2)], "running": running}, now)


def scan_check(head: Head, now: float) -> None:
    """Every lookup of `head.index` equals the scan of `head.jobs` it stands for."""
    jobs = list(head.jobs.values())
    index = head.index
    pending = [j for j in jobs if j.state == JobState.PENDING]
    assert index.ready() == [j for j in pending if not j.hold]
    assert index.placed() == [j for j in jobs if j.alloc or j.holds_alloc
                              or j.state == JobState.RUNNING]
    for node in {*NODES, *(n for j in jobs for n in j.alloc)}:
        assert index.on_node(node) == [j for j in jobs if node in j.alloc]
    live = gate.Live.count(jobs)
    assert dict(index.live().running) == dict(live.running)
    for key in {(j.spec.user, j.spec.name) for j in jobs} | {("ann", "nobody")}:
        assert index.first_live(key) == live.first(key), key
    depth = Counter((j.state.value, j.spec.qos or "normal") for j in jobs if not j.state.terminal)
    assert index.depth() == dict(depth)
    # Held jobs a pass has seen show their hold (a pass does not look at them again).
    assert index.reasons() == Counter(j.reason or "None" for j in pending)
    # Screening what the index hands a pass decides as screening every job would.
    whole = gate.screen(jobs, now, head._parent)
    part = gate.screen(index.ready(), now, head._parent, index.live())
    assert part.eligible == whole.eligible and part.invalid == whole.invalid
    assert part.waiting == [(j, r) for j, r in whole.waiting if not j.hold]
    assert part.wake_at == whole.wake_at
    # The scheduler's views of running jobs, kept from pass to pass, are as if made now.
    assert head._running_views() == tuple(
        _running_view(j, j.state != JobState.RUNNING or j.reason in STOPPING)
        for j in jobs if j.holds_alloc)
    # Every launch a tick may have to resend is in the heap at its latest send time.
    due = set(head.resends)
    for job_id, launch in head.launches.items():
        job = head.jobs[job_id]
        if job.state == JobState.RUNNING and set(job.alloc) - launch.confirmed:
            assert (launch.sent_at, job_id) in due


class HeadChanges(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.head = _head()
        self.now = T0
        self.ids: list[int] = []
        self.seq = 0
        self.passes = 0

    def _request(self, kind: str, caller: Caller = OWNER, **fields: object) -> dict | None:
        with self.head.store.tx():
            try:
                reply = self.head.handle_client({"type": kind, "rid": 1, **fields}, caller,
                                                None, self.now)
            except GqError:
                reply = None
            self._pass()
        return reply

    def _pass(self) -> None:
        """As gqd's loop does: a pass after changes (most of the time; else the next step
        sees the changes before a pass did)."""
        self.passes += 1
        if self.head.dirty and self.passes % 4:
            self.head.schedule(self.now)

    def _job(self, pick: int) -> int:
        return self.ids[pick % len(self.ids)]

    # Mostly jobs that can start soon, so that runs start, end and fail often.
    @rule(count=st.integers(1, 3), held=st.sampled_from([False] * 5 + [True]),
          name=st.sampled_from(["a", "b"]),
          gpus=st.integers(0, 2), nodes=st.integers(1, 2),
          qos=st.sampled_from(["normal", "free", "pro"]),
          array=st.sampled_from([None, "0-2", "0-3%1"]),
          dep=st.sampled_from([None] * 7 + ["singleton", "afterok", "afterany"]),
          begin=st.sampled_from([None, None, None, -5.0, 30.0]), requeue=st.booleans(),
          pick=st.integers())
    def submit(self, count: int, held: bool, name: str, gpus: int, nodes: int, qos: str,
               array: str | None, dep: str | None, begin: float | None, requeue: bool,
               pick: int) -> None:
        dependency = dep if dep in (None, "singleton") else \
            f"{dep}:{self._job(pick)}" if self.ids else None
        spec = JobSpec(script="#!/bin/sh\ntrue\n", name=name, cwd="/tmp", gpus=gpus,
                       nodes=nodes, qos=qos, hold=held, array=array, dependency=dependency,
                       begin_time=None if begin is None else self.now + begin,
                       requeue=requeue, retries=1 if requeue else None)
        reply = self._request(protocol.SUBMIT, jobs=[spec.to_dict()] * count)
        if reply is not None:
            for first in reply["ids"]:
                tasks = self.head.arrays.get(first)
                self.ids.extend(sorted(tasks.values()) if tasks else [first])

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(), admin=st.booleans())
    def hold(self, pick: int, admin: bool) -> None:
        self._request(protocol.HOLD, ADMIN if admin else OWNER, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(), admin=st.booleans())
    def release(self, pick: int, admin: bool) -> None:
        self._request(protocol.RELEASE, ADMIN if admin else OWNER, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers())
    def cancel(self, pick: int) -> None:
        self._request(protocol.CANCEL, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers())
    def requeue(self, pick: int) -> None:
        self._request(protocol.REQUEUE, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(pick=st.integers(), name=st.sampled_from([None, "a", "b", "c"]),
          qos=st.sampled_from([None, "normal", "free", "pro"]))
    def update(self, pick: int, name: str | None, qos: str | None) -> None:
        changes = {k: v for k, v in (("name", name), ("qos", qos)) if v is not None}
        if changes:
            self._request(protocol.UPDATE, ADMIN, ids=[self._job(pick)], **changes)

    @rule()
    def schedule(self) -> None:
        with self.head.store.tx():
            self.head.schedule(self.now)

    @precondition(lambda self: self.head.index.placed())
    @rule(pick=st.integers(), rank=st.integers(0, 2),
          event=st.sampled_from([protocol.STARTED, protocol.FINISHED]),
          state=st.sampled_from(["COMPLETED", "FAILED", "NODE_FAIL"]))
    def report(self, pick: int, rank: int, event: str, state: str) -> None:
        """A node reports on a run it holds (or held: a stale report is ignored); rank 2:
        all its nodes do (a run stopped for a requeue or preemption ends so)."""
        placed = self.head.index.placed()
        job = placed[pick % len(placed)]
        nodes = list(job.alloc) if rank == 2 else [list(job.alloc)[rank % len(job.alloc)]]
        with self.head.store.tx():
            for node in nodes:
                self.seq += 1
                self.head.handle_node(node, {
                    "type": protocol.REPORT, "node": node, "seq": self.seq, "job_id": job.id,
                    "restart": job.restart_count, "event": event, "state": state,
                    "exit_code": 0, "time": self.now}, self.now)
            self._pass()

    @precondition(lambda self: any(j.reason in STOPPING for j in self.head.index.placed()))
    @rule(pick=st.integers())
    def stopped(self, pick: int) -> None:
        """A run being stopped (requeue, preemption) ends on all its nodes."""
        stopping = [j for j in self.head.index.placed() if j.reason in STOPPING]
        job = stopping[pick % len(stopping)]
        self.report(self.head.index.placed().index(job), 2, protocol.FINISHED, "CANCELLED")

    @rule(seconds=st.sampled_from([1.0, 1.0, LAUNCH_RESEND_S + 1, LAUNCH_RESEND_S + 1, 40.0]))
    def tick(self, seconds: float) -> None:
        """Time passes: launches are resent, and a node not heard from for long is DOWN."""
        self.now += seconds
        with self.head.store.tx():
            for name in NODES:
                if name in self.head.registered and (seconds < 40 or name != NODES[-1]):
                    self.head.handle_node(name, {"type": protocol.HEARTBEAT, "node": name},
                                          self.now)
            self.head.tick(self.now)
            self._pass()

    @rule(node=st.sampled_from(NODES), keep=st.booleans())
    def register(self, node: str, keep: bool) -> None:
        """A node (re)registers, with the runs it still holds or (its state lost) none."""
        running = [[j.id, j.restart_count] for j in self.head.jobs.values()
                   if node in j.alloc] if keep else []
        with self.head.store.tx():
            _register(self.head, node, self.now, running)
            self._pass()

    @rule(node=st.sampled_from(NODES))
    def node_down(self, node: str) -> None:
        if node in self.head.registered:
            with self.head.store.tx():
                self.head.node_down(self.head.nodes[node], "test", self.now)
                self._pass()

    @rule()
    def reload(self) -> None:
        """gqd rebuilds memory from the store (as after a failed commit), and its nodes
        register again."""
        self.head.load(self.now)
        for node in NODES:
            self.register(node, keep=True)

    @invariant()
    def index_agrees_with_a_scan(self) -> None:
        scan_check(self.head, self.now)

    def teardown(self) -> None:
        self.head.store.close()


HeadChanges.TestCase.settings = settings(max_examples=100, stateful_step_count=50,
                                         deadline=None,
                                         suppress_health_check=[HealthCheck.too_slow])
test_index_agrees_with_a_scan = HeadChanges.TestCase


#: A change to one job: (job, field, value); a field of None adds or drops the job.
_CHANGES = st.tuples(
    st.integers(0, 11),
    st.sampled_from(["state", "hold", "name", "alloc", None]),
    st.sampled_from([JobState.PENDING, JobState.RUNNING, JobState.COMPLETED, "", "user",
                     "admin", "a", "b", {}, {"n0": [0]}, {"n0": [1], "n1": [0]}]))


@settings(max_examples=60, deadline=None)
@given(st.lists(_CHANGES, min_size=100, max_size=400))
def test_index_follows_any_change_of_its_jobs(changes: list) -> None:
    """The index alone, its jobs changed at random (long runs, so that the heaps of live ids
    per name are rebuilt too), against a scan after every change."""
    index = JobIndex()
    jobs: dict[int, Job] = {}
    all_jobs = {i: Job(id=i + 1, spec=JobSpec(script="", user="ann", name="a",
                                              array="0-3" if i % 3 else None),
                       array_job_id=1 if i % 3 else None) for i in range(12)}
    for i, field, value in changes:
        job = all_jobs[i]
        if field is None:
            if job.id in jobs:
                del jobs[job.id]
                index.drop(job)
            else:
                jobs[job.id] = job
                index.add(job)
            continue
        if field == "state" and isinstance(value, JobState):
            job.state = value
        elif field == "hold" and value in ("", "user", "admin"):
            job.hold = value
        elif field == "name" and value in ("a", "b"):
            job.spec = dataclasses.replace(job.spec, name=value)
        elif field == "alloc" and isinstance(value, dict):
            job.alloc, job.holds_alloc = value, bool(value)
        index.update(job)
        live = gate.Live.count(jobs.values())
        assert index.first_live(("ann", "a")) == live.first(("ann", "a"))
        assert index.first_live(("ann", "b")) == live.first(("ann", "b"))
        assert dict(index.live().running) == dict(live.running)
        assert index.on_node("n0") == [j for j in jobs.values() if "n0" in j.alloc]
    assert index.ready() == [j for j in jobs.values() if j.state == JobState.PENDING
                             and not j.hold]


def test_a_launch_is_resent_when_due_and_not_once_confirmed() -> None:
    head = _head()
    with head.store.tx():
        head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [
            JobSpec(script="#!/bin/sh\ntrue\n", cwd="/tmp", gpus=1).to_dict()]}, OWNER, None, T0)
        head.schedule(T0)
    (job,) = head.jobs.values()
    node = next(iter(job.alloc))
    launches = [m for n, m in head.outbox_nodes if b"launch" in m]
    assert len(launches) == 1
    head.outbox_nodes.clear()

    def resent(now: float) -> bool:
        head.tick(now)
        sent = any(protocol.decode(m, protocol.HEAD_TO_NODE)["type"] == protocol.LAUNCH
                   for _, m in head.outbox_nodes)
        head.outbox_nodes.clear()
        return sent

    assert not resent(T0 + LAUNCH_RESEND_S / 2)
    assert resent(T0 + LAUNCH_RESEND_S + 1)
    assert not resent(T0 + LAUNCH_RESEND_S + 2)  # sent again just now
    assert resent(T0 + 2 * LAUNCH_RESEND_S + 2)
    with head.store.tx():
        head.handle_node(node, {"type": protocol.REPORT, "node": node, "seq": 1,
                                "job_id": job.id, "restart": 0, "event": protocol.STARTED,
                                "time": T0}, T0)
    head.outbox_nodes.clear()
    assert not resent(T0 + 10 * LAUNCH_RESEND_S)
    assert not head.resends  # a confirmed launch is not looked at again


def test_a_held_job_is_screened_once_per_hold() -> None:
    head = _head()
    with head.store.tx():
        head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [
            JobSpec(script="#!/bin/sh\ntrue\n", cwd="/tmp", hold=True).to_dict()]}, OWNER,
            None, T0)
        head.schedule(T0)
    (job,) = head.jobs.values()
    assert job.reason == head.store.get_job(job.id).reason == "JobHeldUser"
    assert head.index.take_fresh() == []  # the pass saw it: the next ones skip it
    with head.store.tx():
        head.handle_client({"type": protocol.RELEASE, "rid": 2, "ids": [job.id]}, OWNER, None,
                           T0)
        assert head.index.ready() == [job]
        head.handle_client({"type": protocol.HOLD, "rid": 3, "ids": [job.id]}, ADMIN, None, T0)
    assert head.index.ready() == [] and head.index.take_fresh() == [job]
    assert job.reason == "JobHeldAdmin"
