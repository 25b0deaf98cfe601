"""Best-fit placement on the free GPUs of one pass, for the baselines (gq/sim/baselines.py)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from gq.sched.types import Alloc, NodeView, PendingJob, Plan, Policy, Snapshot, Start
from gq.sim.fcfs import FcfsIndex, Shape


class NodeCache:
    """What a baseline reads of the snapshot's nodes, kept between passes while the simulator
    hands the same views (it makes a node's view anew only when its GPUs change)."""

    def __init__(self) -> None:
        self.nodes: tuple[NodeView, ...] = ()
        self.order: list[NodeView] = []
        self.free: dict[str, tuple[NodeView, list[int]]] = {}

    def ordered(self, nodes: tuple[NodeView, ...]) -> list[NodeView]:
        if nodes is not self.nodes:
            self.nodes = nodes
            self.order = sorted((n for n in nodes if n.schedulable), key=lambda n: n.name)
        return self.order

    def free_of(self, view: NodeView) -> list[int]:
        kept = self.free.get(view.name)
        if kept is None or kept[0] is not view:
            kept = self.free[view.name] = (view, sorted(view.free))
        return list(kept[1])


@dataclass
class Kept:
    """What a baseline keeps between passes: its queue, and what it read of the nodes."""

    queue: FcfsIndex = field(default_factory=FcfsIndex)
    nodes: NodeCache = field(default_factory=NodeCache)


#: A pass of a baseline: (the snapshot, now, the policy, what it keeps) -> its plan.
PassFn = Callable[[Snapshot, float, Policy, Kept], Plan]


class Nodes:
    """Free GPUs of the schedulable nodes during one pass, in name order: a node's index is its
    rank in that order, which breaks every tie."""

    def __init__(self, state: Snapshot, cache: NodeCache | None = None) -> None:
        cache = cache or NodeCache()
        views = cache.ordered(state.nodes)
        self.names = [v.name for v in views]
        self.free = [cache.free_of(v) for v in views]
        self.size = [len(v.gpus) for v in views]
        #: (node, planned end, GPUs) of the jobs started in this pass.
        self.started: list[tuple[int, float, int]] = []

    def room(self, cap: list[float] | None = None) -> list[float]:
        """Free GPUs per node (at most `cap` each), most first: a shape (k, g) fits only if
        room[k - 1] >= g."""
        if cap is None:
            return sorted(map(len, self.free), reverse=True)
        return sorted(map(min, map(len, self.free), cap), reverse=True)

    def best_fit(self, shape: Shape, cap: list[float] | None = None) -> list[int] | None:
        """The nodes for every rank of a shape (k nodes, g GPUs each): those with the fewest
        free GPUs that still hold g (and whose `cap` allows g), lowest index on ties."""
        k, g = shape
        fits = [(len(free), i) for i, free in enumerate(self.free)
                if len(free) >= g and (cap is None or cap[i] >= g)]
        if len(fits) < k:
            return None
        return [i for _, i in (sorted(fits)[:k] if k > 1 else [min(fits)])]

    def take(self, nodes: list[int], g: int) -> Alloc:
        alloc: Alloc = {}
        for i in nodes:
            alloc[self.names[i]] = tuple(self.free[i][:g])
            del self.free[i][:g]
        return alloc


def start(plan: Plan, nodes: Nodes, queue: FcfsIndex, job: PendingJob, where: list[int],
          now: float) -> None:
    """Start `job` on those nodes (lowest free GPU indices), and take it off the queue."""
    plan.starts.append(Start(job.id, nodes.take(where, job.gpus)))
    end = now + job.time_limit_s if job.time_limit_s else math.inf
    nodes.started += [(i, end, job.gpus) for i in where]
    queue.remove(job.id)


def fits(room: list[float], shape: Shape) -> bool:
    k, g = shape
    return len(room) >= k and room[k - 1] >= g


def node_ends(state: Snapshot, now: float, nodes: Nodes) -> list[list[tuple[float, int]]]:
    """Per node, (planned end, GPUs) of the jobs running there (those of the snapshot and those
    started in this pass), by their limits, soonest first."""
    index = {name: i for i, name in enumerate(nodes.names)}
    ends: defaultdict[int, list[tuple[float, int]]] = defaultdict(list)
    for run in state.running:
        end = now if run.ending else max(run.end_estimate, now)
        for name, gpus in run.alloc.items():
            if name in index:
                ends[index[name]].append((end, len(gpus)))
    for i, end, taken in nodes.started:
        ends[i].append((end, taken))
    return [sorted(ends[i]) for i in range(len(nodes.names))]
