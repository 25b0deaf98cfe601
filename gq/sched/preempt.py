"""Which running jobs to stop so a higher-tier job can start: those that lose the least work."""

from __future__ import annotations

from collections.abc import Callable

from gq.model import Gpu
from gq.sched.placement import gpu_fits
from gq.sched.types import PendingJob, Policy, RunningJob, Snapshot

#: Most blocked jobs one pass tries to preempt for (highest priority first).
MAX_PREEMPTORS = 32


class Victims:
    """Running jobs that may be preempted now, per node, cheapest first (built once a pass).

    Cost is GPU-seconds run (lost unless checkpointed); ties go to the most recently started.
    """

    def __init__(self, state: Snapshot, now: float, policy: Policy):
        self.nodes = {n.name: n for n in state.nodes if n.schedulable}
        self.gpus = {n.name: {g.index: g for g in n.gpus} for n in self.nodes.values()}
        self.by_node: dict[str, list[tuple[float, float, RunningJob]]] = {}
        for run in state.running:
            # A sharing job is no victim: stopping one sharer frees no GPU while others stay.
            if run.ending or run.share_mem or now - run.start_time < policy.preempt_exempt_s:
                continue
            cost = sum(len(g) for g in run.alloc.values()) * max(0.0, now - run.start_time)
            for name in run.alloc:
                self.by_node.setdefault(name, []).append((cost, -run.start_time, run))
        for runs in self.by_node.values():
            runs.sort(key=lambda c: c[:2])
        self.taken: set[int] = set()

    def choose(self, job: PendingJob, victim_qos: set[str], pool: frozenset[str] = frozenset(),
               usable: Callable[[str], bool] | None = None) -> list[int]:
        """The cheapest victims whose GPUs, with the free ones, fit every rank of `job`: jobs of
        `victim_qos`, and on the nodes of `pool` (the job's QOS's own) any other QOS's, which
        borrowed them. Only nodes `usable` by the job are looked at."""
        options: list[tuple[float, str, list[int]]] = []
        for name, node in self.nodes.items():
            if usable is not None and not usable(name):
                continue
            gpus = self.gpus[name]
            free = sum(1 for g in node.free if _matches(gpus, job, g))
            chosen: list[int] = []
            cost = 0.0
            for run_cost, _, run in self.by_node.get(name, ()):
                if free >= job.gpus:
                    break
                if run.id in self.taken or (run.qos not in victim_qos
                                            and (name not in pool or run.qos == job.qos)):
                    continue
                gained = sum(1 for g in run.alloc[name] if _matches(gpus, job, g))
                if gained:
                    chosen.append(run.id)
                    cost += run_cost
                    free += gained
            if free >= job.gpus:
                options.append((cost, name, chosen))
        if len(options) < job.nodes:
            return []
        options.sort()
        # A victim spanning nodes is counted once; a gang victim frees all of its nodes anyway.
        victims = list(dict.fromkeys(v for _, _, chosen in options[:job.nodes] for v in chosen))
        self.taken.update(victims)
        return victims


def _matches(gpus: dict[int, Gpu], job: PendingJob, gpu_index: int) -> bool:
    gpu = gpus.get(gpu_index)
    return gpu is not None and gpu_fits(gpu, job)
