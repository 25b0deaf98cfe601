"""GPU fragmentation as "Beware of Fragmentation" (Weng et al., USENIX ATC'23) measures it: the
free GPU capacity of a node that a task of the target workload could not use, averaged over
the workload's task types by their popularity.

For a node n and a task type t (GPU demand d: a fraction of one GPU, or k whole GPUs):
- t cannot run on n at all (too few CPUs or memory left, a GPU model it excludes, no GPU with
  d free, fewer than k whole free GPUs): every free thousandth of n's GPUs is a fragment;
- else: the free capacity of each GPU with less than min(d, 1) free is a fragment.
F_n = sum over t of popularity(t) x F_n(t), in GPUs. The target workload is the replay's own
GPU pods (CPU-only pods are left out: they use no GPU), as the paper takes the trace's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gq.sim.alibaba import MILLI, Pod
from gq.sim.hetero import NodeState

#: Task types kept (the most frequent; the rest are few each and weigh little).
TOP_TYPES = 48


@dataclass(frozen=True)
class TaskType:
    gpus: int
    milli: int
    cpu_milli: int
    mem_mib: int
    models: frozenset[str] | None
    weight: float


def task_key(pod: Pod) -> tuple[object, ...]:
    return (pod.gpus, pod.milli, pod.cpu_milli, pod.mem_mib, pod.models)


class Workload:
    """The target workload and each node state's fragmentation under it (cached by state)."""

    def __init__(self, pods: Sequence[Pod], top: int = TOP_TYPES) -> None:
        counts = Counter(task_key(p) for p in pods if p.gpus)
        kept = counts.most_common(top)
        total = sum(c for _, c in kept) or 1
        self.coverage = sum(c for _, c in kept) / max(1, sum(counts.values()))
        self.types = [TaskType(g, m, c, mem, models, n / total)  # type: ignore[arg-type]
                      for (g, m, c, mem, models), n in kept]
        self.thresholds = sorted({min(t.milli, MILLI) for t in self.types})
        self.cache: dict[tuple[object, ...], float] = {}

    def __call__(self, state: NodeState) -> float:
        return self.of(state.node.model, state.cpu_free, state.mem_free, state.used)

    def of(self, model: str, cpu: int, mem: int, used: Sequence[int]) -> float:
        """F_n in GPUs for a node of `model` with these CPUs, memory and GPU use left."""
        key = (model, cpu, mem, tuple(sorted(used)))
        found = self.cache.get(key)
        if found is not None:
            return found
        free = [MILLI - u for u in used]
        total = sum(free)
        whole = sum(1 for f in free if f == MILLI)
        most = max(free, default=0)
        below = {thr: sum(f for f in free if f < thr) for thr in self.thresholds}
        frag = 0.0
        for t in self.types:
            runs = (t.models is None or model in t.models) and cpu >= t.cpu_milli \
                and mem >= t.mem_mib and (most >= t.milli if t.milli < MILLI else whole >= t.gpus)
            frag += t.weight * (below[min(t.milli, MILLI)] if runs else total)
        frag /= MILLI
        if len(self.cache) > 200_000:
            self.cache.clear()  # bounded: states repeat, but a long replay has many
        self.cache[key] = frag
        return frag

    def after(self, state: NodeState, pod: Pod, gpus: Sequence[int]) -> float:
        """F_n were `pod` placed on `state`'s GPUs `gpus`."""
        used = list(state.used)
        for g in gpus:
            used[g] += pod.milli
        return self.of(state.node.model, state.cpu_free - pod.cpu_milli,
                       state.mem_free - pod.mem_mib, used)
