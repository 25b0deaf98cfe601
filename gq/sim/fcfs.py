"""The baselines' queue: pending jobs by shape in first-come order, with the oldest job of a
shape, and the oldest whose limit fits a window, found in O(log n).

A first-come policy that scans its whole queue every pass costs O(queue) per pass, which on a
long trace (51k jobs, queues of thousands) is minutes. Since free GPUs only shrink during a
pass, "scan in arrival order and start what is admissible" starts the same jobs as "repeatedly
start the oldest admissible job", and for jobs of one shape that is the shape's oldest, or, when
only jobs that end by a time may start, its oldest with a limit that short.
"""

from __future__ import annotations

import math
import sys
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator

from gq.sched.types import PendingJob

#: A shape: (nodes, GPUs per node).
Shape = tuple[int, int]
#: (submit time, id): first-come order.
Key = tuple[float, int]
#: An unlimited job's limit: longer than any window, but a real entry (empty slots are inf).
UNLIMITED = sys.float_info.max


def key(job: PendingJob) -> Key:
    return job.submit_time, job.id


class MinTree:
    """Numbers in slots 0, 1, ... (inf: empty), answering "the first slot holding at most x"."""

    def __init__(self) -> None:
        self.size = 16
        self.low = [math.inf] * (2 * self.size)

    def set(self, slot: int, value: float) -> None:
        if slot >= self.size:
            self._grow(slot)
        low, i = self.low, slot + self.size
        low[i] = value
        i //= 2
        while i:
            smaller = min(low[2 * i], low[2 * i + 1])
            if low[i] == smaller:
                break  # nothing above changes either
            low[i] = smaller
            i //= 2

    def first_at_most(self, x: float) -> int:
        """The first slot whose number is <= x, or -1."""
        low = self.low
        if low[1] > x:
            return -1
        i = 1
        while i < self.size:
            i *= 2
            if low[i] > x:
                i += 1  # the left half has none: the right one does
        return i - self.size

    def _grow(self, slot: int) -> None:
        leaves = self.low[self.size:]
        while self.size <= slot:
            self.size *= 2
        self.low = [math.inf] * self.size + leaves + [math.inf] * (self.size - len(leaves))
        for i in range(self.size - 1, 0, -1):
            self.low[i] = min(self.low[2 * i], self.low[2 * i + 1])


class ShapeQueue:
    """The pending jobs of one shape, each in a slot in first-come order, with its limit in a
    MinTree. Slots are never reused; `FcfsIndex` renumbers when a job comes out of order."""

    def __init__(self) -> None:
        self.tree = MinTree()
        self.jobs: list[PendingJob | None] = []
        self.count = 0

    def add(self, job: PendingJob) -> int:
        slot = len(self.jobs)
        self.jobs.append(job)
        self.tree.set(slot, job.time_limit_s or UNLIMITED)
        self.count += 1
        return slot

    def remove(self, slot: int) -> None:
        self.jobs[slot] = None
        self.tree.set(slot, math.inf)
        self.count -= 1

    def oldest(self) -> PendingJob | None:
        return self.oldest_within(UNLIMITED)

    def oldest_within(self, window: float) -> PendingJob | None:
        """The oldest job whose limit is at most `window` seconds (an unlimited one: never)."""
        slot = self.tree.first_at_most(window)
        return None if slot < 0 else self.jobs[slot]


class FcfsIndex:
    """Every pending job, by shape, in first-come order (submit time, then id)."""

    def __init__(self, jobs: Iterable[PendingJob] = ()) -> None:
        self._fill(jobs)

    def _fill(self, jobs: Iterable[PendingJob]) -> None:
        self.shapes: dict[Shape, ShapeQueue] = {}
        #: Job id -> its shape and slot.
        self.where: dict[int, tuple[Shape, int]] = {}
        #: (submit time, id, job) of every job, sorted: the whole queue in order.
        self.order: list[tuple[float, int, PendingJob]] = []
        self.last: Key = (-math.inf, 0)
        self.ordered = True
        for job in sorted(jobs, key=key):
            self.add(job)

    def __len__(self) -> int:
        return len(self.where)

    def add(self, job: PendingJob) -> None:
        if key(job) < self.last:
            self.ordered = False  # a requeued job: renumbered before the next question
        self.last = max(self.last, key(job))
        shape = (job.nodes, job.gpus)
        queue = self.shapes.get(shape)
        if queue is None:
            queue = self.shapes[shape] = ShapeQueue()
        self.where[job.id] = (shape, queue.add(job))
        insort(self.order, (job.submit_time, job.id, job))

    def remove(self, job_id: int) -> None:
        shape, slot = self.where.pop(job_id)
        queue = self.shapes[shape]
        job = queue.jobs[slot]
        assert job is not None
        del self.order[bisect_left(self.order, (job.submit_time, job.id))]
        queue.remove(slot)
        if not queue.count:
            del self.shapes[shape]  # slots are never reused: an emptied shape starts afresh

    def queues(self) -> dict[Shape, ShapeQueue]:
        """The shapes with pending jobs, renumbered first if a job came out of order."""
        if not self.ordered:
            self._fill([entry[-1] for entry in self.order])
        return self.shapes

    def oldest(self) -> PendingJob | None:
        """The first job in first-come order, or None."""
        return self.order[0][-1] if self.order else None

    def in_order(self) -> Iterator[PendingJob]:
        """Every job, first come first (do not add or remove while iterating)."""
        return (entry[-1] for entry in self.order)
