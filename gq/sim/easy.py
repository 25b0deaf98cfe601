"""EASY backfill (Lifka 1995; Mu'alem and Feitelson 2001), the standard baseline.

First come first served while jobs fit. The first job that does not (the head) gets the one
reservation: the earliest time, by the running jobs' limits, that enough GPUs are free for it,
on the node where they are (ties to the node with the fewest free GPUs then, then name order),
or for a multi-node job on the nodes that can hold a rank first. Any later job may start now
if it fits and either ends by its limit before that time ("short", placed best fit anywhere),
or keeps to what the reservation leaves ("long": best fit off the reserved nodes, or on a
reserved node within the GPUs free then beyond the head's need, which long jobs use up).
"""

from __future__ import annotations

import math
from gq.sched.types import Alloc, PendingJob, Plan, Policy, Reservation, Snapshot
from gq.sim.bestfit import Kept, Nodes, fits, node_ends, start
from gq.sim.fcfs import UNLIMITED, FcfsIndex, key


def easy_pass(state: Snapshot, now: float, policy: Policy, kept: Kept) -> Plan:
    """EASY: the head starts while it fits, then one reservation, then backfill around it."""
    nodes, plan, queue = Nodes(state, kept.nodes), Plan(), kept.queue
    while (head := queue.oldest()) is not None:
        where = nodes.best_fit((head.nodes, head.gpus))
        if where is None:
            break
        start(plan, nodes, queue, head, where, now)
    if head is None:
        return plan
    at, cap = reserve(state, now, nodes, head)
    if policy.explain:
        alloc: Alloc = {nodes.names[i]: () for i, c in enumerate(cap) if c < math.inf}
        plan.reservations[head.id] = Reservation(head.id, at, alloc)
    _backfill(plan, nodes, queue, now, min(at - now, UNLIMITED), cap)
    return plan


def _backfill(plan: Plan, nodes: Nodes, queue: FcfsIndex, now: float, window: float,
              cap: list[float]) -> None:
    """Start, oldest first, every job that EASY lets start now (module docstring).

    The arrival-order scan and "repeatedly the oldest admissible job" start the same jobs, as
    admissibility only shrinks in a pass; the oldest admissible of a shape is its oldest when it
    fits within the caps, else its oldest short one when it fits at all (gq/sim/fcfs.py)."""
    while True:
        room, capped = nodes.room(), nodes.room(cap)
        best: PendingJob | None = None
        for shape, q in queue.queues().items():
            if fits(capped, shape):
                job = q.oldest()
            elif fits(room, shape):
                job = q.oldest_within(window)
            else:
                continue
            if job is not None and (best is None or key(job) < key(best)):
                best = job
        if best is None:
            return
        short = (best.time_limit_s or UNLIMITED) <= window
        where = nodes.best_fit((best.nodes, best.gpus), None if short else cap)
        assert where is not None
        if not short:
            for i in where:
                cap[i] -= best.gpus
        start(plan, nodes, queue, best, where, now)


def reserve(state: Snapshot, now: float, nodes: Nodes, head: PendingJob
            ) -> tuple[float, list[float]]:
    """The head's reservation: its start, and per node what a job running past it may take
    there (inf off the reserved nodes)."""
    ends = node_ends(state, now, nodes)
    ready = sorted(_ready(ends[i], len(free), head.gpus, now) + (i,)
                   for i, free in enumerate(nodes.free))
    chosen = ready[:head.nodes]
    cap = [math.inf] * len(nodes.free)
    for _, free_then, i in chosen:
        cap[i] = free_then - head.gpus
    return chosen[-1][0], cap


def _ready(ends: list[tuple[float, int]], free: int, need: int, now: float
           ) -> tuple[float, int]:
    """When a node first has `need` GPUs free (by the limits of its jobs), and how many then."""
    i = 0
    while free < need and i < len(ends):
        at = ends[i][0]
        while i < len(ends) and ends[i][0] == at:  # jobs ending together free theirs together
            free += ends[i][1]
            i += 1
        if free >= need:
            return at, free
    return (now, free) if free >= need else (math.inf, free)
