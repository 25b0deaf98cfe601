"""Which running jobs to stop so a higher-tier job can start: those that lose the least work."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable

from gq.model import Gpu
from gq.sched import share
from gq.sched.placement import offered
from gq.sched.types import NodeView, PendingJob, Policy, RunningJob, Snapshot, Start

#: Most blocked jobs one pass tries to preempt for (highest priority first).
MAX_PREEMPTORS = 32


class Victims:
    """Running jobs that may be preempted now, per node, cheapest first (built once a pass).

    Cost is the GPU-seconds a preemption throws away: those run since the job's last checkpoint
    (since its start if it reported none); ties go to the most recently started. Jobs in their
    exemption (`Policy.exempt_s`), and those within their QOS's guaranteed share, are none.
    """

    def __init__(self, state: Snapshot, now: float, policy: Policy, starts: Iterable[Start] = ()):
        self.nodes = {n.name: n for n in state.nodes if n.schedulable}
        #: Node -> its GPUs free now: the snapshot's, less those of the jobs this pass starts
        #: (a victim's GPUs are worth only what they add to those).
        self.free: dict[str, frozenset[int]] = {n: v.free for n, v in self.nodes.items()}
        for start in starts:
            for name, gpus in start.alloc.items():
                if name in self.free:
                    self.free[name] = self.free[name].difference(gpus)
        self.gpus = {n.name: {g.index: g for g in n.gpus} for n in self.nodes.values()}
        self.by_node: dict[str, list[tuple[float, float, RunningJob]]] = {}
        #: Victim id -> its nodes, and the job.
        self.nodes_of: dict[int, tuple[str, ...]] = {}
        self.runs: dict[int, RunningJob] = {}
        for run in state.running:
            # A sharing job is no victim: stopping one sharer frees no GPU while others stay.
            if run.ending or run.share_mem \
                    or now - run.start_time < policy.exempt_s(run.qos, run.time_limit_s):
                continue
            cost = lost_work(run, now)
            self.nodes_of[run.id] = tuple(run.alloc)
            self.runs[run.id] = run
            for name in run.alloc:
                self.by_node.setdefault(name, []).append((cost, -run.start_time, run))
        for runs in self.by_node.values():
            runs.sort(key=lambda c: c[:2])
        self.taken: set[int] = set()
        self.now = now
        #: QOS with a guaranteed share -> its running GPUs above it, which alone may be taken.
        self.budget = share.preemptible(policy, state)
        # Filled on first need and kept for the pass: choose() runs for up to MAX_PREEMPTORS
        # blocked jobs, each looking at every node.
        self._free: dict[tuple[object, ...], int] = {}
        self._roomy_nodes: dict[tuple[object, ...], list[str]] = {}
        self._candidates: dict[tuple[object, ...], dict[str, list[tuple[float, RunningJob]]]] = {}
        # Per kind of request (its QOS, victims, pool and GPUs): node -> its option, None if it
        # has none. A node's option changes only when a victim on it is taken, so each choose()
        # of the pass works out only those (most blocked jobs are of a few shapes).
        self._options: dict[tuple[object, ...], dict[str, tuple[float, str, list[int]] | None]] \
            = {}

    def choose(self, job: PendingJob, victim_qos: set[str], pool: frozenset[str] = frozenset(),
               usable: Callable[[str], bool] | None = None, after_s: float = 0.0) -> list[int]:
        """The cheapest victims whose GPUs, with the free ones, fit every rank of `job`: jobs of
        `victim_qos`, and on the nodes of `pool` (the job's QOS's own) any other QOS's, which
        borrowed them; none that ends by its limit within `after_s` (the job's QOS's
        preempt_after_s: it is waited for). Only nodes `usable` by the job are looked at."""
        options: list[tuple[float, str, list[int]]] = []
        candidates = self._victims_of(job.qos, victim_qos, pool, after_s)
        # (`usable` depends on the job's QOS and node set only, and the pass's fixed state.)
        kept = self._options.setdefault(
            (job.qos, frozenset(victim_qos), pool, job.gpu_type, job.gpu_mem, job.gpus,
             job.allowed), {})
        # Only nodes with victims, or with enough free GPUs (an option that costs nothing).
        for name in {**candidates, **dict.fromkeys(self._roomy(job))}:
            if name in kept:
                option = kept[name]
            else:
                option = kept[name] = None if usable is not None and not usable(name) \
                    else self._option(name, job, candidates.get(name, ()))
            if option is not None:
                options.append(option)
        if len(options) < job.nodes:
            return []
        # A victim spanning nodes is counted once; a gang victim frees all of its nodes anyway.
        victims = list(dict.fromkeys(v for _, _, chosen in heapq.nsmallest(job.nodes, options)
                                     for v in chosen))
        if not self._within_budget(victims):
            return []  # ranks on several nodes took more of a share than it has above it
        self.taken.update(victims)
        if any(self.runs[v].qos in self.budget for v in victims):
            for v in victims:
                if self.runs[v].qos in self.budget:
                    self.budget[self.runs[v].qos] -= _gpus(self.runs[v])
            self._options.clear()  # every node's option may have leant on that budget
            return victims
        for name in {name for v in victims for name in self.nodes_of[v]}:
            for found in self._options.values():
                found.pop(name, None)
        return victims

    def _within_budget(self, victims: list[int]) -> bool:
        spent: dict[str, float] = {}
        for v in victims:
            qos = self.runs[v].qos
            if qos in self.budget:
                spent[qos] = spent.get(qos, 0.0) + _gpus(self.runs[v])
        return all(gpus <= self.budget[qos] for qos, gpus in spent.items())

    def _option(self, name: str, job: PendingJob, runs: Iterable[tuple[float, RunningJob]]
                ) -> tuple[float, str, list[int]] | None:
        """The cheapest victims on node `name` that, with its free GPUs, make room for one rank
        of `job`: (their cost, the node, their ids), or None when even all would not."""
        free = self._free_matching(name, job)
        gpus, view = self.gpus[name], self.nodes[name]
        chosen: list[int] = []
        cost = 0.0
        spent: dict[str, float] = {}
        for run_cost, run in runs:
            if free >= job.gpus:
                break
            if run.id in self.taken:
                continue
            if run.qos in self.budget:  # only the GPUs a share holds above it may be taken
                if spent.get(run.qos, 0.0) + _gpus(run) > self.budget[run.qos]:
                    continue
                spent[run.qos] = spent.get(run.qos, 0.0) + _gpus(run)
            gained = sum(1 for g in run.alloc[name] if _matches(view, gpus, job, g))
            if gained:
                chosen.append(run.id)
                cost += run_cost
                free += gained
        return (cost, name, chosen) if free >= job.gpus else None

    def _roomy(self, job: PendingJob) -> list[str]:
        """Nodes with enough free GPUs matching the job for one rank, victims or not."""
        key = (job.gpu_type, job.gpu_mem, job.gpus)
        found = self._roomy_nodes.get(key)
        if found is None:
            found = self._roomy_nodes[key] = [name for name in self.nodes
                                       if self._free_matching(name, job) >= job.gpus]
        return found

    def _free_matching(self, name: str, job: PendingJob) -> int:
        key = (name, job.gpu_type, job.gpu_mem)
        free = self._free.get(key)
        if free is None:
            gpus = self.gpus[name]
            view = self.nodes[name]
            free = self._free[key] = sum(1 for g in self.free[name]
                                         if _matches(view, gpus, job, g))
        return free

    def _victims_of(self, qos: str, victim_qos: set[str], pool: frozenset[str],
                    after_s: float) -> dict[str, list[tuple[float, RunningJob]]]:
        """Per node, the running jobs a job of `qos` may take GPUs from, cheapest first."""
        key = (qos, frozenset(victim_qos), pool, after_s)
        found = self._candidates.get(key)
        if found is None:
            found = self._candidates[key] = {}
            soon = self.now + after_s
            for name, runs in self.by_node.items():
                usable = [(cost, run) for cost, _, run in runs
                          if (run.qos in victim_qos or (name in pool and run.qos != qos))
                          and run.end_estimate > soon]
                if usable:
                    found[name] = usable
        return found


def lost_work(run: RunningJob, now: float) -> float:
    """GPU-seconds a preemption of `run` now throws away: those since its last checkpoint."""
    since = max(run.start_time, run.checkpoint_time or 0.0)
    return _gpus(run) * max(0.0, now - since)


def _gpus(run: RunningJob) -> int:
    return sum(len(g) for g in run.alloc.values())


def _matches(view: NodeView, gpus: dict[int, Gpu], job: PendingJob, gpu_index: int) -> bool:
    gpu = gpus.get(gpu_index)
    return gpu is not None and offered(view, gpu, job)
