"""What the scheduler sees (a snapshot) and what it decides (a plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gq.model import Gpu


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler sees it: what it has and what is free now."""

    name: str
    gpus: tuple[Gpu, ...]
    #: Indices of GPUs no job holds.
    free: frozenset[int]
    cpus_free: int = 0
    mem_free: int = 0
    #: False for DOWN and DRAIN nodes: they take no new work.
    schedulable: bool = True


@dataclass(frozen=True)
class PendingJob:
    id: int
    qos: str
    submit_time: float
    nodes: int = 1
    gpus: int = 1
    gpu_type: str | None = None
    gpu_mem: int | None = None
    cpus: int = 0
    mem: int = 0
    time_limit_s: int = 0
    #: Admin adjustment added to the computed priority.
    nice: int = 0


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    pending: tuple[PendingJob, ...]


@dataclass(frozen=True)
class Policy:
    """The scheduler's knobs, built by the head from its config."""

    qos_priority: dict[str, int] = field(default_factory=dict)
    weight_qos: int = 1000
    weight_age: int = 1000
    max_age_s: int = 7 * 86400


@dataclass(frozen=True)
class Start:
    job_id: int
    #: Node name -> GPU indices, in node rank order.
    alloc: dict[str, tuple[int, ...]]


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    #: Pending job id -> why it is still pending (Slurm's reason names).
    reasons: dict[int, str] = field(default_factory=dict)
    priorities: dict[int, int] = field(default_factory=dict)
