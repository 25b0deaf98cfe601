"""The reasons gqd gives jobs of its own (a pending job's, a running one's on its way out), and
which reason each pending job gets from a pass.

Slurm's names where Slurm has one. The gate (gq/head/gate.py) and the limits (limits.py) give
theirs; the pure scheduler gives `Priority` and `Resources`.
"""

from __future__ import annotations

from gq.model import Job
from gq.sched import PendingJob, Plan

#: `reason` of a running job being preempted; it is requeued (or ends PREEMPTED) once stopped.
PREEMPTED = "Preempted"
#: `reason` of a running job that `gq requeue` is stopping; it is requeued once stopped.
REQUEUED = "Requeued"
#: Reasons of a running job on its way back to the queue.
STOPPING = frozenset({PREEMPTED, REQUEUED})
#: `reason` of a job back in the queue after its node failed under it.
NODE_FAIL = "NodeFail"
#: `reason` of a pending job nothing holds back yet (Slurm shows `None`).
NONE = "None"


def planned(eligible: list[Job], pending: tuple[PendingJob, ...], result: Plan
            ) -> list[tuple[Job, str]]:
    """(job, new reason) of each job the pass looked at and did not start whose reason
    changed: the pass's reason for it, or, for a job the pass left out, its shape's (`behind`).
    This runs for every queued job, so it is written out."""
    started = {start.job_id for start in result.starts}
    one_each = {view.shape: view for view in pending}
    behind = {shape: result.behind(view) for shape, view in one_each.items()} \
        if result.behind is not None else dict.fromkeys(one_each)
    get = result.reasons.get
    return [(job, reason) for job, view in zip(eligible, pending)
            if (reason := get(job.id) or (None if job.id in started else behind[view.shape]))
            is not None and job.reason != reason]
