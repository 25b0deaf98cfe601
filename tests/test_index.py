"""The head's job index agrees with a scan of all its jobs, after any sequence of changes.

A `Head` (the real one, on an in-memory store) is driven through random submits, holds,
releases, passes, starts, ends, requeues, cancels, updates, node failures and re-registrations;
after every step each lookup of the index is compared with the same lookup done by scanning
`head.jobs`, as the head did before it had an index. A change the index missed shows up here.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gq import protocol
from gq.config import Config
from gq.errors import GqError, StoreError
from gq.head import gate
from gq.head.auth import Caller
from gq.head.core import Head
from gq.head.launches import LAUNCH_RESEND_S
from gq.head.reasons import STOPPING
from gq.head.views import running_view as _running_view
from gq.head.index import JobIndex
from gq.messages import Launch
from gq.messages import read as read_message
from gq.model import Job, JobSpec, JobState
from gq.store import Store
from tests.headmemory import memory, store_rows

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
    head.handle_node(name, read_message({
        "type": protocol.REGISTER, "node": name, "cpus": 8, "mem": 1 << 34,
        "gpus": [{"index": i, "type": "fake", "memory": 1 << 34} for i in range(2)],
        "running": running}), now)


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
    whole = gate.screen(jobs, now, head.table.parent)
    part = gate.screen(index.ready(), now, head.table.parent, index.live())
    assert part.eligible == whole.eligible and part.invalid == whole.invalid
    assert part.waiting == [(j, r) for j, r in whole.waiting if not j.hold]
    assert part.wake_at == whole.wake_at
    # The scheduler's views of running jobs, kept from pass to pass, are as if made now.
    assert head.table.running_views() == tuple(
        _running_view(j, j.state != JobState.RUNNING or j.reason in STOPPING)
        for j in jobs if j.holds_alloc)
    # Every launch a tick may have to resend is in the heap at its latest send time.
    due = set(head.table.launches.resends)
    for job_id, launch in head.table.launches.items():
        job = head.jobs[job_id]
        if job.state == JobState.RUNNING and set(job.alloc) - launch.confirmed:
            assert (launch.sent_at, job_id) in due


#: Each rule's arguments, drawn also by a failing turn for the rules it runs.
SUBMIT = dict(count=st.integers(1, 3), held=st.sampled_from([False] * 5 + [True]),
              name=st.sampled_from(["a", "b"]), gpus=st.integers(0, 2), nodes=st.integers(1, 2),
              qos=st.sampled_from(["normal", "free", "pro"]),
              array=st.sampled_from([None, "0-2", "0-3%1"]),
              dep=st.sampled_from([None] * 7 + ["singleton", "afterok", "afterany"]),
              begin=st.sampled_from([None, None, None, -5.0, 30.0]), requeue=st.booleans(),
              pick=st.integers())
PICK = dict(pick=st.integers())
PICK_ADMIN = dict(pick=st.integers(), admin=st.booleans())
UPDATE = dict(pick=st.integers(), name=st.sampled_from([None, "a", "b", "c"]),
              qos=st.sampled_from([None, "normal", "free", "pro"]))
REPORT = dict(pick=st.integers(), rank=st.integers(0, 2),
              event=st.sampled_from([protocol.STARTED, protocol.FINISHED]),
              state=st.sampled_from(["COMPLETED", "FAILED", "NODE_FAIL"]))
TICK = dict(seconds=st.sampled_from([1.0, 1.0, LAUNCH_RESEND_S + 1, LAUNCH_RESEND_S + 1, 40.0]))
REGISTER = dict(node=st.sampled_from(NODES), keep=st.booleans())
NODE = dict(node=st.sampled_from(NODES))


class HeadChanges(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.head = _head()
        self.now = T0
        self.ids: list[int] = []
        self.seq = 0
        self.passes = 0
        #: A failing turn is open: rules run inside it.
        self.failing = False

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """One loop turn of gqd: a transaction, then a pass after changes (most of the time;
        else the next step sees the changes before a pass did)."""
        if self.failing:
            yield
        else:
            with self.head.tx():
                yield
            self.head.take_orders()
        self.passes += 1
        if self.head.dirty and self.passes % 4:
            with self.head.tx() if not self.failing else contextlib.nullcontext():
                self.head.schedule(self.now)

    def _request(self, kind: str, caller: Caller = OWNER, **fields: object) -> dict | None:
        with self._turn():
            try:
                return self.head.handle_client({"type": kind, "rid": 1, **fields}, caller,
                                               None, self.now)
            except GqError:
                return None

    def _job(self, pick: int) -> int:
        return self.ids[pick % len(self.ids)]

    # Mostly jobs that can start soon, so that runs start, end and fail often.
    @rule(**SUBMIT)
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
                tasks = self.head.table.arrays.get(first)
                self.ids.extend(sorted(tasks.values()) if tasks else [first])

    @precondition(lambda self: self.ids)
    @rule(**PICK_ADMIN)
    def hold(self, pick: int, admin: bool) -> None:
        self._request(protocol.HOLD, ADMIN if admin else OWNER, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(**PICK_ADMIN)
    def release(self, pick: int, admin: bool) -> None:
        self._request(protocol.RELEASE, ADMIN if admin else OWNER, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(**PICK)
    def cancel(self, pick: int) -> None:
        self._request(protocol.CANCEL, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(**PICK)
    def requeue(self, pick: int) -> None:
        self._request(protocol.REQUEUE, ids=[self._job(pick)])

    @precondition(lambda self: self.ids)
    @rule(**UPDATE)
    def update(self, pick: int, name: str | None, qos: str | None) -> None:
        changes = {k: v for k, v in (("name", name), ("qos", qos)) if v is not None}
        if changes:
            self._request(protocol.UPDATE, ADMIN, ids=[self._job(pick)], **changes)

    @rule()
    def schedule(self) -> None:
        with self.head.tx() if not self.failing else contextlib.nullcontext():
            self.head.schedule(self.now)

    @precondition(lambda self: self.head.index.placed())
    @rule(**REPORT)
    def report(self, pick: int, rank: int, event: str, state: str) -> None:
        """A node reports on a run it holds (or held: a stale report is ignored); rank 2:
        all its nodes do (a run stopped for a requeue or preemption ends so)."""
        placed = self.head.index.placed()
        job = placed[pick % len(placed)]
        nodes = list(job.alloc) if rank == 2 else [list(job.alloc)[rank % len(job.alloc)]]
        with self._turn():
            for node in nodes:
                self.seq += 1
                self.head.handle_node(node, read_message({
                    "type": protocol.REPORT, "node": node, "seq": self.seq, "job_id": job.id,
                    "restart": job.restart_count, "event": event, "state": state,
                    "exit_code": 0, "time": self.now}), self.now)

    @precondition(lambda self: any(j.reason in STOPPING for j in self.head.index.placed()))
    @rule(**PICK)
    def stopped(self, pick: int) -> None:
        """A run being stopped (requeue, preemption) ends on all its nodes."""
        stopping = [j for j in self.head.index.placed() if j.reason in STOPPING]
        job = stopping[pick % len(stopping)]
        self.report(self.head.index.placed().index(job), 2, protocol.FINISHED, "CANCELLED")

    @rule(**TICK)
    def tick(self, seconds: float) -> None:
        """Time passes: launches are resent, and a node not heard from for long is DOWN."""
        self.now += seconds
        with self._turn():
            for name in NODES:
                if name in self.head.registry.registered and (seconds < 40 or name != NODES[-1]):
                    self.head.handle_node(
                        name, read_message({"type": protocol.HEARTBEAT, "node": name}), self.now)
            self.head.tick(self.now)

    @rule(**REGISTER)
    def register(self, node: str, keep: bool) -> None:
        """A node (re)registers, with the runs it still holds or (its state lost) none."""
        running = [[j.id, j.restart_count] for j in self.head.jobs.values()
                   if node in j.alloc] if keep else []
        with self._turn():
            _register(self.head, node, self.now, running)

    @rule(**NODE)
    def node_down(self, node: str) -> None:
        if node in self.head.registry.registered:
            with self._turn():
                self.head.registry.node_down(self.head.nodes[node], "test", self.now)

    @rule()
    def restart(self) -> None:
        """gqd starts again on the same store (memory built from it), and its nodes register
        again."""
        self.head = Head(self.head.cfg, self.head.store, self.now, steady=lambda now: now)
        for node in NODES:
            self.register(node, keep=True)

    @rule(data=st.data())
    def failed_turn(self, data: st.DataObject) -> None:
        """A turn whose commit fails (a full disk) after a few of the other rules' changes:
        memory is as it was before the turn, as the store is, with no reload."""
        rules = {"submit": SUBMIT, "hold": PICK_ADMIN, "release": PICK_ADMIN, "cancel": PICK,
                 "requeue": PICK, "update": UPDATE, "schedule": {}, "report": REPORT,
                 "stopped": PICK, "tick": TICK, "register": REGISTER, "node_down": NODE}
        before, stored, ids = memory(self.head), store_rows(self.head), list(self.ids)
        self.failing = True
        try:
            with self.head.tx():
                for _ in range(data.draw(st.integers(1, 4))):
                    name = data.draw(st.sampled_from(sorted(rules)))
                    if name in ("hold", "release", "cancel", "requeue", "update") \
                            and not self.ids or name == "report" and not self.head.index.placed() \
                            or name == "stopped" and not any(
                                j.reason in STOPPING for j in self.head.index.placed()):
                        continue
                    getattr(self, name)(**{k: data.draw(v) for k, v in rules[name].items()})
                raise StoreError("disk full (test)")
        except StoreError as exc:
            self.head.submits.aborted(exc)
        finally:
            self.failing = False
        self.ids = ids
        assert store_rows(self.head) == stored
        assert memory(self.head) == before

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
    launches = [o for o in head.take_orders() if isinstance(o.msg, Launch)]
    assert len(launches) == 1 and launches[0].node == node

    def resent(now: float) -> bool:
        head.tick(now)
        return any(protocol.decode(o.encode(), protocol.HEAD_TO_NODE)["type"] == protocol.LAUNCH
                   for o in head.take_orders())

    assert not resent(T0 + LAUNCH_RESEND_S / 2)
    assert resent(T0 + LAUNCH_RESEND_S + 1)
    assert not resent(T0 + LAUNCH_RESEND_S + 2)  # sent again just now
    assert resent(T0 + 2 * LAUNCH_RESEND_S + 2)
    with head.store.tx():
        head.handle_node(node, read_message({"type": protocol.REPORT, "node": node, "seq": 1,
                                "job_id": job.id, "restart": 0, "event": protocol.STARTED,
                                "time": T0}), T0)
    head.take_orders()
    assert not resent(T0 + 10 * LAUNCH_RESEND_S)
    assert not head.table.launches.resends  # a confirmed launch is not looked at again


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
