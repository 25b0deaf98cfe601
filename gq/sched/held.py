"""The GPUs running jobs hold, per node and GPU, kept up to date as jobs start and end.

A pass's availability profile starts from the running jobs' bookings. Rebuilding them from the
running jobs every pass (a few hundred interval inserts) had become most of a simulator pass; a
caller that sees jobs start and end (the simulator) keeps a `HeldIndex` instead and hands it to
plan() with the snapshot (`Snapshot.held`); gqd, which learns its running jobs anew each pass,
brings its own up to date with `sync`. The profile then borrows these lists and copies one only
when the pass books that GPU (gq/sched/profile.py); the plans are the same
(tests/test_sched_held.py).

A running job's booking here spans [start_time, start + limit), where the pass's own would span
[now, ...): a pass only asks about times from now on, and for those the two answer alike
(profile.py's readers: overlap, "held now", first-free and end times look at ends, or at starts
only to compare them with times >= now, where a start <= now never counts). The index cannot
give what a pass clamps (an overdue job held until now + 1, a job being stopped freed at once):
`usable` says so, and the pass then builds the profile itself.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from typing import TypeVar

from gq.sched.types import RunningJob

#: GPU index -> sorted (start, end) intervals; node -> that.
Busy = dict[int, list[tuple[float, float]]]
#: GPU index -> sorted (start, end, VRAM) bookings of sharing jobs; node -> that.
Shared = dict[int, list[tuple[float, float, int]]]
#: A node's notes for one GPU filter (HeldIndex.firsts).
Firsts = tuple[list[int], int, list[float]]
_T = TypeVar("_T", tuple[float, float], tuple[float, float, int])


class HeldIndex:
    """The running jobs' bookings as a `types.HeldGpus`. Read by plan() during a pass: it must
    not change then, and it must hold exactly the snapshot's running jobs."""

    def __init__(self) -> None:
        self.busy: dict[str, Busy] = {}
        self.shared: dict[str, Shared] = {}
        self._jobs: dict[int, RunningJob] = {}
        #: (end estimate, id) of every job, ascending: the first says whether one is overdue.
        self._ends: list[tuple[float, int]] = []
        #: Jobs being stopped, and a bound on the latest start (raised as jobs come).
        self._ending = 0
        self._latest_start = float("-inf")
        #: Node -> what a pass worked out from its bookings (profile.py's start bounds), kept
        #: until they change.
        self._firsts: dict[str, dict[tuple[object, ...], Firsts]] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def usable(self, now: float) -> bool:
        """Whether a pass at `now` may take the bookings as they are: no job is overdue (the
        pass would hold it until now + 1), being stopped, or started after now."""
        if self._latest_start > now:  # (a bound, only raised as jobs come: made exact here)
            self._latest_start = max((j.start_time for j in self._jobs.values()),
                                     default=float("-inf"))
        return not self._ending and self._latest_start <= now \
            and (not self._ends or self._ends[0][0] >= now + 1.0)

    def firsts(self, node: str) -> dict[tuple[object, ...], Firsts]:
        """A pass's notes on `node`'s bookings, dropped when they change: GPU filter ->
        (the GPUs it matches, how many of them have no booking, the others' last ends,
        ascending)."""
        found = self._firsts.get(node)
        if found is None:
            found = self._firsts[node] = {}
        return found

    def add(self, job: RunningJob) -> None:
        self._jobs[job.id] = job
        end = job.end_estimate
        interval = (job.start_time, end)
        for name, gpus in job.alloc.items():
            self._firsts.pop(name, None)
            if not gpus:
                continue  # a CPU-only job books no GPU (and must leave no empty node entry)
            busy = self.busy.setdefault(name, {})
            for gpu in gpus:
                insort(busy.setdefault(gpu, []), interval)
            if job.share_mem:
                shared = self.shared.setdefault(name, {})
                for gpu in gpus:
                    insort(shared.setdefault(gpu, []), (job.start_time, end, job.share_mem))
        insort(self._ends, (end, job.id))
        self._ending += job.ending
        self._latest_start = max(self._latest_start, job.start_time)

    def remove(self, job_id: int) -> RunningJob:
        job = self._jobs.pop(job_id)
        end = job.end_estimate
        interval = (job.start_time, end)
        for name, gpus in job.alloc.items():
            self._firsts.pop(name, None)
            if not gpus:
                continue
            _drop(self.busy, name, gpus, interval)
            if job.share_mem:
                _drop(self.shared, name, gpus, (job.start_time, end, job.share_mem))
        del self._ends[bisect_left(self._ends, (end, job.id))]
        self._ending -= job.ending
        return job

    def sync(self, jobs: Iterable[RunningJob]) -> None:
        """Hold exactly `jobs`: those no longer among them leave, new ones (and new objects of
        jobs held, such as one now being stopped) enter. For a caller that learns its running
        jobs as a whole each pass (gqd)."""
        jobs = list(jobs)
        held = self._jobs
        new = [job for job in jobs if held.get(job.id) is not job]
        if new or len(held) != len(jobs):
            left = held.keys() - {job.id for job in jobs}
            for job_id in [*left, *(job.id for job in new if job.id in held)]:
                self.remove(job_id)
            for job in new:
                self.add(job)


def _drop(by_node: dict[str, dict[int, list[_T]]], name: str, gpus: tuple[int, ...],
          booking: _T) -> None:
    node = by_node[name]
    for gpu in gpus:
        bookings = node[gpu]
        del bookings[bisect_left(bookings, booking)]
        if not bookings:
            del node[gpu]  # the profile counts GPUs with bookings
    if not node:
        del by_node[name]
