"""The running jobs' bookings kept by the caller (gq/sched/held.py's HeldIndex, Snapshot.held):
a pass that borrows them decides exactly as one that rebuilds them from the running jobs."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gq.model import Gpu
from gq.sched import NodeView, PendingJob, Policy, RunningJob, Snapshot, plan
from gq.sched.held import HeldIndex
from gq.sched.profile import Profile
from gq.sched.queue import QueueIndex

NOW = 1_000_000.0
GIB = 1 << 30
NAMES = ("n1", "n2", "n3")
GPUS = tuple(Gpu(index=i, type="h100", memory=80 * GIB) for i in range(4))
POLICY = Policy(qos_priority={"normal": 10, "pro": 100, "free": 1}, reserve_depth=2,
                preempts={"pro": ("free",)}, preempt_exempt_s=600)


@st.composite
def runs(draw: st.DrawFn, now: float = NOW) -> list[RunningJob]:
    """Running jobs on NAMES' 4 GPUs each: exclusive or sharing, limited or not, some overdue
    or being stopped (which the index cannot stand for: the pass then rebuilds)."""
    taken: dict[str, set[int]] = {n: set() for n in NAMES}
    shared: dict[str, set[int]] = {n: set() for n in NAMES}
    out = []
    for rid in range(draw(st.integers(0, 10))):
        name = draw(st.sampled_from(NAMES))
        share = draw(st.booleans())
        free = sorted(set(range(4)) - taken[name] | (shared[name] if share else set()))
        if not free:
            continue
        chosen = tuple(sorted(draw(st.sets(st.sampled_from(free), min_size=1,
                                           max_size=min(2, len(free))))))
        if draw(st.integers(0, 9)) == 0:
            chosen = ()  # a CPU-only job: on the node, holding none of its GPUs
        (shared if share else taken)[name].update(chosen)
        taken[name].update(chosen)
        out.append(RunningJob(
            id=1000 + rid, qos=draw(st.sampled_from(["normal", "free"])), alloc={name: chosen},
            start_time=now - draw(st.sampled_from([0, 1, 500, 9000])),
            time_limit_s=draw(st.sampled_from([0, 300, 3600, 20000])),
            share_mem=20 * GIB if share else 0,
            ending=draw(st.sampled_from([False] * 9 + [True]))))
    return out


@st.composite
def pendings(draw: st.DrawFn) -> tuple[PendingJob, ...]:
    return tuple(PendingJob(
        id=i, qos=draw(st.sampled_from(["normal", "pro", "free"])),
        submit_time=NOW - draw(st.integers(0, 200000)),
        gpus=draw(st.sampled_from([0, 1, 1, 2, 4])), nodes=draw(st.sampled_from([1, 1, 2])),
        time_limit_s=draw(st.sampled_from([0, 300, 3600, 7200])),
        share=(share := draw(st.sampled_from([False, False, True]))),
        gpu_mem=30 * GIB if share else None) for i in range(draw(st.integers(1, 20))))


def snapshot(running: list[RunningJob], pending: tuple[PendingJob, ...]) -> Snapshot:
    nodes = tuple(NodeView(name=n, gpus=GPUS, cpus_free=64, mem_free=1 << 40,
                           free=frozenset(range(4)) - {g for r in running
                                                       for g in r.alloc.get(n, ())})
                  for n in NAMES)
    return Snapshot(nodes=nodes, pending=pending, running=tuple(running))


def same_plan(state: Snapshot, held: HeldIndex, now: float, policy: Policy) -> None:
    alone = plan(state, now, policy)
    queue = QueueIndex(policy)
    queue.sync(state.pending)
    borrowed = plan(dataclasses.replace(state, held=held, queue=queue), now, policy)
    assert borrowed.starts == alone.starts
    assert borrowed.reservations == alone.reservations
    assert borrowed.preemptions == alone.preemptions
    assert borrowed.reasons == alone.reasons


@settings(max_examples=200, deadline=None)
@given(runs(), pendings(), st.booleans())
def test_a_pass_over_the_callers_bookings_decides_the_same(
        running: list[RunningJob], pending: tuple[PendingJob, ...], explain: bool) -> None:
    held = HeldIndex()
    held.sync(running)
    before = {n: {g: list(ivs) for g, ivs in busy.items()} for n, busy in held.busy.items()}
    same_plan(snapshot(running, pending), held, NOW, dataclasses.replace(POLICY, explain=explain))
    # The pass copied what it booked: the caller's lists are as they were.
    assert {n: {g: list(ivs) for g, ivs in busy.items()} for n, busy in held.busy.items()} \
        == before


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(runs(), pendings(), st.integers(0, 400)), min_size=1, max_size=5))
def test_bookings_kept_across_passes_as_jobs_start_and_end_decide_the_same(steps) -> None:
    """One index across passes, brought to each pass's running jobs by adding and removing
    (as the simulator does): what passes note from it (start bounds) is dropped as it changes."""
    held = HeldIndex()
    now = NOW
    for running, pending, later in steps:
        now += later
        running = [dataclasses.replace(r, start_time=min(r.start_time + now - NOW, now))
                   for r in running]
        held.sync(running)
        assert len(held) == len(running)
        fresh = HeldIndex()
        fresh.sync(running)
        assert held.busy == fresh.busy and held.shared == fresh.shared
        same_plan(snapshot(running, pending), held, now, POLICY)


@settings(max_examples=100, deadline=None)
@given(runs(), st.lists(st.tuples(st.sampled_from([1, 2, 4]), st.sampled_from([0, 300, 7200])),
                        min_size=1, max_size=12))
def test_borrowed_profile_reserves_as_a_rebuilt_one(running: list[RunningJob], asks) -> None:
    """Reservation search on a profile that borrowed the bookings, through any run of
    bookings, finds the start and GPUs of one built from the running jobs."""
    held = HeldIndex()
    held.sync(running)
    nodes = snapshot(running, ()).nodes
    built, borrowed = Profile(nodes, running, NOW), Profile(nodes, running, NOW, held=held)
    for i, (gpus, limit) in enumerate(asks):
        job = PendingJob(id=i, qos="normal", submit_time=NOW, gpus=gpus, time_limit_s=limit)
        found = built.earliest(job)
        assert borrowed.earliest(job) == found
        assert borrowed.place(job, NOW) == built.place(job, NOW)
        if found is not None:
            built.book(job, found[1], found[0])
            borrowed.book(job, found[1], found[0])


def test_index_refuses_what_a_pass_must_clamp() -> None:
    job = RunningJob(id=1, qos="normal", alloc={"n1": (0,)}, start_time=NOW - 100,
                     time_limit_s=100)
    held = HeldIndex()
    held.add(job)
    assert not held.usable(NOW)  # overdue: the pass holds it until now + 1
    assert held.usable(NOW - 1)
    held.remove(1)
    assert held.busy == {} and held.usable(NOW)
    held.add(dataclasses.replace(job, time_limit_s=3600, ending=True))
    assert not held.usable(NOW)  # being stopped: free any moment


def test_a_cpu_only_job_comes_and_goes_beside_gpu_jobs() -> None:
    """A job on a node with no GPU of it books nothing there: its leaving, before or after a GPU
    job of that node, must find nothing to drop (gqd died on a KeyError here)."""
    cpu = RunningJob(id=1, qos="normal", alloc={"n1": ()}, start_time=NOW - 10,
                     time_limit_s=3600)
    gpu = RunningJob(id=2, qos="normal", alloc={"n1": (0,)}, start_time=NOW - 10,
                     time_limit_s=3600)
    for order in ([cpu, gpu], [gpu, cpu]):
        held = HeldIndex()
        held.sync(order)
        assert set(held.busy) == {"n1"} and set(held.busy["n1"]) == {0}
        held.sync(order[1:])
        held.sync([])
        assert held.busy == {} and held.usable(NOW)


def test_the_simulator_hands_its_bookings_and_decides_as_without_them() -> None:
    """The engine keeps a HeldIndex as jobs start and end and hands it to every pass, which
    borrows it (most passes here: no job is overdue); the replay is the one without it."""
    import random

    from gq.sched.types import Plan
    from gq.sim.engine import Cluster, Simulator
    from gq.sim.trace import TraceJob

    rng = random.Random(7)
    jobs = []
    for i in range(300):
        runtime = rng.choice([60, 600, 3600, 20000])
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        nodes, per = (gpus // 8, 8) if gpus > 8 else (1, gpus)
        jobs.append(TraceJob(id=i, name=str(i), submit_time=float(i * 90), runtime_s=runtime,
                             time_limit_s=runtime * rng.choice([1, 2, 5]), nodes=nodes,
                             gpus=per, user=f"u{i % 5}"))
    borrowed = []

    def watching(state: Snapshot, now: float, policy: Policy) -> Plan:
        held = state.held
        assert isinstance(held, HeldIndex) and len(held) == len(state.running)
        borrowed.append(held.usable(now))
        return plan(state, now, policy)

    cluster = Cluster(nodes=3)
    kept = Simulator(jobs, cluster, watching, POLICY).run()
    without = Simulator(jobs, cluster, plan, POLICY)
    without.held = None
    rebuilt = without.run()
    assert sum(borrowed) > len(borrowed) // 2, "most passes borrow the kept bookings"
    assert [(o.start, o.end, o.nodes) for o in kept.outcomes] \
        == [(o.start, o.end, o.nodes) for o in rebuilt.outcomes]
    assert kept.plan_calls == rebuilt.plan_calls
