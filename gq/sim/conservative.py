"""Conservative backfill (Mu'alem and Feitelson 2001): every queued job, first come first
served, gets the earliest reservation that delays none before it, in a per-node profile of free
GPUs rebuilt each pass from the running jobs' limits; a job starts when its reservation is now.

Reservation ties go to the node with the fewest GPUs free at that time, then name order; a
multi-node job takes the nodes whose free stretch began earliest. As the reference simulator
does, a pass reserves for at most the first `CAP` queued jobs (behind them, none can start in
that pass), and stops once no GPU is free now (later reservations cannot start anything now).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from itertools import islice

from gq.sched.types import PendingJob, Plan, Policy, Snapshot
from gq.sim.bestfit import Kept, Nodes, node_ends, start
from gq.sim.fcfs import FcfsIndex

#: Queued jobs a pass reserves for, at most.
CAP = 200


class Steps:
    """One node's free GPUs as a step function of time: `free[i]` on [at[i], at[i + 1])."""

    def __init__(self, now: float, free: int, ends: list[tuple[float, int]]) -> None:
        self.at, self.free = [now], [free]
        for end, gpus in ends:  # sorted
            if end <= self.at[-1]:
                self.free[-1] += gpus
            else:
                self.at.append(end)
                self.free.append(self.free[-1] + gpus)

    def earliest(self, need: int, length: float) -> tuple[float, int] | None:
        """The first time `need` GPUs are free for `length` seconds, with the GPUs free then."""
        at, free, i = self.at, self.free, 0
        while i < len(at):
            if free[i] < need:
                i += 1
                continue
            end, j = at[i] + length, i + 1
            while j < len(at) and at[j] < end and free[j] >= need:
                j += 1
            if j == len(at) or at[j] >= end:
                return at[i], free[i]
            i = j + 1  # every start up to step j would overlap it
        return None

    def stretches(self, need: int, length: float) -> list[tuple[float, float]]:
        """The maximal stretches [from, to) with `need` GPUs free, `length` long at least."""
        found, i = [], 0
        while i < len(self.at):
            if self.free[i] < need:
                i += 1
                continue
            j = i + 1
            while j < len(self.at) and self.free[j] >= need:
                j += 1
            begin, end = self.at[i], self.at[j] if j < len(self.at) else math.inf
            if end >= begin + length:
                found.append((begin, end))
            i = j
        return found

    def book(self, begin: float, end: float, gpus: int) -> None:
        first = self._split(begin)
        last = self._split(end) if end < math.inf else len(self.at)
        for i in range(first, last):
            self.free[i] -= gpus

    def _split(self, t: float) -> int:
        """The index of the step starting at t, made if need be (t >= now)."""
        i = bisect_left(self.at, t)
        if i == len(self.at) or self.at[i] != t:
            self.at.insert(i, t)
            self.free.insert(i, self.free[i - 1])
        return i


def conservative_pass(state: Snapshot, now: float, policy: Policy, kept: Kept) -> Plan:
    nodes, plan, queue = Nodes(state, kept.nodes), Plan(), kept.queue
    free_now = sum(map(len, nodes.free))
    if not free_now:
        return plan
    steps = [Steps(now, len(free), ends)
             for free, ends in zip(nodes.free, node_ends(state, now, nodes))]
    for job in list(islice(queue.in_order(), CAP)):
        length = job.time_limit_s or math.inf
        found = _gang(steps, job, length) if job.nodes > 1 else _single(steps, job, length)
        if found is None:
            continue  # no node could ever hold it
        at, where = found
        for i in where:
            steps[i].book(at, at + length, job.gpus)
        if at <= now:
            start(plan, nodes, queue, job, where, now)
            free_now -= job.nodes * job.gpus
            if not free_now:
                break
    return plan


def _single(steps: list[Steps], job: PendingJob, length: float) -> tuple[float, list[int]] | None:
    best: tuple[float, int, int] | None = None
    for i, node in enumerate(steps):
        found = node.earliest(job.gpus, length)
        if found is not None and (best is None or found + (i,) < best):
            best = found + (i,)
    return None if best is None else (best[0], [best[2]])


def _gang(steps: list[Steps], job: PendingJob, length: float) -> tuple[float, list[int]] | None:
    stretches = [node.stretches(job.gpus, length) for node in steps]
    for t in sorted({begin for found in stretches for begin, _ in found}):
        ready = sorted((begin, i) for i, found in enumerate(stretches) for begin, end in found
                       if begin <= t and end >= t + length)
        if len(ready) >= job.nodes:
            return t, sorted(i for _, i in ready[:job.nodes])
    return None
