"""The availability profile: for every GPU, the intervals it is taken, now and in the future.

Running jobs hold their GPUs until start + time limit; reservations made earlier in the same
pass hold theirs from their start for their limit. Unlike Slurm, which reserves whole nodes even
for 1-GPU jobs, the profile is kept per GPU, so small jobs can be planned around big ones.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field

from gq.sched.placement import gpu_fits
from gq.sched.types import Alloc, NodeView, PendingJob, RunningJob


@dataclass
class NodeProfile:
    view: NodeView
    #: GPU index -> sorted (start, end) intervals during which it is taken.
    busy: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    #: CPUs and memory taken by jobs started in this pass (the view's free figures already
    #: leave out running jobs; reservations do not count, being later).
    cpus_started: int = 0
    mem_started: int = 0

    def free_over(self, gpu: int, start: float, end: float) -> bool:
        for b_start, b_end in self.busy.get(gpu, ()):
            if b_start >= end:
                return True  # sorted: nothing later can overlap
            if b_end > start:
                return False
        return True

    def take(self, gpus: tuple[int, ...], start: float, end: float) -> None:
        busy, interval = self.busy, (start, end)
        for gpu in gpus:
            intervals = busy.get(gpu)
            if intervals is None:
                busy[gpu] = [interval]
            else:
                insort(intervals, interval)


class Profile:
    def __init__(self, nodes: tuple[NodeView, ...], running: tuple[RunningJob, ...], now: float):
        self.now = now
        self.nodes = {n.name: NodeProfile(view=n) for n in nodes}
        self._match_cache: dict[tuple[object, ...], list[int]] = {}
        for job in running:
            # An overdue job still holds its GPUs; a job being stopped frees them any moment.
            end = now + 1.0 if job.ending else max(job.end_estimate, now + 1.0)
            for name, gpus in job.alloc.items():
                node = self.nodes.get(name)
                if node is not None:
                    node.take(gpus, now, end)
        for view in nodes:
            # A GPU the snapshot says is taken but no running job explains (a job still being
            # stopped) is taken now, and free soon after. (When as many GPUs have bookings as
            # are taken, and none of them is free, every taken GPU is explained.)
            node = self.nodes[view.name]
            if len(node.busy) == len(view.gpus) - len(view.free) \
                    and view.free.isdisjoint(node.busy):
                continue
            for gpu in view.gpus:
                if gpu.index not in view.free and not node.busy.get(gpu.index):
                    node.take((gpu.index,), now, now + 1.0)
        #: Free-now GPU count per node, kept up to date as jobs start in this pass.
        self.free_now = {n.name: len(n.free) for n in nodes}
        self._free_total = sum(len(n.free) for n in nodes if n.schedulable)

    def any_free_now(self) -> bool:
        return self._free_total > 0

    def may_fit_now(self, job: PendingJob) -> bool:
        """Whether enough schedulable nodes have enough free GPUs for the job's shape (needed,
        not sufficient, for `place` to find room now)."""
        return sum(1 for name, free in self.free_now.items()
                   if free >= job.gpus and self.nodes[name].view.schedulable) >= job.nodes

    def end_times(self) -> list[float]:
        """Every time some GPU frees up, ascending: the candidate start times of a reservation."""
        times = {end for node in self.nodes.values() for ivs in node.busy.values()
                 for _, end in ivs if end > self.now and end != math.inf}
        return sorted(times)

    def earliest(self, job: PendingJob) -> tuple[float, Alloc] | None:
        """The earliest time after now, and the GPUs, where the job fits for its whole limit."""
        if job.nodes > 1:
            return self._earliest_gang(job)
        length = job.time_limit_s or math.inf
        best: tuple[float, str, list[int]] | None = None
        for name, node in self.nodes.items():
            if not node.view.schedulable:
                continue
            matching = self._matching(node, job)
            if len(matching) < job.gpus:
                continue
            starts = sorted({end for g in matching for _, end in node.busy.get(g, ())
                             if self.now < end < math.inf})
            for t in starts:
                if best is not None and t >= best[0]:
                    break  # this node cannot beat the best found so far
                free = [g for g in matching if node.free_over(g, t, t + length)]
                if len(free) >= job.gpus:
                    best = (t, name, self._prefer_unreserved(node, free, job.gpus, t))
                    break
        if best is None:
            return None
        return best[0], {best[1]: tuple(best[2])}

    def _earliest_gang(self, job: PendingJob) -> tuple[float, Alloc] | None:
        for start in self.end_times():
            alloc = self.place(job, start)
            if alloc is not None:
                return start, alloc
        return None

    def _matching(self, node: NodeProfile, job: PendingJob) -> list[int]:
        key = (node.view.name, job.gpu_type, job.gpu_mem)
        found = self._match_cache.get(key)
        if found is None:
            found = self._match_cache[key] = [g.index for g in node.view.gpus if gpu_fits(g, job)]
        return found

    def candidates(self, node: NodeProfile, job: PendingJob, start: float) -> list[int]:
        """GPUs of `node` that match the job and are free from `start` for its whole limit."""
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        return [g for g in self._matching(node, job) if node.free_over(g, start, end)]

    def place(self, job: PendingJob, start: float) -> Alloc | None:
        """GPUs for every rank of `job` from `start`, best fit, or None."""
        now = start <= self.now
        fits: list[tuple[int, int, str, list[int]]] = []
        for name, node in self.nodes.items():
            view = node.view
            if not view.schedulable or (now and self.free_now[name] < job.gpus):
                continue
            if now and (view.cpus_free - node.cpus_started < job.cpus
                        or view.mem_free - node.mem_started < job.mem):
                continue
            gpus = self.candidates(node, job, start) if job.gpus else []
            if len(gpus) < job.gpus:
                continue
            chosen = self._prefer_unreserved(node, gpus, job.gpus, start)
            # Best fit: the node with the fewest free GPUs left over, so 1-GPU work packs onto
            # busy nodes and idle nodes stay whole; name breaks ties so plans are stable.
            fits.append((self.free_now[name] - job.gpus, _future_load(node, start), name, chosen))
        if len(fits) < job.nodes:
            return None
        fits.sort()
        return {name: tuple(gpus) for _, _, name, gpus in fits[:job.nodes]}

    def _prefer_unreserved(self, node: NodeProfile, gpus: list[int], count: int,
                           start: float) -> list[int]:
        """Among suitable GPUs, take those with no later booking first (lowest index next)."""
        def later(gpu: int) -> int:
            return sum(1 for b_start, _ in node.busy.get(gpu, ()) if b_start >= start)
        return sorted(sorted(gpus, key=later)[:count])

    def book(self, job: PendingJob, alloc: Alloc, start: float) -> None:
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        for name, gpus in alloc.items():
            node = self.nodes[name]
            node.take(gpus, start, end)
            if start <= self.now:
                self.free_now[name] -= len(gpus)
                self._free_total -= len(gpus)
                node.cpus_started += job.cpus
                node.mem_started += job.mem


def _future_load(node: NodeProfile, start: float) -> int:
    """Bookings that begin after `start` on this node: fewer is better for a job starting then."""
    return sum(1 for ivs in node.busy.values() for b_start, _ in ivs if b_start > start)

