"""Where a job may run, and the admission checks that go with it: its partition
(`[partition.NAME]`: names, defaults, limits), `-w`/`-x`, and `--constraint` on node features;
then how many nodes and what on each its Slurm request comes to (gq/tasks.py), and whether any
node could ever hold that.

A cluster whose config defines no partition has one, defaults.DEFAULT_PARTITION, of every
node; a job naming another partition there runs on every node all the same, with a warning (a
Slurm script's `-p` must not stop it on a personal cluster). Once partitions are defined,
names are checked.

The scheduler sees the result as a pending job's `allowed` node set (None: any node).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gq import tasks
from gq.config import Config
from gq.defaults import DEFAULT_PARTITION
from gq.errors import PermissionDenied, RefusedError
from gq.features import parse_constraint, satisfies
from gq.head.auth import Caller
from gq.hostlist import expand
from gq.model import JobSpec, Node
from gq.optvalues import canon_partition
from gq.units import format_duration, format_size

#: What an allowed node set is computed from.
_Key = tuple[str | None, str | None, str | None, str | None]


class Partitions:
    """The partitions of a config and the allowed node sets of jobs (kept per request until
    the nodes change: `changed`)."""

    def __init__(self, cfg: Config) -> None:
        self.parts = cfg.partition
        self.nodes_of = {name: frozenset(n for item in p.nodes for n in expand(item))
                         for name, p in self.parts.items()}
        self.default = next((n for n, p in self.parts.items() if p.default),
                            next(iter(self.parts), DEFAULT_PARTITION))
        self._allowed: dict[_Key, frozenset[str] | None] = {}

    def changed(self) -> None:
        """A node came or its features changed: allowed sets are worked out again."""
        self._allowed.clear()

    def describe(self, nodes: Iterable[str]) -> list[dict[str, Any]]:
        """The partitions as `nodes` replies list them (sinfo, scontrol show partition)."""
        if not self.parts:
            return [{"name": DEFAULT_PARTITION, "nodes": sorted(nodes), "default": True,
                     "default_qos": "", "default_time_s": 0, "max_time_s": 0}]
        return [{"name": name, "nodes": sorted(self.nodes_of[name]), "default": name == self.default,
                 "default_qos": p.default_qos, "default_time_s": p.default_time_s,
                 "max_time_s": p.max_time_s} for name, p in self.parts.items()]

    def fill(self, values: dict[str, Any], caller: Caller, warnings: list[str]) -> None:
        """A raw spec's partition (its default if it names none; refused if unknown) and the
        defaults its partition gives (QOS, time limit), before gqd's own defaults."""
        if values["nice"] and values["nice"] < 0 and not caller.admin:
            raise PermissionDenied("permission denied: only an administrator may give a "
                                   "negative --nice")
        given = canon_partition(values["partition"]) if values["partition"] else None
        if not self.parts:
            if given and given != DEFAULT_PARTITION:
                warnings.append(f"no partitions are configured here: partition {given!r} is "
                                "every node")
            values["partition"] = given or DEFAULT_PARTITION
            return
        names = given.split(",") if given else [self.default]
        unknown = [n for n in names if n not in self.parts]
        if unknown:
            raise RefusedError(f"invalid partition {unknown[0]!r}; known: "
                               f"{', '.join(self.parts)}")
        first = self.parts[names[0]]
        values["qos"] = values["qos"] or first.default_qos or None
        if values["time_limit_s"] is None and (first.default_time_s or first.max_time_s):
            # As Slurm: without a DefaultTime, a partition's jobs get its MaxTime.
            values["time_limit_s"] = first.default_time_s or first.max_time_s
        values["partition"] = ",".join(names)

    def resolve(self, values: dict[str, Any], nodes: dict[str, Node], default_gpus: int,
                warnings: list[str]) -> dict[str, Any]:
        """A checked spec's nodes, GPUs, CPUs and memory from its Slurm request, worked out
        on the nodes it may use; refused over its partition's longest time limit."""
        limit = values["time_limit_s"] or math.inf
        caps = [self.parts[n].max_time_s for n in (values["partition"] or "").split(",")
                if n in self.parts]
        if caps and all(cap and limit > cap for cap in caps):
            raise RefusedError(f"time limit {format_duration(values['time_limit_s'] or 0)} is "
                               f"over the partition's maximum of {format_duration(max(caps))}")
        usable: list[tasks.Capacity] = []
        if values["exclusive"] or (values["nodes"] is None and (values["ntasks"]
                                                                 or values["gpus_total"])):
            # Only these depend on the nodes: a bulk submit of plain jobs looks at none.
            allowed = self.allowed_for(_key(values), nodes)
            usable = [tasks.Capacity(_matching(n, values["gpu_type"], values["gpu_mem"]),
                                     n.cpus, n.mem)
                      for n in nodes.values() if allowed is None or n.name in allowed]
        return tasks.resolve(values, usable, default_gpus, warnings)

    def allowed(self, spec: JobSpec, nodes: dict[str, Node]) -> frozenset[str] | None:
        """The names of the nodes a job may run on; None: any node."""
        return self.allowed_for((spec.partition, spec.nodelist, spec.exclude, spec.constraint),
                                nodes)

    def allowed_for(self, key: _Key, nodes: dict[str, Node]) -> frozenset[str] | None:
        if key in self._allowed:
            return self._allowed[key]
        partition, nodelist, exclude, constraint = key
        allowed: frozenset[str] | None = None
        if self.parts and partition:
            allowed = frozenset().union(*(self.nodes_of.get(p, ()) for p in partition.split(",")))
        if nodelist:
            listed = frozenset(expand(nodelist))
            allowed = listed if allowed is None else allowed & listed
        if exclude or constraint:
            pool = allowed if allowed is not None else frozenset(nodes)
            if exclude:
                pool -= frozenset(expand(exclude))
            if constraint:
                wanted = parse_constraint(constraint)
                pool = frozenset(n for n in pool if n in nodes
                                 and satisfies(nodes[n].features, wanted))
            allowed = pool
        self._allowed[key] = allowed
        return allowed

    def never_fits(self, spec: JobSpec, nodes: Iterable[Node]) -> str | None:
        """Why no node could ever run the job (as sbatch refuses it), or None."""
        all_nodes = {n.name: n for n in nodes}
        allowed = self.allowed(spec, all_nodes)
        pool = [n for n in all_nodes.values() if allowed is None or n.name in allowed]
        if not pool:
            return (f"no node can ever run this job: none of the {len(all_nodes)} node(s) is "
                    f"in its {_restriction(spec)}")
        holding = [n for n in pool if _holds(n, spec)]
        if len(holding) >= spec.nodes:
            return None
        want = f"{spec.gpus} GPU(s)" + (f" of type {spec.gpu_type}" if spec.gpu_type else "") \
            + (f" with at least {format_size(spec.gpu_mem)} each" if spec.gpu_mem else "") \
            + (f", {spec.cpus} CPUs" if spec.cpus else "") \
            + (f", {format_size(spec.mem)} of memory" if spec.mem else "")
        have = sorted({_shape(n) for n in pool})
        where = f" of the {len(pool)} in its {_restriction(spec)}" if allowed is not None else ""
        return (f"no node can ever run this job: it asks for {want} on each of {spec.nodes} "
                f"node(s); {len(holding)} node(s){where} could (nodes have: {', '.join(have)})")


def _key(values: dict[str, Any]) -> _Key:
    return (values["partition"], values["nodelist"], values["exclude"], values["constraint"])


def _matching(node: Node, gpu_type: str | None, gpu_mem: int | None) -> int:
    return sum(1 for g in node.gpus if (gpu_type is None or g.type == gpu_type.lower())
               and (gpu_mem is None or g.memory >= gpu_mem))


def _holds(node: Node, spec: JobSpec) -> bool:
    return _matching(node, spec.gpu_type, spec.gpu_mem) >= spec.gpus \
        and (not node.cpus or spec.cpus <= node.cpus) and (not node.mem or spec.mem <= node.mem)


def _shape(node: Node) -> str:
    types = "/".join(sorted({g.type for g in node.gpus}) or ["none"])
    return f"{len(node.gpus)}x{types} {node.cpus} CPUs {format_size(node.mem)}"


def _restriction(spec: JobSpec) -> str:
    parts = [f"partition {spec.partition}"] if spec.partition else []
    parts += [f"{what} {value}" for what, value in (("node list", spec.nodelist),
                                                    ("exclusion", spec.exclude),
                                                    ("constraint", spec.constraint)) if value]
    return ", ".join(parts) or "cluster"
