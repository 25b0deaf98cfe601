"""Which GPUs a job may use at all: its type and VRAM filters, and what the node's telemetry
rules out now (placement itself is in profile)."""

from __future__ import annotations

from gq.model import Gpu
from gq.sched.types import NodeView, PendingJob


def gpu_fits(gpu: Gpu, job: PendingJob) -> bool:
    """The GPU is of the job's type (any, if none given; case does not matter) and has its VRAM."""
    return (job.gpu_type is None or gpu.type == job.gpu_type.lower()) \
        and (job.gpu_mem is None or gpu.memory >= job.gpu_mem)


def could_ever_fit(gpus: tuple[Gpu, ...], job: PendingJob) -> bool:
    """Whether a node with these GPUs, empty, could hold one rank of the job (else the job can
    never run there)."""
    return sum(1 for g in gpus if gpu_fits(g, job)) >= job.gpus


def offered(view: NodeView, gpu: Gpu, job: PendingJob) -> bool:
    """The GPU fits the job (`gpu_fits`) and the node's telemetry rules nothing out: it is not
    too hot, and processes not gq's leave the job's --gpu-mem free on it."""
    return gpu_fits(gpu, job) and not skipped(view, gpu, job)


def skipped(view: NodeView, gpu: Gpu, job: PendingJob) -> str | None:
    """Why the node's telemetry keeps the job off a GPU that would fit it, in a few fixed words
    (a reason that names no changing figure); None if nothing does."""
    if gpu.index in view.hot:
        return f"{view.name}:{gpu.index} too hot"
    free = view.vram_free.get(gpu.index)
    if job.gpu_mem is not None and free is not None and free < job.gpu_mem:
        return f"{view.name}:{gpu.index} VRAM held outside gq"
    return None


def telemetry_limited(view: NodeView) -> bool:
    """Whether the node's telemetry may rule out any of its GPUs."""
    return bool(view.hot or view.vram_free)
