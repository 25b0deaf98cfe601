"""Admission: what a submitted spec means (ranges, QOS, limits, dependencies), checked once,
bound to its caller, and refused with the reason when no node could ever run it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gq import defaults
from gq.arrays import parse_array
from gq.config import Config
from gq.deps import parse_dependency
from gq.errors import PermissionDenied, RefusedError, UsageError
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.nodes import NodeRegistry
from gq.head.views import pending_view
from gq.model import Job, JobSpec, format_duration, format_size, parse_signal
from gq.sched import NodeView, placement

MAX_JOBS_PER_NODE_COUNT = 64
MAX_GPUS_PER_NODE = 64


@dataclass
class Intake:
    """What every spec of one submit request shares, worked out once per request."""

    #: The nodes as the scheduler sees them (a scan of the live jobs).
    views: tuple[NodeView, ...]
    #: The caller's primary group; None when the passwd database does not know the caller.
    gid: int | None
    #: Shapes (nodes, GPUs, GPU type, VRAM) some node could hold: checked once each.
    fits: set[tuple[Any, ...]] = field(default_factory=set)


class Admission:
    def __init__(self, cfg: Config, table: JobTable, registry: NodeRegistry):
        self.cfg = cfg
        self.table = table
        self.registry = registry

    def intake(self, caller: Caller) -> Intake:
        return Intake(views=self.table.node_views(self.registry.nodes.values()),
                      gid=_primary_gid(caller.uid))

    def accept_spec(self, raw: dict[str, Any], caller: Caller, intake: Intake) -> JobSpec:
        """Check what a spec means (ranges, QOS, limits) and bind it to the caller."""
        spec = JobSpec.from_dict(raw)
        spec.uid = caller.uid
        spec.user = caller.user
        if caller.uid == 0 and not self.cfg.auth.allow_root_jobs:
            raise PermissionDenied("permission denied: jobs of root are refused on this cluster "
                                   "([auth] allow_root_jobs = false); submit as a user")
        if (caller.proven or spec.gid < 0) and intake.gid is not None:
            spec.gid = intake.gid
        if not 1 <= spec.nodes <= MAX_JOBS_PER_NODE_COUNT:
            raise UsageError(f"bad node count {spec.nodes}: expected 1..{MAX_JOBS_PER_NODE_COUNT}")
        if not 0 <= spec.gpus <= MAX_GPUS_PER_NODE:
            raise UsageError(f"bad GPU count {spec.gpus}: expected 0..{MAX_GPUS_PER_NODE}")
        if spec.cpus < 0 or spec.mem < 0:
            raise UsageError("CPU and memory requests cannot be negative")
        if not spec.cwd.startswith("/"):
            raise UsageError(f"working directory {spec.cwd!r} is not absolute")
        spec.qos = spec.qos or defaults.DEFAULT_QOS
        qos = self.cfg.qos.get(spec.qos)
        if qos is None:
            raise RefusedError(f"unknown QOS {spec.qos!r}; known: {', '.join(sorted(self.cfg.qos))}")
        if spec.time_limit_s is None:
            spec.time_limit_s = qos.default_time_s
        if spec.time_limit_s < 0:
            raise UsageError(f"bad time limit {spec.time_limit_s}: must not be negative")
        if qos.max_time_s and not 0 < spec.time_limit_s <= qos.max_time_s:
            # 0 is UNLIMITED, which a capped QOS cannot grant either.
            raise RefusedError(f"time limit {format_duration(spec.time_limit_s)} is over the "
                               f"{spec.qos!r} QOS maximum of {format_duration(qos.max_time_s)}")
        if spec.gpu_type:
            spec.gpu_type = spec.gpu_type.lower()
        if spec.share and not (spec.gpu_mem and spec.gpus):
            raise UsageError("--share needs --gpu-mem (the VRAM each of its GPUs must leave it) "
                             "and at least one GPU")
        if spec.retries is None:
            spec.retries = self.cfg.head.default_retries if spec.requeue else 0
        if not 0 <= spec.retries <= defaults.MAX_RETRIES:
            raise UsageError(f"bad --retries {spec.retries}: expected 0..{defaults.MAX_RETRIES}")
        if spec.retries and not spec.requeue:
            raise UsageError("--retries and --no-requeue contradict each other: --no-requeue "
                             "means no requeue at all (use --retries 0 to end NODE_FAIL at the "
                             "first node fault but stay requeueable)")
        if spec.signal is not None:
            # Stored canonical, so the shepherd and the preemption code never see a bad one.
            spec.signal = str(parse_signal(spec.signal))
        if spec.array is not None:
            spec.array = spec.array.strip()
            parse_array(spec.array)
        if spec.dependency is not None:
            dep = parse_dependency(spec.dependency)
            spec.dependency = str(dep)
            for parent in sorted(dep.parents):
                if not self.table.known(parent):
                    # As sbatch: a dependency on a job nobody knows is refused, not kept waiting.
                    raise RefusedError(f"job dependency problem: job {parent} does not exist")
        self._check_satisfiable(spec, intake)
        return spec

    def _check_satisfiable(self, spec: JobSpec, intake: Intake) -> None:
        """Refuse a job no known node could ever hold, saying why (as sbatch does)."""
        nodes = self.registry.nodes
        if not nodes:
            return  # nothing registered yet (a fresh head): the job waits for nodes instead
        shape = (spec.nodes, spec.gpus, spec.gpu_type, spec.gpu_mem)
        if shape in intake.fits:
            return
        view = pending_view(Job(id=0, spec=spec))
        hosts = [n for n in intake.views if placement.could_ever_fit(n.gpus, view)]
        if len(hosts) >= spec.nodes:
            intake.fits.add(shape)
            return
        want = f"{spec.gpus} GPU(s)" + (f" of type {spec.gpu_type}" if spec.gpu_type else "") \
            + (f" with at least {format_size(spec.gpu_mem)} each" if spec.gpu_mem else "")
        have = sorted({f"{len(n.gpus)}x{'/'.join(sorted({g.type for g in n.gpus}) or ['none'])}"
                       for n in nodes.values()})
        raise RefusedError(f"no node can ever run this job: it asks for {want} on each of "
                           f"{spec.nodes} node(s); {len(hosts)} node(s) could "
                           f"(nodes have: {', '.join(have)})")


def _primary_gid(uid: int) -> int | None:
    """The uid's primary group, or None when the passwd database does not know the uid."""
    import pwd
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None
