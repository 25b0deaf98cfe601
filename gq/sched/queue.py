"""The pending jobs in the orders a pass takes them, kept up to date as jobs come and go.

A caller that sees every job enter and leave the queue (the simulator) keeps a `QueueIndex`
and hands it to plan() with the snapshot (`Snapshot.queue`); gqd, which learns its eligible jobs
anew each pass, brings its own up to date with `sync`. A pass then orders
nothing: it takes aged jobs oldest first straight from `by_age`, ranks a tier's younger jobs only
if it gets to them, and backfill walks `by_size` only as far as it starts jobs. Without one, the
pass sorts what it needs itself; the plans are the same (tests/test_sched_backfill.py).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable

from gq.defaults import BIG_JOB_GPUS
from gq.sched.merge import ClassKey, class_key
from gq.sched.types import AgeKey, PendingJob, Policy, SizeKey

__all__ = ["AgeKey", "QueueIndex", "SizeKey", "age_key", "size_key"]


def size_key(job: PendingJob, policy: Policy) -> SizeKey:
    # Ids are unique, so comparing keys never reaches the job.
    return -policy.qos_priority.get(job.qos, 0), job.area, job.id, job


def age_key(job: PendingJob, policy: Policy) -> AgeKey:
    return -policy.qos_priority.get(job.qos, 0), job.submit_time, job.id, job


class QueueIndex:
    """Sorted keys of the pending jobs, and what a pass asks of the whole queue (its QOS, whether
    any job shares GPUs): a `types.QueueOrder`. The lists are read by plan() during a pass and
    must not change then."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.by_size: list[SizeKey] = []
        self.by_age: list[AgeKey] = []
        #: The big jobs' (BIG_JOB_GPUS or more) keys of `by_age`: Policy.big_reserve_depth walks them.
        self.big_by_age: list[AgeKey] = []
        #: The keys of `by_age` by class (merge.class_key), each in that order: priority
        #: order within a class (gq/sched/merge.py).
        self.by_class: dict[ClassKey, list[AgeKey]] = {}
        #: QOS -> pending jobs of it.
        self.qos: Counter[str] = Counter()
        #: Pending jobs that share GPUs, and that need none.
        self.sharing = 0
        self.gpuless = 0
        self.keyed = 0
        self._jobs: dict[int, PendingJob] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: PendingJob) -> None:
        self._jobs[job.id] = job
        insort(self.by_size, size_key(job, self.policy))
        key = age_key(job, self.policy)
        insort(self.by_age, key)
        if _big(job):
            insort(self.big_by_age, key)
        insort(self.by_class.setdefault(class_key(key), []), key)
        self.qos[job.qos] += 1
        self.sharing += job.share
        self.gpuless += not job.gpus
        self.keyed += job.cache_key is not None

    def sync(self, jobs: Iterable[PendingJob]) -> None:
        """Hold exactly `jobs`: those no longer among them leave, new ones (and new objects of
        jobs already held, such as a changed spec's) enter. For a caller that learns the
        queue as a whole each pass (gqd, whose eligible jobs change with time, dependencies and
        limits): a pass costs a dict lookup per job instead of a sort."""
        jobs = list(jobs)
        held = self._jobs
        new = [job for job in jobs if held.get(job.id) is not job]
        # Ids are unique: when every job is held as it is and as many are held, none left (the
        # usual pass, which then builds no set). A job held as another object leaves and enters.
        left = held.keys() - {job.id for job in jobs} if new or len(held) != len(jobs) else ()
        gone = [*left, *(job.id for job in new if job.id in held)]
        if len(gone) + len(new) <= len(jobs) // 8 + 16:
            for job_id in gone:
                self.remove(job_id)
            for job in new:
                self.add(job)
            return
        # Many at once (gqd's first pass, a big submit or release): sort them all.
        self._jobs = want = {job.id: job for job in jobs}
        self.by_size = sorted([size_key(j, self.policy) for j in want.values()])
        self.by_age = sorted([age_key(j, self.policy) for j in want.values()])
        self.big_by_age = [k for k in self.by_age if _big(k[-1])]
        self.by_class = {}
        for key in self.by_age:
            self.by_class.setdefault(class_key(key), []).append(key)
        self.qos = Counter(j.qos for j in want.values())
        self.sharing = sum(j.share for j in want.values())
        self.gpuless = sum(not j.gpus for j in want.values())
        self.keyed = sum(j.cache_key is not None for j in want.values())

    def remove(self, job_id: int) -> PendingJob:
        job = self._jobs.pop(job_id)
        del self.by_size[bisect_left(self.by_size, size_key(job, self.policy))]
        key = age_key(job, self.policy)
        del self.by_age[bisect_left(self.by_age, key)]
        if _big(job):
            del self.big_by_age[bisect_left(self.big_by_age, key)]
        ckey = class_key(key)
        members = self.by_class[ckey]
        del members[bisect_left(members, key)]
        if not members:
            del self.by_class[ckey]
        self.qos[job.qos] -= 1
        if not self.qos[job.qos]:
            del self.qos[job.qos]
        self.sharing -= job.share
        self.gpuless -= not job.gpus
        self.keyed -= job.cache_key is not None
        return job


def _big(job: PendingJob) -> bool:
    return job.nodes * job.gpus >= BIG_JOB_GPUS
