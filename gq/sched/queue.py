"""The pending jobs in the orders a pass takes them, kept up to date as jobs come and go.

A caller that sees every job enter and leave the queue (the simulator; gqd could too) keeps a
`QueueIndex` and hands it to plan() with the snapshot (`Snapshot.queue`). A pass then orders
nothing: it takes aged jobs oldest first straight from `by_age`, ranks a tier's younger jobs only
if it gets to them, and backfill walks `by_size` only as far as it starts jobs. Without one, the
pass sorts what it needs itself; the plans are the same (tests/test_sched_backfill.py).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter

from gq.sched.types import PendingJob, Policy

#: (-QOS tier, GPUs x limit, id, job): backfill order before priority breaks a tie.
SizeKey = tuple[int, float, int, PendingJob]
#: (-QOS tier, submit time, id, job): the order aged jobs are taken in.
AgeKey = tuple[int, float, int, PendingJob]


def size_key(job: PendingJob, policy: Policy) -> SizeKey:
    # Ids are unique, so comparing keys never reaches the job.
    return -policy.qos_priority.get(job.qos, 0), job.area, job.id, job


def age_key(job: PendingJob, policy: Policy) -> AgeKey:
    return -policy.qos_priority.get(job.qos, 0), job.submit_time, job.id, job


class QueueIndex:
    """Sorted keys of the pending jobs, and what a pass asks of the whole queue (its QOS, whether
    any job shares GPUs). The lists are read by plan() during a pass and must not change then."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.by_size: list[SizeKey] = []
        self.by_age: list[AgeKey] = []
        #: QOS -> pending jobs of it.
        self.qos: Counter[str] = Counter()
        #: Pending jobs that share GPUs.
        self.sharing = 0
        self._jobs: dict[int, PendingJob] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: PendingJob) -> None:
        self._jobs[job.id] = job
        insort(self.by_size, size_key(job, self.policy))
        insort(self.by_age, age_key(job, self.policy))
        self.qos[job.qos] += 1
        self.sharing += job.share

    def remove(self, job_id: int) -> PendingJob:
        job = self._jobs.pop(job_id)
        del self.by_size[bisect_left(self.by_size, size_key(job, self.policy))]
        del self.by_age[bisect_left(self.by_age, age_key(job, self.policy))]
        self.qos[job.qos] -= 1
        if not self.qos[job.qos]:
            del self.qos[job.qos]
        self.sharing -= job.share
        return job
