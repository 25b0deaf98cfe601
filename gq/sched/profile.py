"""The availability profile: for every GPU, the intervals it is taken, now and in the future.

Running jobs hold their GPUs until start + time limit; reservations made earlier in the same
pass hold theirs from their start for their limit. Unlike Slurm, which reserves whole nodes even
for 1-GPU jobs, the profile is kept per GPU, so small jobs can be planned around big ones.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field

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
        for gpu in gpus:
            insort(self.busy.setdefault(gpu, []), (start, end))


class Profile:
    def __init__(self, nodes: tuple[NodeView, ...], running: tuple[RunningJob, ...], now: float):
        self.now = now
        self.nodes = {n.name: NodeProfile(view=n) for n in nodes}
        for job in running:
            # An overdue job still holds its GPUs; a job being stopped frees them any moment.
            end = now + 1.0 if job.ending else max(job.end_estimate, now + 1.0)
            for name, gpus in job.alloc.items():
                node = self.nodes.get(name)
                if node is not None:
                    node.take(gpus, now, end)
        for view in nodes:
            # A GPU the snapshot says is taken but no running job explains (a job still being
            # stopped) is taken now, and free soon after.
            node = self.nodes[view.name]
            for gpu in view.gpus:
                if gpu.index not in view.free and not node.busy.get(gpu.index):
                    node.take((gpu.index,), now, now + 1.0)
        #: Free-now GPU count per node, kept up to date as jobs start in this pass.
        self.free_now = {n.name: len(n.free) for n in nodes}

    def end_times(self) -> list[float]:
        """Every time some GPU frees up, ascending: the candidate start times of a reservation."""
        times = {end for node in self.nodes.values() for ivs in node.busy.values()
                 for _, end in ivs if end > self.now and end != math.inf}
        return sorted(times)

    def candidates(self, node: NodeProfile, job: PendingJob, start: float) -> list[int]:
        """GPUs of `node` that match the job and are free from `start` for its whole limit."""
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        gpu_type = job.gpu_type.lower() if job.gpu_type else None
        out = []
        for gpu in node.view.gpus:
            if (gpu_type is None or gpu.type == gpu_type) \
                    and (job.gpu_mem is None or gpu.memory >= job.gpu_mem) \
                    and node.free_over(gpu.index, start, end):
                out.append(gpu.index)
        return out

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
                node.cpus_started += job.cpus
                node.mem_started += job.mem


def _future_load(node: NodeProfile, start: float) -> int:
    """Bookings that begin after `start` on this node: fewer is better for a job starting then."""
    return sum(1 for ivs in node.busy.values() for b_start, _ in ivs if b_start > start)

