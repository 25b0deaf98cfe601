"""From Slurm's request to what gq holds for a job: how many nodes, and on each the same GPUs,
CPUs and memory (gq starts a job's nodes together, each alike: a gang).

Slurm's request counts tasks (`-n`, `--ntasks-per-node`) and what each needs (`-c`,
`--gpus-per-task`), or GPUs for the whole job (`--gpus`) and CPUs or memory per GPU or CPU.
The mapping (gq.1 TASKS AND RESOURCES):

- nodes: `-N` as given; else `-n` over `--ntasks-per-node`; else as few as can hold the tasks
  (each task one CPU at least, as in Slurm) or the job's GPUs on the largest node it may use.
- tasks per node: `--ntasks-per-node`, else `-n` over the nodes rounded up (each node holds
  as many as the fullest one: Slurm's block layout puts the spare ones last).
- GPUs per node: `--gpus-per-node`/`--gres`; else `--gpus-per-task` times the tasks per node;
  else `--gpus` over the nodes, rounded up; else the default (gqd's `[scheduler]
  default_gpus`, none for a Slurm script).
- CPUs per node: `-c` times the tasks per node, else `--cpus-per-gpu` times the GPUs; memory:
  `--mem`, else `--mem-per-cpu` times the CPUs, else `--mem-per-gpu` times the GPUs.
- `--exclusive`: all of a node's GPUs, CPUs and memory (of the smallest node it may use).

Pure: gqd calls `resolve` when it accepts a spec, with the nodes the job may use.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gq.defaults import MAX_NODES_PER_JOB
from gq.errors import RefusedError
from gq.spec import BY_NAME


@dataclass(frozen=True)
class Capacity:
    """What one node the job may use has: its GPUs of the job's type and VRAM, CPUs, memory."""

    gpus: int
    cpus: int
    mem: int


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def resolve(values: dict[str, Any], nodes: Sequence[Capacity], default_gpus: int,
            warnings: list[str]) -> dict[str, Any]:
    """`values` (a checked spec's fields) with nodes, gpus, cpus and mem worked out, and
    ntasks as Slurm counts it; RefusedError for a request that contradicts itself. What gq
    does otherwise than asked is appended to `warnings`."""
    v = dict(values)
    ntasks, per_node = v["ntasks"], v["ntasks_per_node"]
    nodes_count = v["nodes"] if v["nodes"] is not None else _nodes_needed(v, nodes)
    if ntasks is not None and ntasks < nodes_count:
        warnings.append(f"{ntasks} task(s) cannot run on {nodes_count} nodes: setting the "
                        f"node count to {ntasks}")
        nodes_count = ntasks
    if ntasks is not None and per_node is not None and ntasks > nodes_count * per_node:
        raise RefusedError(f"-n {ntasks} tasks do not fit on {nodes_count} node(s) of "
                           f"--ntasks-per-node {per_node}")
    if nodes_count > MAX_NODES_PER_JOB:
        raise RefusedError(f"the job needs {nodes_count} nodes; gq gives a job at most "
                           f"{MAX_NODES_PER_JOB}")
    tasks_here = per_node or (_ceil(ntasks, nodes_count) if ntasks else 1)
    if ntasks is None and per_node is not None:
        v["ntasks"] = nodes_count * per_node
    v["nodes"] = nodes_count
    v["gpus"] = _gpus(v, tasks_here, nodes_count, default_gpus, warnings)
    if v["cpus_per_task"]:
        v["cpus"] = v["cpus_per_task"] * tasks_here
    elif v["cpus_per_gpu"]:
        v["cpus"] = v["cpus_per_gpu"] * v["gpus"]
    if v["mem_per_cpu"]:
        v["mem"] = v["mem_per_cpu"] * max(v["cpus"], tasks_here)
    elif v["mem_per_gpu"]:
        v["mem"] = v["mem_per_gpu"] * v["gpus"]
    if v["exclusive"] and nodes:
        v["gpus"] = max(v["gpus"], min(n.gpus for n in nodes))
        v["cpus"] = max(v["cpus"], min(n.cpus for n in nodes))
        v["mem"] = max(v["mem"], min(n.mem for n in nodes))
    for name, what in (("gpus", "GPUs"), ("cpus", "CPUs")):
        high = BY_NAME[name].bounds[1]  # type: ignore[index]
        if v[name] > high:
            raise RefusedError(f"the job asks for {v[name]} {what} on each node; gq allows at "
                               f"most {high}")
    return v


def _gpus(v: dict[str, Any], tasks_here: int, nodes_count: int, default_gpus: int,
          warnings: list[str]) -> int:
    """GPUs per node."""
    if v["gpus"] is not None:
        return int(v["gpus"])
    if v["gpus_per_task"] is not None:
        return int(v["gpus_per_task"]) * tasks_here
    if v["gpus_total"] is not None:
        each = _ceil(v["gpus_total"], nodes_count)
        if each * nodes_count != v["gpus_total"]:
            warnings.append(f"--gpus {v['gpus_total']} over {nodes_count} nodes: gq gives each "
                            f"node the same, {each} GPUs ({each * nodes_count} in all)")
        return each
    return default_gpus


def _nodes_needed(v: dict[str, Any], nodes: Sequence[Capacity]) -> int:
    """How many nodes a job that names no -N needs."""
    ntasks, per_node = v["ntasks"], v["ntasks_per_node"]
    if ntasks is not None and per_node is not None:
        return _ceil(ntasks, per_node)
    if not nodes:
        return 1  # nothing known yet: the job waits for nodes, and one node is the least
    if ntasks is not None:
        most = max(_tasks_fitting(v, n) for n in nodes)
        if most <= 0:
            raise RefusedError("no node can hold even one task of this job (of "
                               f"{_task_needs(v)})")
        return _ceil(ntasks, most)
    if v["gpus_total"] and v["gpus"] is None:
        most_gpus = max(n.gpus for n in nodes)
        return _ceil(v["gpus_total"], most_gpus) if most_gpus else 1
    return 1


def _tasks_fitting(v: dict[str, Any], node: Capacity) -> int:
    """How many tasks of the job one node holds (each at least one CPU, as in Slurm)."""
    fits = node.cpus // (v["cpus_per_task"] or 1) if node.cpus else 1 << 30
    if v["gpus_per_task"]:
        fits = min(fits, node.gpus // v["gpus_per_task"])
    if v["mem_per_cpu"] and node.mem:
        fits = min(fits, node.mem // (v["mem_per_cpu"] * (v["cpus_per_task"] or 1)))
    return fits


def _task_needs(v: dict[str, Any]) -> str:
    parts = [f"{v['cpus_per_task'] or 1} CPU(s)"]
    if v["gpus_per_task"]:
        parts.append(f"{v['gpus_per_task']} GPU(s)")
    return " and ".join(parts) + " each"
