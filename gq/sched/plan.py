"""One scheduling pass (v1): priority order, best-fit placement, gang start for multi-node jobs.

Backfill with reservations and preemption come in the scheduler issue; they slot in here.
"""

from __future__ import annotations

from gq.sched import placement
from gq.sched.priority import order
from gq.sched.types import Plan, Policy, Snapshot, Start

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"


def plan(state: Snapshot, now: float, policy: Policy) -> Plan:
    nodes = {n.name: n for n in state.nodes}
    result = Plan()
    blocked_before = False
    for prio, job in order(state.pending, now, policy):
        result.priorities[job.id] = prio
        alloc = placement.place(nodes, job)
        if alloc is not None:
            placement.take(nodes, job, alloc)
            result.starts.append(Start(job_id=job.id, alloc=alloc))
            continue
        fit_anywhere = sum(placement.could_ever_fit(n, job) for n in state.nodes) >= job.nodes
        if not fit_anywhere:
            result.reasons[job.id] = NEVER_FITS
        else:
            result.reasons[job.id] = PRIORITY if blocked_before else RESOURCES
            blocked_before = True
    return result
