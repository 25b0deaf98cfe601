"""Policies for the heterogeneous replay (gq/sim/hetero.py): first fit, best fit, the
fragmentation gradient descent (FGD) of "Beware of Fragmentation" (Weng et al., ATC'23), and
gq's own scheduler (gq.sched.plan) fed the same cluster as gqd would see it.

The three greedy ones take pending pods first come first served and start every pod that fits
somewhere (no reservations, as Kubernetes schedules pods); they differ only in where:
- firstfit: the first node in inventory order that holds the pod; its lowest GPUs that do;
- bestfit: the node left with the least free GPU capacity (thousandths), then fewest free CPUs,
  then memory; a sharing pod goes to the GPU with the least room that holds it;
- fgd: the node and GPU whose fragmentation (gq/sim/fragment.py) grows least.
The Philly baselines (gq/sim/baselines.py) place whole GPUs on identical nodes and know no GPU
types, CPUs or memory: they do not apply here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from gq.model import Gpu
from gq.sched import plan
from gq.sched.types import NodeView, PendingJob, Policy, RunningJob, Snapshot
from gq.sim.alibaba import MILLI, Pod
from gq.sim.fragment import Workload, task_key
from gq.sim.hetero import HeteroSim, NodeState
from gq.sim.hetero import Policy as HPolicy

#: (node index, GPUs) for a pod, or None.
Choice = tuple[int, tuple[int, ...]] | None
HETERO_POLICIES = ("gq", "firstfit", "bestfit", "fgd")


def _greedy(sim: HeteroSim, choose: Callable[[HeteroSim, Pod], Choice]) -> None:
    """Start, in submit order, every pending pod `choose` finds room for. Room only shrinks
    during a pass, so a request that found none is not looked for again in it."""
    failed: set[tuple[object, ...]] = set()
    for pod in list(sim.pending.values()):
        key = task_key(pod)
        if key in failed:
            continue
        where = choose(sim, pod)
        if where is None:
            failed.add(key)
            continue
        sim.start(pod.id, *where)


def _gpus(state: NodeState, pod: Pod, tightest: bool) -> tuple[int, ...]:
    if not pod.gpus:
        return ()
    cands = state.candidates(pod)
    if pod.shares and tightest:
        return (min(cands, key=lambda g: (MILLI - state.used[g], g)),)
    return tuple(cands[:pod.gpus])


@dataclass
class FirstFit:
    name: str = "firstfit"

    def __call__(self, sim: HeteroSim, now: float) -> float | None:
        _greedy(sim, self.choose)
        return None

    @staticmethod
    def choose(sim: HeteroSim, pod: Pod) -> Choice:
        for state in sim.nodes:
            if state.fits(pod):
                return state.index, _gpus(state, pod, tightest=False)
        return None


@dataclass
class BestFit:
    name: str = "bestfit"

    def __call__(self, sim: HeteroSim, now: float) -> float | None:
        _greedy(sim, self.choose)
        return None

    @staticmethod
    def choose(sim: HeteroSim, pod: Pod) -> Choice:
        take = pod.milli * pod.gpus
        best = min(((s.free_milli - take, s.cpu_free - pod.cpu_milli, s.mem_free - pod.mem_mib,
                     s.index) for s in sim.nodes if s.fits(pod)), default=None)
        if best is None:
            return None
        state = sim.nodes[best[-1]]
        return state.index, _gpus(state, pod, tightest=True)


@dataclass
class Fgd:
    """Fragmentation gradient descent: the placement that adds the least fragmentation."""

    workload: Workload
    name: str = "fgd"

    def __call__(self, sim: HeteroSim, now: float) -> float | None:
        _greedy(sim, self.choose)
        return None

    def choose(self, sim: HeteroSim, pod: Pod) -> Choice:
        best: tuple[float, int, tuple[int, ...]] | None = None
        for state in sim.nodes:
            if not state.fits(pod):
                continue
            before = self.workload(state)
            for gpus in self._options(state, pod):
                grow = self.workload.after(state, pod, gpus) - before
                if best is None or (grow, state.index) < best[:2]:
                    best = (grow, state.index, gpus)
        return None if best is None else (best[1], best[2])

    @staticmethod
    def _options(state: NodeState, pod: Pod) -> list[tuple[int, ...]]:
        """The distinct ways to place the pod on the node: whole GPUs are alike; a sharing pod
        on each distinct amount used (GPUs used alike are alike)."""
        if not pod.gpus:
            return [()]
        if not pod.shares:
            return [tuple(state.whole_free()[:pod.gpus])]
        by_use: dict[int, int] = {}
        for g in state.candidates(pod):
            by_use.setdefault(state.used[g], g)
        return [(g,) for g in by_use.values()]


@dataclass
class GqPolicy:
    """gq's scheduler on the heterogeneous cluster, as gqd would feed it: each GPU of its
    model (type), a sharing pod a `--share` job whose `--gpu-mem` is its gpu_milli out of a
    GPU's 1000 (gq's core books VRAM in one unit for all GPUs, while a pod's fraction is of
    whichever GPU it lands on: so the unit is a thousandth of a GPU), CPUs in thousandths
    and memory in MiB, gpu_spec as the nodes it may run on. Reservations wake it again."""

    policy: Policy
    name: str = "gq"
    gpu_tuples: dict[tuple[str, int], tuple[Gpu, ...]] = field(default_factory=dict)
    jobs: dict[int, PendingJob] = field(default_factory=dict)
    allowed: dict[frozenset[str], frozenset[str]] = field(default_factory=dict)

    def __call__(self, sim: HeteroSim, now: float) -> float | None:
        names = [s.node.name for s in sim.nodes]
        snapshot = Snapshot(nodes=tuple(self._view(s) for s in sim.nodes),
                            pending=[self._job(sim, p) for p in sim.pending.values()],
                            running=[self._running(r.pod, names[r.node], r.gpus, r.start)
                                     for r in sim.running.values()])
        decided = plan(snapshot, now, self.policy)
        if decided.preemptions:
            raise AssertionError("gq preempted in a replay with one QOS")
        index = {n: i for i, n in enumerate(names)}
        for s in decided.starts:
            if s.alloc:
                ((name, gpus),) = s.alloc.items()
                sim.start(s.job_id, index[name], gpus)
                continue
            # A CPU-only pod that gq's core placed on no node: the node with the fewest CPUs
            # left that holds it.
            host = self._host(sim, sim.pending[s.job_id])
            if host is not None:
                sim.start(s.job_id, host, ())
        due = [r.start for r in decided.reservations.values() if now < r.start < math.inf]
        return min(due, default=None)

    @staticmethod
    def _host(sim: HeteroSim, pod: Pod) -> int | None:
        fits = [(s.cpu_free - pod.cpu_milli, s.index) for s in sim.nodes if s.fits(pod)]
        return min(fits)[1] if fits else None

    def _view(self, state: NodeState) -> NodeView:
        key = (state.node.model, state.node.gpus)
        gpus = self.gpu_tuples.get(key)
        if gpus is None:
            gpus = self.gpu_tuples[key] = tuple(
                Gpu(index=i, type=state.node.model.lower(), memory=MILLI)
                for i in range(state.node.gpus))
        return NodeView(name=state.node.name, gpus=gpus, free=frozenset(state.whole_free()),
                        cpus_free=state.cpu_free, mem_free=state.mem_free)

    def _job(self, sim: HeteroSim, pod: Pod) -> PendingJob:
        job = self.jobs.get(pod.id)
        if job is None:
            allowed = None
            if pod.models is not None:
                allowed = self.allowed.get(pod.models)
                if allowed is None:
                    allowed = self.allowed[pod.models] = frozenset(
                        s.node.name for s in sim.nodes if pod.allows(s.node.model))
            job = self.jobs[pod.id] = PendingJob(
                id=pod.id, qos="normal", submit_time=pod.submit_time, gpus=pod.gpus,
                gpu_mem=pod.milli if pod.shares else None, cpus=pod.cpu_milli, mem=pod.mem_mib,
                time_limit_s=pod.time_limit_s, share=pod.shares, allowed=allowed)
        return job

    @staticmethod
    def _running(pod: Pod, name: str, gpus: tuple[int, ...], start: float) -> RunningJob:
        return RunningJob(id=pod.id, qos="normal", alloc={name: gpus} if gpus else {},
                          start_time=start, time_limit_s=pod.time_limit_s, cpus=pod.cpu_milli,
                          mem=pod.mem_mib, share_mem=pod.milli if pod.shares else 0)


def make(name: str, workload: Workload, policy: Policy) -> HPolicy:
    """A fresh policy of that name (UsageError for an unknown one)."""
    if name == "firstfit":
        return FirstFit()
    if name == "bestfit":
        return BestFit()
    if name == "fgd":
        return Fgd(workload)
    if name == "gq":
        return GqPolicy(policy)
    from gq.errors import UsageError
    raise UsageError(f"unknown policy {name!r} for a node inventory replay: expected one of "
                     f"{', '.join(HETERO_POLICIES)}")
