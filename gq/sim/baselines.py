"""Baseline policies to compare gq's scheduler against: strict FIFO, greedy first fit, EASY backfill.

Each has plan()'s signature and is written independently of gq.sched's code, so a bug there cannot
flatter gq here. All take jobs in submit order (FCFS, ignoring QOS) and place first fit: nodes in
name order, lowest free GPUs first; a multi-node job takes one node per rank with all its GPUs
free. GPU type and VRAM filters are ignored: simulated jobs never set them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gq.sched.types import Alloc, PendingJob, Plan, Policy, Reservation, Snapshot, Start

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"


@dataclass
class Free:
    """The working copy of free GPUs during one pass, nodes in name order."""

    gpus: dict[str, list[int]]
    #: GPUs per node, to tell whether a job could ever fit.
    size: dict[str, int]
    #: (nodes, GPUs per node) -> could ever fit; job shapes are few, nodes many.
    shapes: dict[tuple[int, int], bool] = field(default_factory=dict)

    @classmethod
    def of(cls, state: Snapshot) -> Free:
        nodes = sorted((n for n in state.nodes if n.schedulable), key=lambda n: n.name)
        return cls(gpus={n.name: sorted(n.free) for n in nodes},
                   size={n.name: len(n.gpus) for n in nodes})

    def first_fit(self, job: PendingJob, avoid: frozenset[tuple[str, int]] = frozenset()) -> Alloc | None:
        """GPUs for every rank of `job` on distinct nodes, skipping `avoid` (node, GPU) pairs."""
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

    def could_ever_fit(self, job: PendingJob) -> bool:
        key = (job.nodes, job.gpus)
        if key not in self.shapes:
            self.shapes[key] = sum(size >= job.gpus for size in self.size.values()) >= job.nodes
        return self.shapes[key]


def fcfs(state: Snapshot) -> list[PendingJob]:
    return sorted(state.pending, key=lambda j: (j.submit_time, j.id))


def job_end(job: PendingJob, now: float) -> float:
    """When the scheduler must assume the job ends: its limit, or never without one."""
    return now + job.time_limit_s if job.time_limit_s else math.inf


def fifo(state: Snapshot, now: float, policy: Policy) -> Plan:
    """Strict FCFS: start jobs in submit order; the first that cannot start blocks all behind it."""
    free, result = Free.of(state), Plan()
    blocked = False
    for job in fcfs(state):
        if not free.could_ever_fit(job):
            result.reasons[job.id] = NEVER_FITS
            continue
        alloc = None if blocked else free.first_fit(job)
        if alloc is None:
            result.reasons[job.id] = PRIORITY if blocked else RESOURCES
            blocked = True
            continue
        free.take(alloc)
        result.starts.append(Start(job.id, alloc))
    return result


def firstfit(state: Snapshot, now: float, policy: Policy) -> Plan:
    """Greedy: start every job that fits now, in submit order. Big jobs can starve."""
    free, result = Free.of(state), Plan()
    for job in fcfs(state):
        if not free.could_ever_fit(job):
            result.reasons[job.id] = NEVER_FITS
            continue
        alloc = free.first_fit(job)
        if alloc is None:
            result.reasons[job.id] = RESOURCES
            continue
        free.take(alloc)
        result.starts.append(Start(job.id, alloc))
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
    """The earliest time `job` fits on specific GPUs, placing first fit at that time."""
    moments = sorted({t for per_gpu in times.values() for t in per_gpu.values()})
    for at in moments:
        alloc: Alloc = {}
        for name in sorted(times):
            ready = sorted((t, g) for g, t in times[name].items() if t <= at)
            if len(ready) >= job.gpus:
                # The GPUs freed first, so the reservation leans on the surest ends.
                alloc[name] = tuple(sorted(g for _, g in ready[:job.gpus]))
                if len(alloc) == job.nodes:
                    return Reservation(job_id=job.id, start=at, alloc=alloc)
    return Reservation(job_id=job.id, start=math.inf, alloc={})


def easy(state: Snapshot, now: float, policy: Policy) -> Plan:
    """EASY backfill: FCFS until a job blocks; it alone gets a reservation, and a later job may
    start now only if it ends (by its limit) before that reservation or keeps off its GPUs."""
    free, result = Free.of(state), Plan()
    times = free_times(state, now)
    held: Reservation | None = None
    reserved: frozenset[tuple[str, int]] = frozenset()
    for job in fcfs(state):
        if not free.could_ever_fit(job):
            result.reasons[job.id] = NEVER_FITS
            continue
        if held is None:
            alloc = free.first_fit(job)
        else:
            alloc = free.first_fit(job, avoid=frozenset() if job_end(job, now) <= held.start else reserved)
        if alloc is not None:
            free.take(alloc)
            for name, gpus in alloc.items():
                times[name].update({g: job_end(job, now) for g in gpus})
            result.starts.append(Start(job.id, alloc))
            continue
        if held is None:
            held = earliest(times, job)
            reserved = frozenset((n, g) for n, gs in held.alloc.items() for g in gs)
            result.reservations[job.id] = held
            result.reasons[job.id] = RESOURCES
        else:
            result.reasons[job.id] = PRIORITY
    return result


BASELINES = {"fifo": fifo, "firstfit": firstfit, "easy": easy}
