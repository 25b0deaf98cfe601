"""Admission: what a submitted spec means (ranges, QOS, limits, dependencies), checked once,
bound to its caller, and refused with the reason when no node could ever run it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gq import defaults
from gq import spec as spec_fields
from gq.config import Config
from gq.deps import parse_dependency
from gq.errors import PermissionDenied, RefusedError
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.nodes import NodeRegistry
from gq.head.views import pending_view
from gq.model import Job, JobSpec, format_duration, format_size
from gq.sched import NodeView, placement

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
        """Check what a spec means (gq.spec.check, as the CLI did, after filling in gqd's
        defaults; then what needs gqd's config and state) and bind it to the caller."""
        if caller.uid == 0 and not self.cfg.auth.allow_root_jobs:
            raise PermissionDenied("permission denied: jobs of root are refused on this cluster "
                                   "([auth] allow_root_jobs = false); submit as a user")
        values = spec_fields.complete(raw)
        values["uid"], values["user"] = caller.uid, caller.user
        if (caller.proven or values["gid"] < 0) and intake.gid is not None:
            values["gid"] = intake.gid
        values["qos"] = values["qos"] or defaults.DEFAULT_QOS
        qos = self.cfg.qos.get(values["qos"])
        if qos is None:
            raise RefusedError(f"unknown QOS {values['qos']!r}; known: "
                               f"{', '.join(sorted(self.cfg.qos))}")
        if values["time_limit_s"] is None:
            values["time_limit_s"] = qos.default_time_s
        if values["retries"] is None:
            values["retries"] = self.cfg.head.default_retries if values["requeue"] else 0
        spec = JobSpec.from_dict(spec_fields.check(values))
        limit = spec.time_limit_s or 0
        if qos.max_time_s and not 0 < limit <= qos.max_time_s:
            # 0 is UNLIMITED, which a capped QOS cannot grant either.
            raise RefusedError(f"time limit {format_duration(limit)} is over the "
                               f"{spec.qos!r} QOS maximum of {format_duration(qos.max_time_s)}")
        if spec.dependency is not None:
            for parent in sorted(parse_dependency(spec.dependency).parents):
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
