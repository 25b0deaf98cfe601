"""Where a job's GPUs go: best fit, so 1-GPU work packs onto busy nodes and whole nodes stay free."""

from __future__ import annotations

from gq.sched.types import NodeView, PendingJob


def eligible_gpus(node: NodeView, job: PendingJob) -> list[int]:
    """Free GPUs of `node` that match the job's type and VRAM filters, lowest index first."""
    return sorted(g.index for g in node.gpus
                  if g.index in node.free
                  and (job.gpu_type is None or g.type == job.gpu_type.lower())
                  and (job.gpu_mem is None or g.memory >= job.gpu_mem))


def could_ever_fit(node: NodeView, job: PendingJob) -> bool:
    """Whether the node, empty, could hold one rank of the job (else the job can never run there)."""
    matching = [g for g in node.gpus
                if (job.gpu_type is None or g.type == job.gpu_type.lower())
                and (job.gpu_mem is None or g.memory >= job.gpu_mem)]
    return len(matching) >= job.gpus


def place(nodes: dict[str, NodeView], job: PendingJob) -> dict[str, tuple[int, ...]] | None:
    """GPUs for every rank of `job` on distinct nodes, or None when it cannot start now."""
    fits: list[tuple[int, str, list[int]]] = []
    for node in nodes.values():
        if not node.schedulable or node.cpus_free < job.cpus or node.mem_free < job.mem:
            continue
        gpus = eligible_gpus(node, job)
        if len(gpus) >= job.gpus:
            # Best fit: fewest free GPUs left over first; name breaks ties so plans are stable.
            fits.append((len(node.free) - job.gpus, node.name, gpus[:job.gpus]))
    if len(fits) < job.nodes:
        return None
    fits.sort()
    return {name: tuple(gpus) for _, name, gpus in fits[:job.nodes]}


def take(nodes: dict[str, NodeView], job: PendingJob, alloc: dict[str, tuple[int, ...]]) -> None:
    """Mark `alloc` as used in the working copy of `nodes`."""
    for name, gpus in alloc.items():
        node = nodes[name]
        nodes[name] = NodeView(name=node.name, gpus=node.gpus, free=node.free - set(gpus),
                               cpus_free=node.cpus_free - job.cpus,
                               mem_free=node.mem_free - job.mem, schedulable=node.schedulable)
