"""The SLURM_* environment Slurm 22.05 gives a batch job, as far as each variable means
something in gq (gq.1 ENVIRONMENT lists them all), made from a launch message.

Which variables a job gets follows Slurm: those for a request the job made only when it made it
(SLURM_NTASKS with -n or --ntasks-per-node, SLURM_CPUS_PER_TASK with -c, SLURM_GPUS with
--gpus, SLURM_MEM_PER_NODE with --mem ...), the others always. Values are Slurm's forms:
node lists in hostlist form (`node[1-4]`), per-node counts run-length coded (`16(x2)`),
memory in MiB. Pure, from the launch alone, so that the steps code can make a task's
environment from the same pieces (`batch_env` is the batch step's).
"""

from __future__ import annotations

from gq.hostlist import compress, counted
from gq.messages import Launch, RunSpec

MIB = 1024 * 1024


def tasks_per_node(spec: RunSpec, nodes: int) -> list[int]:
    """The job's tasks on each node, as Slurm's block layout puts them (`-n 3` on two nodes:
    2 and 1); a job that names no tasks has, as in Slurm, one a CPU (at least one)."""
    ntasks = spec.ntasks
    if not ntasks:
        return [max(1, spec.cpus or 1)] * nodes
    most = spec.ntasks_per_node or -(-ntasks // nodes)
    out, left = [], ntasks
    for _ in range(nodes):
        here = max(0, min(most, left))
        out.append(here)
        left -= here
    return out


def array_range(text: str) -> dict[str, str]:
    """SLURM_ARRAY_TASK_COUNT/MIN/MAX/STEP of an --array spec."""
    from gq.arrays import parse_array
    indices = parse_array(text).indices
    body = text.partition("%")[0].strip()
    step = body.rpartition(":")[2] if "," not in body and ":" in body else "1"
    return {"SLURM_ARRAY_TASK_COUNT": str(len(indices)), "SLURM_ARRAY_TASK_MIN": str(indices[0]),
            "SLURM_ARRAY_TASK_MAX": str(indices[-1]), "SLURM_ARRAY_TASK_STEP": step}


def _typed(spec: RunSpec, count: int) -> str:
    """A GPU count as given, with its type (`l40s:1`) when one was asked for."""
    return f"{spec.gpu_type}:{count}" if spec.gpu_type else str(count)


def batch_env(launch: Launch) -> dict[str, str]:
    """The SLURM_* variables (and Slurm's GPU and host ones) of the job's batch script on the
    launch's node."""
    spec, task = launch.spec, launch.job
    nodelist = list(launch.nodelist)
    rank, node = launch.rank, launch.nodelist[launch.rank]
    job_id, nodes = str(launch.job_id), len(nodelist)
    layout = tasks_per_node(spec, nodes)
    cpus_here = spec.cpus or layout[rank] or 1
    env = {
        "SLURM_JOB_ID": job_id, "SLURM_JOBID": job_id, "SLURM_JOB_NAME": spec.name,
        "SLURM_JOB_USER": spec.user or "", "SLURM_JOB_UID": str(spec.uid),
        "SLURM_JOB_GID": str(spec.gid), "SLURM_SUBMIT_DIR": spec.cwd,
        "SLURM_SUBMIT_HOST": spec.submit_host or "",
        "SLURM_JOB_PARTITION": (spec.partition or "").split(",")[0],
        "SLURM_JOB_QOS": spec.qos or "",
        "SLURM_JOB_ACCOUNT": spec.account or spec.user or "",
        "SLURM_CLUSTER_NAME": launch.cluster or "gq",
        "SLURM_JOB_NODELIST": compress(nodelist), "SLURM_NODELIST": compress(nodelist),
        "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_TASKS_PER_NODE": counted(layout),
        "SLURM_CPUS_ON_NODE": str(cpus_here),
        "SLURM_JOB_CPUS_PER_NODE": counted([spec.cpus or n or 1 for n in layout]),
        "SLURMD_NODENAME": node, "SLURM_TOPOLOGY_ADDR": node,
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node", "SLURM_NODEID": str(rank), "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0", "SLURM_GTIDS": "0", "SLURM_NODE_ALIASES": "(null)",
        "SLURM_PRIO_PROCESS": "0", "ENVIRONMENT": "BATCH", "HOSTNAME": node,
    }
    if launch.restart:
        # As Slurm: only a job that was requeued has it (the peer's first runs had none).
        env["SLURM_RESTART_COUNT"] = str(launch.restart)
    if spec.ntasks:
        env.update(SLURM_NTASKS=str(spec.ntasks), SLURM_NPROCS=str(spec.ntasks))
    for key, name in (("ntasks_per_node", "SLURM_NTASKS_PER_NODE"),
                      ("cpus_per_task", "SLURM_CPUS_PER_TASK"),
                      ("cpus_per_gpu", "SLURM_CPUS_PER_GPU")):
        value = getattr(spec, key)
        if value:
            env[name] = str(value)
    if spec.mem_per_cpu:
        env["SLURM_MEM_PER_CPU"] = str(spec.mem_per_cpu // MIB)
    elif spec.mem_per_gpu:
        env["SLURM_MEM_PER_GPU"] = str(spec.mem_per_gpu // MIB)
    elif spec.mem:
        env["SLURM_MEM_PER_NODE"] = str(spec.mem // MIB)
    gpus = ",".join(str(g) for g in launch.gpus)
    if gpus:
        env.update(SLURM_GPUS_ON_NODE=str(len(launch.gpus)), SLURM_JOB_GPUS=gpus,
                   GPU_DEVICE_ORDINAL=gpus, ROCR_VISIBLE_DEVICES=gpus, ZE_AFFINITY_MASK=gpus)
    if spec.gpus_total is not None:
        env["SLURM_GPUS"] = _typed(spec, spec.gpus_total)
    if spec.gpus_per_task is not None:
        env["SLURM_GPUS_PER_TASK"] = _typed(spec, spec.gpus_per_task)
    elif spec.gpus_total is None and spec.gpus:
        env["SLURM_GPUS_PER_NODE"] = _typed(spec, spec.gpus)
    if spec.open_mode:
        env["SLURM_OPEN_MODE"] = spec.open_mode[0]
    if task.array_job_id is not None:
        env.update(SLURM_ARRAY_JOB_ID=str(task.array_job_id),
                   SLURM_ARRAY_TASK_ID=str(task.array_index))
        if spec.array:
            env.update(array_range(spec.array))
    return env


def task_pid_argv(argv: list[str]) -> list[str]:
    """`argv` run so that SLURM_TASK_PID is its own pid: a shell that sets it and then
    execs the script in its place (same pid, same environment but that)."""
    return ["/bin/sh", "-c", 'SLURM_TASK_PID=$$; export SLURM_TASK_PID; exec "$0" "$@"',
            *argv]
