"""A tier's young jobs in priority order, merged lazily from per-class lists (issue 17).

Within one class (QOS, time limit, nice, user; and whether the job is big, which sets when it
ages) every priority factor but age is the same, and none falls with age (types.Policy; the
fair-share factor is the user's): so a class's jobs in submit order are also in the order a pass
takes them, (-priority, submit time, id). A heap over the classes' heads then yields the tier's
young jobs in that order, ranking one job per class ahead of those taken: a pass behind a full
cluster ranks a few hundred jobs, not the queue (`Ranking` sorts them all without a QueueIndex;
the orders are the same, tests/test_sched_backfill.py).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence

from gq.defaults import BIG_JOB_GPUS
from gq.sched.types import AgeKey, PendingJob

#: (-tier, QOS, time limit, nice, user, big): what a job's priority depends on besides its age.
ClassKey = tuple[int, str, int, int, str, bool]


def class_key(key: AgeKey) -> ClassKey:
    job = key[-1]
    return (key[0], job.qos, job.time_limit_s, job.nice, job.user,
            job.nodes * job.gpus >= BIG_JOB_GPUS)


class YoungMerge:
    """The young (not aged) jobs of one tier's classes, best first, one at a time."""

    def __init__(self, classes: Sequence[Sequence[AgeKey]], cuts: tuple[float, float],
                 rank: Callable[[list[PendingJob]], Mapping[int, int]]) -> None:
        """`classes`: the tier's classes' keys, each in submit order; `cuts`: the submit times
        at or before which a small job and a big one are aged (Policy.aged_test)."""
        self.rank = rank
        self.lists = list(classes)
        #: Per class, its next job not yet in the heap.
        self.at: list[int] = []
        heads: list[tuple[int, int]] = []
        for i, keys in enumerate(self.lists):
            # A class's aged jobs are a prefix of it (one bound per class: small or big).
            bound = cuts[1] if keys[0][-1].nodes * keys[0][-1].gpus >= BIG_JOB_GPUS \
                else cuts[0]
            start = bisect_right(keys, (keys[0][0], bound, math.inf))
            self.at.append(start + 1)
            if start < len(keys):
                heads.append((i, start))
        prios = rank([self.lists[i][at][-1] for i, at in heads]) if heads else {}
        self.heap = [self._entry(i, at, prios) for i, at in heads]
        heapq.heapify(self.heap)

    def _entry(self, i: int, at: int, prios: Mapping[int, int]
               ) -> tuple[int, float, int, int, int]:
        job = self.lists[i][at][-1]
        return -prios[job.id], job.submit_time, job.id, i, at

    def next(self) -> PendingJob | None:
        if not self.heap:
            return None
        *_, i, at = heapq.heappop(self.heap)
        keys = self.lists[i]
        if at + 1 < len(keys):
            job = keys[at + 1][-1]
            heapq.heappush(self.heap, self._entry(i, at + 1, self.rank([job])))
            self.at[i] = at + 2
        return keys[at][-1]

    def rest(self) -> list[PendingJob]:
        """The jobs not taken yet, in no particular order."""
        rest = [self.lists[i][at][-1] for *_, i, at in self.heap]
        for i, keys in enumerate(self.lists):
            rest += [k[-1] for k in keys[self.at[i]:]]
        return rest
