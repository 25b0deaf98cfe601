"""The heterogeneous replay engine: nodes of mixed GPU models with CPUs and memory, pods that
share a GPU by fractions (gpu_milli), take whole GPUs, or none; a simulated clock; fragmentation
measured as the replay goes (issue 18, Done when 4; docs/SCHEDULING.md).

The Philly engine (gq/sim/engine.py) models identical nodes of whole GPUs; this one is apart so
that neither pays for the other. Policies (gq/sim/heteropolicy.py) see the nodes' free
capacity and the pending pods, never a pod's runtime, and start pods through `start`, which
refuses (SimInvariantError) a GPU over its capacity, a node over its CPUs or memory, or a GPU
model the pod excludes. `audit` checks the finished replay's placements again, apart from the
engine's own bookkeeping.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gq.sim.alibaba import MILLI, HNode, Pod
from gq.sim.engine import SimInvariantError


class NodeState:
    """A node's free capacity now: per GPU the thousandths used, CPUs and memory left."""

    __slots__ = ("index", "node", "used", "cpu_free", "mem_free")

    def __init__(self, index: int, node: HNode) -> None:
        self.index, self.node = index, node
        self.used = [0] * node.gpus
        self.cpu_free, self.mem_free = node.cpu_milli, node.mem_mib

    @property
    def free_milli(self) -> int:
        return MILLI * len(self.used) - sum(self.used)

    def whole_free(self) -> list[int]:
        return [g for g, u in enumerate(self.used) if u == 0]

    def holds_host(self, pod: Pod) -> bool:
        """Its model, CPUs and memory allow the pod (GPUs aside)."""
        return (self.cpu_free >= pod.cpu_milli and self.mem_free >= pod.mem_mib
                and (not pod.gpus or pod.allows(self.node.model)))

    def candidates(self, pod: Pod) -> list[int]:
        """GPUs one of which a sharing pod may take, or the fully free GPUs for a whole one."""
        if pod.shares:
            return [g for g, u in enumerate(self.used) if MILLI - u >= pod.milli]
        return self.whole_free()

    def fits(self, pod: Pod) -> bool:
        if not self.holds_host(pod):
            return False
        if not pod.gpus:
            return True
        return len(self.candidates(pod)) >= (1 if pod.shares else pod.gpus)

    def key(self) -> tuple[object, ...]:
        """All that decides what fits here (for caches of fragmentation and fit)."""
        return (self.node.model, self.cpu_free, self.mem_free, tuple(sorted(self.used)))


@dataclass
class Record:
    """One pod's run: where, when (end None: still running when the trace ran out)."""

    pod: Pod
    node: int
    gpus: tuple[int, ...]
    start: float
    end: float | None = None


class Policy(Protocol):
    """A heterogeneous policy: one pass at `now`, starting pods by `sim.start`; returns a time
    to be called again at even if nothing happens then (a reservation's start), or None."""

    name: str

    def __call__(self, sim: HeteroSim, now: float) -> float | None: ...


@dataclass
class HResult:
    policy: str
    nodes: list[HNode]
    records: list[Record]
    #: Pods that no node of the inventory could ever hold (refused at submit).
    rejected: list[Pod]
    #: Pods still pending when the replay ended.
    unfinished: list[Pod]
    #: Seconds measured: from the first submission to the last end.
    span_s: float
    #: Capacity-seconds (in GPUs) integrated over the replay.
    gpu_s: float = 0.0
    alloc_gpu_s: float = 0.0
    #: Idle GPU-seconds of nodes that, empty, could hold a pending GPU pod (its GPU model,
    #: GPU count, CPUs and memory) while that pod waits: capacity fragmentation strands.
    stranded_gpu_s: float = 0.0
    #: The paper's fragmentation (Weng et al., ATC'23) integrated: GPU-seconds of free GPU
    #: capacity the target workload cannot use (gq/sim/fragment.py).
    paper_frag_gpu_s: float = 0.0
    #: Free GPU-seconds in all (the paper's fragmentation rate is paper_frag / this).
    free_gpu_s: float = 0.0
    passes: int = 0
    wall_s: float = 0.0


#: Per node (its state before and after a change) -> the paper's fragmentation there, GPUs.
FragFn = Callable[[NodeState], float]


class HeteroSim:
    """One replay of `pods` on `nodes` under `policy`; call `run()` once."""

    def __init__(self, nodes: Sequence[HNode], pods: Sequence[Pod], policy: Policy,
                 frag: FragFn | None = None) -> None:
        self.policy, self.frag_fn = policy, frag
        self.nodes = [NodeState(i, n) for i, n in enumerate(nodes)]
        ok = [p for p in pods if any(_could_ever(n, p) for n in nodes)]
        self.rejected = [p for p in pods if not any(_could_ever(n, p) for n in nodes)]
        self.arrivals = sorted(ok, key=lambda p: (p.submit_time, p.id))
        self.next_arrival = 0
        #: Pending pods in submit order (dict order: arrival).
        self.pending: dict[int, Pod] = {}
        self.running: dict[int, Record] = {}
        self.records: list[Record] = []
        self.events: list[tuple[float, int, int]] = []  # (time, kind, pod id); kind 0 end, 1 wake
        self.wakes: set[float] = set()
        self.now = 0.0
        # For the stranded-GPU measure: free thousandths per model, pending GPU pods by what
        # decides which nodes could ever hold them, and those nodes (None: to be worked out).
        self.free_by_model: Counter[str] = Counter()
        for n in self.nodes:
            self.free_by_model[n.node.model] += n.free_milli
        self.waiting: Counter[tuple[int, int, int, frozenset[str] | None]] = Counter()
        self.eligible: list[int] | None = None
        self.node_frag = [frag(n) if frag else 0.0 for n in self.nodes]
        self.frag_total = sum(self.node_frag)
        first = self.arrivals[0].submit_time if self.arrivals else 0.0
        self.result = HResult(policy=policy.name, nodes=list(nodes), records=self.records,
                              rejected=self.rejected, unfinished=[], span_s=0.0)
        self.began_at = first
        self.last_t = first

    # ------------------------------------------------------------ the loop

    def run(self) -> HResult:
        began = time.perf_counter()
        # Wake-ups left once nothing runs and nothing is to come can start nothing new (a
        # reservation waits for a running pod): they would only stretch the measured span.
        while self.next_arrival < len(self.arrivals) or self.running:
            now = self._next_time()
            self._account(now)
            self.now = now
            while self.events and self.events[0][0] == now:
                _, kind, pod_id = heapq.heappop(self.events)
                if kind == 0:
                    self._finish(pod_id, now)
                else:
                    self.wakes.discard(now)
            while self.next_arrival < len(self.arrivals) \
                    and self.arrivals[self.next_arrival].submit_time == now:
                pod = self.arrivals[self.next_arrival]
                self.pending[pod.id] = pod
                if pod.gpus:
                    self._wait(pod, 1)
                self.next_arrival += 1
            if self.pending:
                self.result.passes += 1
                wake = self.policy(self, now)
                if wake is not None and wake > now and wake < math.inf and wake not in self.wakes:
                    self.wakes.add(wake)
                    heapq.heappush(self.events, (wake, 1, 0))
        self.result.unfinished = list(self.pending.values())
        self.result.span_s = self.last_t - self.began_at
        self.result.wall_s = time.perf_counter() - began
        return self.result

    def _next_time(self) -> float:
        t = math.inf
        if self.next_arrival < len(self.arrivals):
            t = self.arrivals[self.next_arrival].submit_time
        if self.events:
            t = min(t, self.events[0][0])
        return t

    def _account(self, until: float) -> None:
        """Integrate capacity, allocation and fragmentation over [last_t, until): the state
        is constant in between."""
        dt = until - self.last_t
        if dt <= 0:
            return
        r = self.result
        capacity = sum(len(n.used) for n in self.nodes)
        free = sum(self.free_by_model.values()) / MILLI
        r.gpu_s += capacity * dt
        r.free_gpu_s += free * dt
        r.alloc_gpu_s += (capacity - free) * dt
        r.paper_frag_gpu_s += self.frag_total * dt
        if self.waiting:
            r.stranded_gpu_s += sum(self.nodes[i].free_milli for i in self._eligible()) \
                / MILLI * dt
        self.last_t = until

    # ------------------------------------------------------------ what policies call

    def start(self, pod_id: int, node: int, gpus: Sequence[int]) -> None:
        """Start a pending pod on `node`'s GPUs `gpus` (one for a sharing pod), now."""
        pod = self.pending.get(pod_id)
        if pod is None:
            raise SimInvariantError(f"start of pod {pod_id}, which is not pending")
        if not 0 <= node < len(self.nodes):
            raise SimInvariantError(f"pod {pod.name} placed on unknown node {node}")
        state = self.nodes[node]
        self._check(pod, state, tuple(gpus))
        for g in gpus:
            state.used[g] += pod.milli
        state.cpu_free -= pod.cpu_milli
        state.mem_free -= pod.mem_mib
        self.free_by_model[state.node.model] -= pod.milli * len(gpus)
        self._changed(state)
        del self.pending[pod_id]
        if pod.gpus:
            self._wait(pod, -1)
        record = Record(pod=pod, node=node, gpus=tuple(gpus), start=self.now)
        self.running[pod_id] = record
        self.records.append(record)
        end = self.now + min(pod.runtime_s, pod.time_limit_s or math.inf)
        heapq.heappush(self.events, (end, 0, pod_id))

    def offer(self, pod: Pod, now: float) -> bool:
        """Submit one pod at `now`, outside `run`, and pass once: True if it started; a pod
        that did not is dropped (the paper's experiment counts it failed; gq/sim/inflate.py)."""
        self.now = now
        self.pending[pod.id] = pod
        if pod.gpus:
            self._wait(pod, 1)
        self.policy(self, now)
        if pod.id not in self.pending:
            return True
        del self.pending[pod.id]
        if pod.gpus:
            self._wait(pod, -1)
        return False

    def _check(self, pod: Pod, state: NodeState, gpus: tuple[int, ...]) -> None:
        name = state.node.name
        if len(gpus) != pod.gpus or len(set(gpus)) != len(gpus):
            raise SimInvariantError(f"pod {pod.name} needs {pod.gpus} GPU(s), got {gpus} on {name}")
        if pod.gpus and not pod.allows(state.node.model):
            raise SimInvariantError(f"pod {pod.name} excludes {state.node.model} ({name})")
        if state.cpu_free < pod.cpu_milli or state.mem_free < pod.mem_mib:
            raise SimInvariantError(f"pod {pod.name} over-allocates {name}'s CPUs or memory")
        for g in gpus:
            if not 0 <= g < len(state.used) or state.used[g] + pod.milli > MILLI:
                raise SimInvariantError(f"pod {pod.name} over-allocates {name} GPU {g}")

    def _finish(self, pod_id: int, now: float) -> None:
        record = self.running.pop(pod_id)
        record.end = now
        state, pod = self.nodes[record.node], record.pod
        for g in record.gpus:
            state.used[g] -= pod.milli
        state.cpu_free += pod.cpu_milli
        state.mem_free += pod.mem_mib
        self.free_by_model[state.node.model] += pod.milli * len(record.gpus)
        self._changed(state)

    def _changed(self, state: NodeState) -> None:
        if self.frag_fn is not None:
            new = self.frag_fn(state)
            self.frag_total += new - self.node_frag[state.index]
            self.node_frag[state.index] = new

    def _wait(self, pod: Pod, change: int) -> None:
        key = (pod.gpus, pod.cpu_milli, pod.mem_mib, pod.models)
        self.waiting[key] += change
        if not self.waiting[key]:
            del self.waiting[key]
            self.eligible = None
        elif change > 0 and self.waiting[key] == 1:
            self.eligible = None

    def _eligible(self) -> list[int]:
        """Nodes that, empty, could hold some pending GPU pod (its model, GPU count, CPUs and
        memory): their idle GPUs are what a waiting pod could use but for fragmentation."""
        if self.eligible is None:
            kinds = [Pod(0, "", 0, 0, 0, gpus=g, milli=MILLI, cpu_milli=c, mem_mib=m, models=ms)
                     for g, c, m, ms in self.waiting]
            self.eligible = [s.index for s in self.nodes
                             if any(_could_ever(s.node, k) for k in kinds)]
        return self.eligible


def _could_ever(node: HNode, pod: Pod) -> bool:
    """Whether the node, empty, could hold the pod."""
    return (node.cpu_milli >= pod.cpu_milli and node.mem_mib >= pod.mem_mib
            and (not pod.gpus or (pod.allows(node.model) and node.gpus >= pod.gpus)))


@dataclass
class Violations:
    """What `audit` found wrong in a replay's placements (all zero for a sound replay)."""

    vram_over: int = 0
    excluded_model: int = 0
    cpu_over: int = 0
    mem_over: int = 0
    details: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return self.vram_over + self.excluded_model + self.cpu_over + self.mem_over


def audit(nodes: Sequence[HNode], records: Sequence[Record]) -> Violations:
    """Check every placement of a replay from the records alone: at no instant does any GPU
    hold more VRAM than it has (a pod takes gpu_milli/1000 of its GPU's VRAM, in bytes), any
    node more CPUs or memory, and no pod runs on a GPU model its gpu_spec excludes."""
    found = Violations()
    by_node: dict[int, list[tuple[float, int, int]]] = {}
    for i, r in enumerate(records):
        if r.pod.gpus and not r.pod.allows(nodes[r.node].model):
            found.excluded_model += 1
            found.details.append(f"{r.pod.name} on {nodes[r.node].model}")
        # Ends before starts at one instant: a pod that ends frees its share for one starting.
        by_node.setdefault(r.node, []).append((r.start, 1, i))
        by_node[r.node].append((math.inf if r.end is None else r.end, 0, i))
    for n, events in by_node.items():
        node = nodes[n]
        vram = [0] * node.gpus
        cpu = mem = 0
        for _, starting, i in sorted(events):
            r = records[i]
            sign = 1 if starting else -1
            # Bytes of VRAM, rounded down per pod: sum of floors <= floor of the sum, so a
            # GPU whose thousandths fit never shows over.
            take = r.pod.milli * node.vram // MILLI
            for g in r.gpus:
                vram[g] += sign * take
            cpu += sign * r.pod.cpu_milli
            mem += sign * r.pod.mem_mib
            if starting:
                if any(vram[g] > node.vram for g in r.gpus):
                    found.vram_over += 1
                    found.details.append(f"{r.pod.name}: VRAM over on {node.name}")
                found.cpu_over += cpu > node.cpu_milli
                found.mem_over += mem > node.mem_mib
    return found
