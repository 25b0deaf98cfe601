"""Job steps (`srun` inside an allocation): where a step's tasks go and what each one's
environment says. Pure: gqd lays a step out when srun asks for it (`layout`), and each node's
step shepherd makes its tasks' environments (`task_env`) from the layout it was sent.

The layout follows Slurm's defaults for a step inside an allocation: the step uses the first
`-N` nodes of the job (all of them without -N); `-n` tasks (else `--ntasks-per-node` on each
node, else one a node) go in block order (node 0 gets its share first, the spare ones last),
and each task gets `--gpus-per-task` of its node's allocated GPUs, disjoint, in order
(`--gpus-per-task` 0 or none: the tasks of a node share all of its GPUs, as Slurm's do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gq.errors import RefusedError
from gq.hostlist import compress, counted

#: Most tasks of one step (each a process on a node; Slurm's default MaxTasksPerNode is 512).
MAX_TASKS = 4096


@dataclass(frozen=True)
class Task:
    procid: int
    localid: int
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class NodePart:
    """The tasks of a step on one node of the job."""

    node: str
    #: Its place in the job's node list (SLURM_NODEID).
    node_id: int
    tasks: tuple[Task, ...]


def layout(job_nodes: list[str], gpus: dict[str, list[int]], *, ntasks: int | None,
           nodes: int | None, ntasks_per_node: int | None, gpus_per_task: int | None,
           only: list[str] | None = None) -> list[NodePart]:
    """The step's tasks on the job's nodes (`job_nodes` in rank order, `gpus` each node's
    allocated GPU indices; `only`: srun -w, these of them); RefusedError for a step the
    allocation cannot hold."""
    if only:
        strangers = sorted(set(only) - set(job_nodes))
        if strangers:
            raise RefusedError(f"srun -w: {', '.join(strangers)} not in the job's nodes "
                               f"({', '.join(job_nodes)})")
    nodelist = [n for n in job_nodes if not only or n in only]
    if nodes is not None and not 1 <= nodes <= len(nodelist):
        raise RefusedError(f"srun -N {nodes}: the step may use {len(nodelist)} node(s)")
    if ntasks is not None and ntasks < 1:
        raise RefusedError("srun -n must be at least 1")
    if ntasks_per_node is not None and ntasks_per_node < 1:
        raise RefusedError("srun --ntasks-per-node must be at least 1")
    if nodes is None:
        if ntasks is not None and ntasks_per_node:
            nodes = min(len(nodelist), -(-ntasks // ntasks_per_node))
        elif ntasks is not None:
            nodes = min(len(nodelist), ntasks)
        else:
            nodes = len(nodelist)
    if ntasks is None:
        ntasks = nodes * (ntasks_per_node or 1)
    if ntasks > MAX_TASKS:
        raise RefusedError(f"srun -n {ntasks}: gq runs at most {MAX_TASKS} tasks a step")
    if ntasks < nodes:
        nodes = ntasks  # as Slurm: one node a task at least, so no node idles in the step
    most = ntasks_per_node or -(-ntasks // nodes)
    if most * nodes < ntasks:
        raise RefusedError(f"srun -n {ntasks} tasks do not fit on {nodes} node(s) of "
                           f"--ntasks-per-node {most}")
    parts, procid, left = [], 0, ntasks
    for node_id, node in enumerate(nodelist[:nodes]):  # SLURM_NODEID: its place in the step
        here = min(most, left)
        held = list(gpus.get(node, []))
        if gpus_per_task and here * gpus_per_task > len(held):
            raise RefusedError(f"srun: {here} task(s) of --gpus-per-task {gpus_per_task} need "
                               f"{here * gpus_per_task} GPUs on {node}; the job holds "
                               f"{len(held)} there")
        tasks = tuple(Task(procid + local, local,
                           tuple(held[local * gpus_per_task:(local + 1) * gpus_per_task])
                           if gpus_per_task else tuple(held))
                      for local in range(here))
        parts.append(NodePart(node, node_id, tasks))
        procid += here
        left -= here
    return parts


def to_wire(parts: list[NodePart]) -> list[dict[str, Any]]:
    """The layout as the step order carries it (every node gets all of it: the step's node
    list and task counts are in each task's environment)."""
    return [{"node": p.node, "node_id": p.node_id,
             "tasks": [[t.procid, t.localid, list(t.gpus)] for t in p.tasks]} for p in parts]


def from_wire(wire: list[dict[str, Any]]) -> list[NodePart]:
    """The inverse of to_wire; ValueError (or TypeError, KeyError) for a malformed one."""
    parts = []
    for p in wire:
        tasks = tuple(Task(int(procid), int(localid), tuple(int(g) for g in gpus))
                      for procid, localid, gpus in p["tasks"])
        parts.append(NodePart(str(p["node"]), int(p["node_id"]), tasks))
    return parts


def task_env(parts: list[NodePart], part: NodePart, task: Task, *, job_id: int, step_id: int,
             master_addr: str, cpus_per_task: int | None = None) -> dict[str, str]:
    """What Slurm sets for one task of a step (and torch's names for the same ranks), over the
    job's environment and srun's."""
    ntasks = sum(len(p.tasks) for p in parts)
    gpus = ",".join(str(g) for g in task.gpus)
    step = str(step_id)
    env = {
        "SLURM_STEP_ID": step, "SLURM_STEPID": step,
        "SLURM_PROCID": str(task.procid), "SLURM_LOCALID": str(task.localid),
        "SLURM_NODEID": str(part.node_id), "SLURM_NTASKS": str(ntasks),
        "SLURM_NPROCS": str(ntasks), "SLURM_STEP_NUM_TASKS": str(ntasks),
        "SLURM_STEP_NUM_NODES": str(len(parts)), "SLURM_NNODES": str(len(parts)),
        "SLURM_STEP_NODELIST": compress([p.node for p in parts]),
        "SLURM_STEP_TASKS_PER_NODE": counted([len(p.tasks) for p in parts]),
        "SLURM_TASKS_PER_NODE": counted([len(p.tasks) for p in parts]),
        "SLURM_GTIDS": ",".join(str(t.procid) for t in part.tasks),
        "SLURMD_NODENAME": part.node, "HOSTNAME": part.node,
        "RANK": str(task.procid), "LOCAL_RANK": str(task.localid), "WORLD_SIZE": str(ntasks),
        "LOCAL_WORLD_SIZE": str(len(part.tasks)), "NODE_RANK": str(part.node_id),
        "MASTER_ADDR": master_addr, "MASTER_PORT": str(20000 + job_id % 20000),
        "CUDA_VISIBLE_DEVICES": gpus,
    }
    if task.gpus:  # as Slurm's: only for a task with GPUs; ON_NODE: the step's on the node
        on_node = {g for t in part.tasks for g in t.gpus}
        env.update(GPU_DEVICE_ORDINAL=gpus, ROCR_VISIBLE_DEVICES=gpus, ZE_AFFINITY_MASK=gpus,
                   SLURM_STEP_GPUS=gpus, SLURM_GPUS_ON_NODE=str(len(on_node)))
    if cpus_per_task:
        env["SLURM_CPUS_PER_TASK"] = str(cpus_per_task)
    return env


def labelled_env() -> dict[str, str]:
    """What Slurm adds for the tasks of an `srun -l` step."""
    return {"SLURM_LABELIO": "1"}


def worst(codes: list[int | None]) -> int:
    """A step's exit code from its tasks' (None: killed by a signal, counted as 128+9 where
    not known), as Slurm's: the largest."""
    known = [137 if c is None else c for c in codes]
    return max(known, default=0)
