"""Which GPUs a job may use at all: its type and VRAM filters (placement itself is in profile)."""

from __future__ import annotations

from gq.model import Gpu
from gq.sched.types import PendingJob


def gpu_fits(gpu: Gpu, job: PendingJob) -> bool:
    """The GPU is of the job's type (any, if none given; case does not matter) and has its VRAM."""
    return (job.gpu_type is None or gpu.type == job.gpu_type.lower()) \
        and (job.gpu_mem is None or gpu.memory >= job.gpu_mem)


def could_ever_fit(gpus: tuple[Gpu, ...], job: PendingJob) -> bool:
    """Whether a node with these GPUs, empty, could hold one rank of the job (else the job can
    never run there)."""
    return sum(1 for g in gpus if gpu_fits(g, job)) >= job.gpus
