"""Baseline policies to compare gq's scheduler against: strict FIFO, greedy first fit, EASY
backfill and conservative backfill, as the batch-scheduling literature defines them.

Each has plan()'s signature and is written independently of gq.sched's code, so a bug there cannot
flatter gq here. All take jobs first come first served (ignoring QOS) and place best fit: the
node with the fewest free GPUs that still holds a rank, ties to the node first in name order; a
multi-node job takes the best-fitting nodes the same way (with whole-node ranks: the idle nodes
first in name order). GPU type and VRAM filters are ignored: simulated jobs never set them.
They agree job by job with an independent reference simulator (docs/SCHEDULING.md).

A baseline made by `BASELINES[name]()` keeps its queue indexed by shape (gq/sim/fcfs.py) as the
engine adds and removes jobs, so a pass costs what it starts, not the queue's length; called on
a snapshot it was not fed with (the module-level functions), it indexes that snapshot's queue.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from gq.sched.types import PendingJob, Plan, Policy, Snapshot
from gq.sim.bestfit import Kept, Nodes, PassFn, fits, start
from gq.sim.conservative import conservative_pass
from gq.sim.easy import easy_pass
from gq.sim.fcfs import FcfsIndex


def fifo_pass(state: Snapshot, now: float, policy: Policy, kept: Kept) -> Plan:
    """Strict FCFS: the first job that cannot start blocks all behind it."""
    nodes, plan, queue = Nodes(state, kept.nodes), Plan(), kept.queue
    while (job := queue.oldest()) is not None:
        where = nodes.best_fit((job.nodes, job.gpus))
        if where is None:
            break
        start(plan, nodes, queue, job, where, now)
    return plan


def firstfit_pass(state: Snapshot, now: float, policy: Policy, kept: Kept) -> Plan:
    """Greedy: every job that fits now starts, in submit order. Big jobs can starve."""
    nodes, plan, queue = Nodes(state, kept.nodes), Plan(), kept.queue
    while True:
        room = nodes.room()
        # The oldest job that fits is the oldest of the shapes' oldest that fit.
        heads = [q.oldest() for shape, q in queue.queues().items() if fits(room, shape)]
        job = min((j for j in heads if j is not None), key=_fcfs, default=None)
        if job is None:
            return plan
        where = nodes.best_fit((job.nodes, job.gpus))
        assert where is not None
        start(plan, nodes, queue, job, where, now)


def _fcfs(job: PendingJob) -> tuple[float, int]:
    return job.submit_time, job.id


@dataclass
class Baseline:
    """A baseline's pass with its queue kept by the engine (`add`, `remove`: the engine's
    QueueWatcher). A pass takes the jobs it starts off the queue at once; the engine's remove
    of them then only confirms it."""

    run: PassFn

    def __post_init__(self) -> None:
        self.kept = Kept()
        self.fed = False
        self.started: set[int] = set()

    def add(self, job: PendingJob) -> None:
        self.fed = True
        self.kept.queue.add(job)

    def remove(self, job_id: int) -> None:
        if job_id in self.started:
            self.started.discard(job_id)
        else:
            self.kept.queue.remove(job_id)

    def __call__(self, state: Snapshot, now: float, policy: Policy) -> Plan:
        if not self.fed:
            return self.run(state, now, policy, Kept(FcfsIndex(state.pending)))
        assert len(self.kept.queue) == len(state.pending), "baseline queue out of step"
        plan = self.run(state, now, policy, self.kept)
        self.started.update(s.job_id for s in plan.starts)
        return plan


def _unfed(run: PassFn) -> Callable[[Snapshot, float, Policy], Plan]:
    def policy(state: Snapshot, now: float, policy: Policy) -> Plan:
        return run(state, now, policy, Kept(FcfsIndex(state.pending)))
    policy.__doc__ = run.__doc__
    return policy


_PASSES: dict[str, PassFn] = {"fifo": fifo_pass, "firstfit": firstfit_pass, "easy": easy_pass,
                              "conservative": conservative_pass}
#: Name -> a fresh baseline for one replay (each keeps its own queue).
BASELINES: dict[str, Callable[[], Baseline]] = {
    name: functools.partial(Baseline, run) for name, run in _PASSES.items()}
#: The same as plain policies: each pass indexes the snapshot's queue (for tests and one-offs).
fifo = _unfed(fifo_pass)
firstfit = _unfed(firstfit_pass)
easy = _unfed(easy_pass)
conservative = _unfed(conservative_pass)
