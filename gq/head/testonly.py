"""sbatch --test-only: when and where a job would start if it were submitted now.

One scheduling pass, pure as every pass is, over the queue as the last pass saw it with the
job added (at its priority, as a submit would put it there), reserving for every blocked job
ahead of it so that the job gets an estimate too. Nothing is kept: the head's state is only read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from gq.head.views import pending_view
from gq.model import Job, JobSpec, JobState, iso_time
from gq.sched import Snapshot, plan
from gq.sched.plan import MAX_RESERVATIONS

if TYPE_CHECKING:
    from gq.head.jobs import JobTable
    from gq.model import Node
    from gq.sched import PendingJob, Policy


def estimate(table: JobTable, nodes: Iterable[Node], last_pending: tuple[PendingJob, ...],
             policy: Policy, spec: JobSpec, now: float) -> dict[str, Any]:
    """`spec` accepted as a submit's: the reply of a test_submit request. `last_pending`: the
    views of the jobs the last pass could start."""
    job_id = table.store.next_id()
    job = Job(id=job_id, spec=spec, submit_time=now)
    view: PendingJob = pending_view(job, table.views.allowed(spec))
    # Of those, the ones that still wait.
    queued = tuple(v for v in last_pending if (j := table.jobs.get(v.id)) is not None
                   and j.state == JobState.PENDING and not j.hold)
    policy = dataclasses.replace(policy, explain=True,
                                 reserve_depth=min(len(queued) + 1, MAX_RESERVATIONS))
    result = plan(Snapshot(nodes=table.node_views(nodes),
                           pending=(*queued, view), running=table.running_views(),
                           usage=table.usage.at(now)), now, policy)
    start = next((s for s in result.starts if s.job_id == job_id), None)
    reservation = result.reservations.get(job_id)
    at, alloc = (now, start.alloc) if start else \
        (reservation.start, reservation.alloc) if reservation else (None, {})
    tasks_here = spec.ntasks_per_node or -(-(spec.ntasks or spec.nodes) // spec.nodes)
    return {"id": job_id, "start": iso_time(at) if at is not None else None,
            "nodes": list(alloc), "cpus": (spec.cpus or tasks_here) * spec.nodes,
            "gpus": spec.gpus * spec.nodes, "partition": (spec.partition or "").split(",")[0],
            "reason": None if at is not None else result.reason(view)}
