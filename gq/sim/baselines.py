"""Baseline policies to compare gq's scheduler against: strict FIFO, greedy first fit, EASY backfill.

Each has plan()'s signature and is written independently of gq.sched's code, so a bug there cannot
flatter gq here. All take jobs in submit order (FCFS, ignoring QOS) and place first fit: nodes in
name order, lowest free GPUs first; a multi-node job takes one node per rank with all its GPUs
free. GPU type and VRAM filters are ignored: simulated jobs never set them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from gq.sched.types import Alloc, PendingJob, Plan, Policy, Reservation, Snapshot, Start

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"

#: A job's shape: (nodes, GPUs per node).
Shape = tuple[int, int]
#: A GPU of the cluster: (node name, GPU index).
GpuRef = tuple[str, int]


@dataclass
class Free:
    """The working copy of free GPUs during one pass, nodes in name order."""

    gpus: dict[str, list[int]]
    #: GPUs per node, to tell whether a shape could ever fit.
    size: dict[str, int]
    #: Shapes that cannot start in the rest of this pass, with the reason. Free GPUs only shrink
    #: during a pass, so a shape that failed once fails again: a long queue of big jobs behind a
    #: full cluster costs one scan per shape, not one per job.
    dead: dict[Shape, str] = field(default_factory=dict)

    @classmethod
    def of(cls, state: Snapshot) -> Free:
        nodes = sorted((n for n in state.nodes if n.schedulable), key=lambda n: n.name)
        return cls(gpus={n.name: sorted(n.free) for n in nodes},
                   size={n.name: len(n.gpus) for n in nodes})

    def first_fit(self, job: PendingJob, avoid: frozenset[GpuRef] = frozenset()) -> Alloc | None:
        """GPUs for every rank of `job` on distinct nodes, skipping the `avoid` GPUs."""
        alloc: Alloc = {}
        for name, free in self.gpus.items():
            if len(free) < job.gpus:
                continue
            usable = [g for g in free if (name, g) not in avoid] if avoid else free
            if len(usable) >= job.gpus:
                alloc[name] = tuple(usable[:job.gpus])
                if len(alloc) == job.nodes:
                    return alloc
        return None

    def take(self, alloc: Alloc) -> None:
        for name, gpus in alloc.items():
            self.gpus[name] = [g for g in self.gpus[name] if g not in gpus]

    def never_fits(self, shapes: set[Shape]) -> None:
        """Mark the shapes no node set could ever hold: they wait forever, whatever is free."""
        for nodes, gpus in shapes:
            if sum(size >= gpus for size in self.size.values()) < nodes:
                self.dead[(nodes, gpus)] = NEVER_FITS

    def stuck(self, shapes: set[Shape]) -> bool:
        return len(self.dead) >= len(shapes)


def fcfs(state: Snapshot) -> list[PendingJob]:
    return sorted(state.pending, key=attrgetter("submit_time", "id"))


def shape(job: PendingJob) -> Shape:
    return (job.nodes, job.gpus)


def job_end(job: PendingJob, now: float) -> float:
    """When the scheduler must assume the job ends: its limit, or never without one."""
    return now + job.time_limit_s if job.time_limit_s else math.inf


def wait_rest(result: Plan, queue: Sequence[PendingJob], reason: str) -> None:
    """Give every job not yet looked at the same reason, without a Python-level loop over them."""
    result.reasons.update(dict.fromkeys(map(attrgetter("id"), queue), reason))


def start(result: Plan, free: Free, job: PendingJob, alloc: Alloc) -> None:
    free.take(alloc)
    result.starts.append(Start(job.id, alloc))


def setup(state: Snapshot) -> tuple[Free, list[PendingJob], set[Shape]]:
    free, queue = Free.of(state), fcfs(state)
    shapes = set(map(attrgetter("nodes", "gpus"), queue))
    free.never_fits(shapes)
    return free, queue, shapes


def fifo(state: Snapshot, now: float, policy: Policy) -> Plan:
    """Strict FCFS: start jobs in submit order; the first that cannot start blocks all behind it."""
    (free, queue, _), result = setup(state), Plan()
    for i, job in enumerate(queue):
        if shape(job) in free.dead:  # only never-fitting shapes: they must not block the queue
            result.reasons[job.id] = NEVER_FITS
            continue
        alloc = free.first_fit(job)
        if alloc is None:
            result.reasons[job.id] = RESOURCES
            wait_rest(result, queue[i + 1:], PRIORITY)
            break
        start(result, free, job, alloc)
    return result


def firstfit(state: Snapshot, now: float, policy: Policy) -> Plan:
    """Greedy: start every job that fits now, in submit order. Big jobs can starve."""
    (free, queue, shapes), result = setup(state), Plan()
    for i, job in enumerate(queue):
        key = shape(job)
        alloc = None if key in free.dead else free.first_fit(job)
        if alloc is not None:
            start(result, free, job, alloc)
            continue
        result.reasons[job.id] = free.dead.setdefault(key, RESOURCES)
        if free.stuck(shapes):
            wait_rest(result, queue[i + 1:], RESOURCES)
            break
    return result


def free_times(state: Snapshot, now: float) -> dict[str, dict[int, float]]:
    """Per node, per GPU: when it is free, from running jobs' start + limit (never without one)."""
    times = {n.name: {g.index: now for g in n.gpus} for n in state.nodes if n.schedulable}
    for run in state.running:
        for name, gpus in run.alloc.items():
            if name in times:
                for g in gpus:
                    times[name][g] = max(now, run.end_estimate)
    return times


def earliest(times: dict[str, dict[int, float]], job: PendingJob) -> Reservation:
    """The earliest time `job` fits on specific GPUs, placing first fit at that time.

    A node can hold a rank once its `gpus`-th GPU frees, and the job can start once `nodes`
    such nodes are ready: O(nodes x GPUs) per pass, rather than trying every end time."""
    ready: dict[str, list[tuple[float, int]]] = {}
    for name in sorted(times):
        soonest = sorted((t, g) for g, t in times[name].items())[:job.gpus]
        if len(soonest) == job.gpus:
            ready[name] = soonest
    if len(ready) < job.nodes:
        return Reservation(job_id=job.id, start=math.inf, alloc={})
    at = sorted(r[-1][0] for r in ready.values())[job.nodes - 1]
    alloc: Alloc = {}
    for name, soonest in ready.items():
        if soonest[-1][0] <= at and len(alloc) < job.nodes:
            # The GPUs freed first, so the reservation leans on the surest ends.
            alloc[name] = tuple(sorted(g for _, g in soonest))
    return Reservation(job_id=job.id, start=at, alloc=alloc)


@dataclass
class Held:
    """EASY's single reservation: for the first job that could not start."""

    reservation: Reservation
    gpus: frozenset[GpuRef]
    #: Shapes that found no room outside the reserved GPUs (long jobs must stay outside).
    dead_outside: set[Shape] = field(default_factory=set)


def easy(state: Snapshot, now: float, policy: Policy) -> Plan:
    """EASY backfill: FCFS until a job blocks; it alone gets a reservation, and a later job may
    start now only if it ends (by its limit) before that reservation or keeps off its GPUs."""
    (free, queue, shapes), result = setup(state), Plan()
    times = free_times(state, now)
    held: Held | None = None
    for i, job in enumerate(queue):
        if free.dead.get(shape(job)) == NEVER_FITS:
            result.reasons[job.id] = NEVER_FITS
            continue
        alloc = _backfill(free, held, job, now)
        if alloc is not None:
            start(result, free, job, alloc)
            for name, gpus in alloc.items():
                times[name].update(dict.fromkeys(gpus, job_end(job, now)))
            continue
        if held is None:
            reservation = earliest(times, job)
            held = Held(reservation, frozenset((n, g) for n, gs in reservation.alloc.items() for g in gs))
            result.reservations[job.id] = reservation
            result.reasons[job.id] = RESOURCES
        else:
            result.reasons[job.id] = PRIORITY
        if free.stuck(shapes):  # no shape fits even on the reserved GPUs: nothing more can start
            wait_rest(result, queue[i + 1:], PRIORITY)
            break
    return result


def _backfill(free: Free, held: Held | None, job: PendingJob, now: float) -> Alloc | None:
    """Where the job may start now under EASY's rule, or None; remembers shapes that failed."""
    key = shape(job)
    if held is None or job_end(job, now) <= held.reservation.start:
        alloc = None if key in free.dead else free.first_fit(job)
        if alloc is None:
            free.dead[key] = RESOURCES
        return alloc
    if key in free.dead or key in held.dead_outside:
        return None
    alloc = free.first_fit(job, avoid=held.gpus)
    if alloc is None:
        held.dead_outside.add(key)
    return alloc


BASELINES = {"fifo": fifo, "firstfit": firstfit, "easy": easy}
