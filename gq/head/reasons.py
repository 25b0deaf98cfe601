"""The reasons gqd gives jobs of its own (a pending job's, a running one's on its way out), and
which reason each pending job gets from a pass.

Slurm's names where Slurm has one. The gate (gq/head/gate.py) and the limits (limits.py) give
theirs; the pure scheduler gives `Priority` and `Resources`, and `WaitingForWarmGPU` to a job in
its --cold-wait (gq/sched/affinity.py).
"""

from __future__ import annotations

from collections.abc import Iterable

from gq.model import Job
from gq.sched import NodeView, PendingJob, Plan, placement
from gq.sched.plan import RESOURCES
from gq.sched.types import Shape

#: `reason` of a running job being preempted; it is requeued (or ends PREEMPTED) once stopped.
PREEMPTED = "Preempted"
#: `reason` of a running job that `gq requeue` is stopping; it is requeued once stopped.
REQUEUED = "Requeued"
#: Reasons of a running job on its way back to the queue.
STOPPING = frozenset({PREEMPTED, REQUEUED})
#: `reason` of a job back in the queue after its node failed under it.
NODE_FAIL = "NodeFail"
#: How many GPUs the nodes' telemetry skips a pending job's reason names.
SKIPS_SHOWN = 3
#: `reason` of a pending job nothing holds back yet (Slurm shows `None`).
NONE = "None"


def planned(eligible: list[Job], pending: tuple[PendingJob, ...], result: Plan,
            nodes: tuple[NodeView, ...] = ()) -> list[tuple[Job, str]]:
    """(job, new reason) of each job the pass looked at and did not start whose reason
    changed: the pass's reason for it, or, for a job the pass left out, its shape's (`behind`).
    A job waiting for Resources is told which GPUs that would fit it the nodes' telemetry
    ruled out (`skipped`). This runs for every queued job, so it is written out."""
    started = {start.job_id for start in result.starts}
    one_each = {view.shape: view for view in pending}
    behind = {shape: result.behind(view) for shape, view in one_each.items()} \
        if result.behind is not None else dict.fromkeys(one_each)
    get = result.reasons.get
    limited = [n for n in nodes if n.schedulable and placement.telemetry_limited(n)]
    notes: dict[Shape, str] = {}
    for view in pending if limited else ():
        if view.shape not in notes and get(view.id) == RESOURCES:
            notes[view.shape] = skipped(limited, view)
    return [(job, reason) for job, view in zip(eligible, pending)
            if (reason := get(job.id) or (None if job.id in started else behind[view.shape]))
            is not None and (reason := notes.get(view.shape, reason) if reason == RESOURCES
                             else reason) != job.reason]


def skipped(nodes: Iterable[NodeView], job: PendingJob) -> str:
    """`Resources`, with the GPUs fit for the job that the nodes' telemetry rules out now, if
    any: "Resources (telemetry skips n1:0 too hot, n2:3 has 20G VRAM free)"."""
    said = [why for n in nodes if job.allowed is None or n.name in job.allowed
            for g in n.gpus if placement.gpu_fits(g, job)
            and (why := placement.skipped(n, g, job)) is not None]
    if not said:
        return RESOURCES
    more = f", {len(said) - SKIPS_SHOWN} more" if len(said) > SKIPS_SHOWN else ""
    return f"{RESOURCES} (telemetry skips {', '.join(said[:SKIPS_SHOWN])}{more})"
