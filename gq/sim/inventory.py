"""A node inventory replay end to end (`gq sim TRACE --nodes-csv NODES`): each policy on the
same pods and nodes, its placements audited, and the figures it is judged by."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gq.config import Config
from gq.sim.alibaba import HNode, Pod
from gq.sim.fragment import Workload
from gq.sim.hetero import HeteroSim, HResult, Violations, audit
from gq.sim.heteropolicy import make


@dataclass(frozen=True)
class Waits:
    count: int
    avg: float
    p99: float
    max: float


def waits(values: Sequence[float]) -> Waits:
    if not values:
        return Waits(0, 0.0, 0.0, 0.0)
    ordered = sorted(values)
    # Nearest rank, as gq/sim/metrics.py takes percentiles.
    p99 = ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]
    return Waits(len(ordered), sum(ordered) / len(ordered), p99, ordered[-1])


@dataclass(frozen=True)
class InventoryMetrics:
    policy: str
    pods: int
    started: int
    unfinished: int
    rejected: int
    wait_gpu: Waits
    wait_sharing: Waits
    wait_all: Waits
    #: Mean share of the GPUs' capacity allocated (thousandths summed), over the replay.
    gpu_allocated: float
    #: GPU-hours idle while a pending GPU pod that allows those GPUs' model waits, and that
    #: as a share of all GPU-hours of the cluster over the replay.
    stranded_gpu_h: float
    stranded_share: float
    #: The paper's fragmentation: mean fragmented GPUs, and as a share of the free GPUs.
    paper_frag_gpus: float
    paper_frag_rate: float
    vram_over: int
    excluded_model: int
    cpu_over: int
    mem_over: int
    #: Pods that shared a GPU with another pod at some instant.
    co_located: int
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def co_located(result: HResult) -> int:
    """Sharing pods that ran beside another pod on the same GPU at some instant."""
    by_gpu: dict[tuple[int, int], list[tuple[float, float, int]]] = {}
    for i, r in enumerate(result.records):
        if r.pod.shares:
            end = r.end if r.end is not None else float("inf")
            by_gpu.setdefault((r.node, r.gpus[0]), []).append((r.start, end, i))
    together: set[int] = set()
    for runs in by_gpu.values():
        runs.sort()
        for k, (start, end, i) in enumerate(runs):
            for start2, _, j in runs[k + 1:]:
                if start2 >= end:
                    break
                together.update((i, j))
    return len(together)


def summarize(result: HResult, found: Violations, pods: int) -> InventoryMetrics:
    started = [r for r in result.records]
    gpu = [r.start - r.pod.submit_time for r in started if r.pod.gpus]
    sharing = [r.start - r.pod.submit_time for r in started if r.pod.shares]
    span = result.gpu_s or 1.0
    return InventoryMetrics(
        policy=result.policy, pods=pods, started=len(started), unfinished=len(result.unfinished),
        rejected=len(result.rejected), wait_gpu=waits(gpu), wait_sharing=waits(sharing),
        wait_all=waits([r.start - r.pod.submit_time for r in started]),
        gpu_allocated=result.alloc_gpu_s / span, stranded_gpu_h=result.stranded_gpu_s / 3600,
        stranded_share=result.stranded_gpu_s / span,
        paper_frag_gpus=result.paper_frag_gpu_s / max(result.span_s, 1e-9),
        paper_frag_rate=result.paper_frag_gpu_s / (result.free_gpu_s or 1.0),
        vram_over=found.vram_over, excluded_model=found.excluded_model,
        cpu_over=found.cpu_over, mem_over=found.mem_over, co_located=co_located(result),
        wall_s=result.wall_s)


def run(nodes: Sequence[HNode], pods: Sequence[Pod], name: str,
        cfg: Config | None = None) -> tuple[HResult, Violations]:
    """One replay under policy `name` and the audit of its placements."""
    from gq.sim.replay import gq_policy
    workload = Workload(pods)
    sim = HeteroSim(nodes, pods, make(name, workload, gq_policy(cfg)), frag=workload)
    result = sim.run()
    return result, audit(nodes, result.records)


def replay(nodes: Sequence[HNode], pods: Sequence[Pod], names: Sequence[str],
           cfg: Config | None = None) -> dict[str, InventoryMetrics]:
    out = {}
    for name in names:
        result, found = run(nodes, pods, name, cfg)
        out[name] = summarize(result, found, len(pods))
    return out
