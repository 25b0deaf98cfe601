"""The step shepherd: one process per job step on a node (forked by gqnode, as the run's
shepherd is, gq/node/shepherd.py). It starts the node's tasks of the step as the job's user,
in the job's cgroup (its child `step_S`, under the job's limits) with each task's environment
(gq.steps.task_env over srun's and this node's), their output appended to the step's files;
waits for them, ends the rest when one fails under --kill-on-bad-exit or when gqnode says
(SIGTERM: TERM, then KILL after the grace; SIGUSR1: KILL at once), and writes the worst exit
code into its directory's status file for gqnode to report.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

from gq import steps as layout_mod
from gq.fsutil import write_atomic
from gq.messages import Step
from gq.node import labels, shepherd, slurmenv
from gq.node.isolation import RunIsolation
from gq.node.runfiles import RunOrder
from gq.node.runfiles import read_order as read_run_order

ORDER_FILE = "step.msg"
STATUS_FILE = "status.json"
_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
#: What each node's batch environment says for itself, not for the node srun ran on.
NODE_KEYS = ("GQ_NODE_RANK", "GQ_GPUS", "GQ_ENDPOINT", "SLURM_JOB_GPUS", "SLURM_CPUS_ON_NODE",
             "SLURM_TOPOLOGY_ADDR", "SLURM_RESTART_COUNT")


def spawn(step_dir: Path, run_dir: Path) -> int:
    """Fork a step shepherd for the order in `step_dir` of the run in `run_dir` (in gqnode)."""
    pid = shepherd.fork_blocked(_WATCHED)
    if pid:
        return pid
    gc.freeze()  # as the run's shepherd: no collection copies gqnode's memory
    code = 1
    try:
        shepherd._detach(step_dir)
        code = run(step_dir, run_dir)
    finally:
        os._exit(code)


def write_order(step_dir: Path, order: Step, node: str) -> None:
    """The step's order for its shepherd: the Step gqd sent (its wire fields) and this node's
    name, which picks its part of the layout; gqnode's user's only (srun's environment)."""
    with open(os.open(step_dir / ORDER_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
              "wb") as f:
        f.write(msgpack.packb({**order.wire(), "node": node}, use_bin_type=True))


def read_order(step_dir: Path) -> tuple[Step, str]:
    """The order gqnode wrote (write_order): the Step and this node's name."""
    data = msgpack.unpackb((step_dir / ORDER_FILE).read_bytes(), raw=False)
    return Step.from_wire(data), str(data["node"])


def read_status(step_dir: Path) -> dict[str, Any] | None:
    try:
        status = json.loads((step_dir / STATUS_FILE).read_text())
        return status if isinstance(status, dict) else None
    except (OSError, ValueError):
        return None


def run(step_dir: Path, run_dir: Path) -> int:
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    try:
        order, node = read_order(step_dir)
        procs, copiers = _start(order, node, read_run_order(run_dir))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"gq step shepherd: cannot start the step's tasks: {exc}", file=sys.stderr)
        _write(step_dir, [127 if isinstance(exc, FileNotFoundError) else 126], str(exc))
        return 0
    codes, first_bad, stopped = _supervise(procs, order, step_dir)
    labels.finish(copiers)
    _write(step_dir, codes, "", first_bad, stopped)
    return 0


def _write(step_dir: Path, codes: list[int], note: str, first_bad: int | None = None,
           stopped: bool = False) -> None:
    """The node's status of the step: the worst exit code of its tasks, or under
    --kill-on-bad-exit the one that failed first (the others' are our SIGTERM's); `stopped`:
    gqnode ended them (a cancel, the job's end, a failure elsewhere under -K)."""
    status = {"exit_code": layout_mod.worst(list(codes)) if first_bad is None else first_bad,
              "codes": codes, "note": note[:1000], "end_time": time.time(),
              "stopped": stopped}
    write_atomic(step_dir / STATUS_FILE, json.dumps(status).encode(), mode=0o600, durable=False)


def _start(order: Step, node: str, run: RunOrder
           ) -> tuple[list[subprocess.Popen[bytes]], list[int]]:
    """The node's tasks, started; and the pids of their output's label copiers (srun -l)."""
    uid, gid, switch = shepherd.owner(run.launch.spec)
    parts = layout_mod.from_wire(list(order.layout))
    mine = next(p for p in parts if p.node == node)
    jail = RunIsolation(run.isolation)
    if jail.tracks:  # the step's own cgroup, a sibling of the batch script's
        jail.cgroup = jail.cgroup.for_step(f"step_{order.step}")
        jail.cgroup.create_step()
    batch = shepherd.job_env(run)
    env = {**order.env, **{k: batch[k] for k in NODE_KEYS if k in batch}}
    procs: list[subprocess.Popen[bytes]] = []
    copiers: list[int] = []
    ntasks = sum(len(p.tasks) for p in parts)
    try:
        for task in mine.tasks:
            task_env = {**env, **layout_mod.task_env(
                parts, mine, task, job_id=order.job_id, step_id=order.step,
                master_addr=order.master_addr or parts[0].node,
                cpus_per_task=order.cpus_per_task),
                **(layout_mod.labelled_env() if order.label else {})}
            with shepherd._as_user(uid, gid, switch):
                out = _open(order.stdout, task.procid, mine.node_id)
                err = out if order.stderr == order.stdout else \
                    _open(order.stderr, task.procid, mine.node_id)
            if order.label:  # the task writes to pipes, copied with its id before lines
                out, err = _labelled(out, err, labels.prefix(task.procid, ntasks), copiers)
            # Started directly, never through the backend's `command` (systemd-run would make
            # the job's scope anew): `spawning` puts the task in the step's cgroup.
            argv, popen_switch = slurmenv.task_pid_argv(list(order.argv)), switch
            try:
                with shepherd._signals_unblocked(), jail.spawning():
                    procs.append(subprocess.Popen(
                        argv, cwd=order.cwd, env=task_env, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=err, start_new_session=True,
                        user=uid if popen_switch else None, group=gid if popen_switch else None,
                        extra_groups=shepherd._groups(uid, gid) if popen_switch else None,
                        close_fds=True))
            finally:
                os.close(out)
                if err != out:
                    os.close(err)
    except BaseException:
        # A task that cannot start (its output file, its command) fails the step: the ones
        # started already must not run on with no shepherd watching them.
        _signal(procs, {}, signal.SIGKILL)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        raise
    return procs, copiers


def _labelled(out: int, err: int, label: bytes, copiers: list[int]) -> tuple[int, int]:
    """The pipes a labelled task writes its output and errors to (one, when they share a
    file), each with its copier; the files' own descriptors are the copiers' now."""
    pipe_out, pid = labels.start(out, label)
    copiers.append(pid)
    pipe_err = pipe_out
    if err != out:
        pipe_err, pid = labels.start(err, label)
        copiers.append(pid)
        os.close(err)
    os.close(out)
    return pipe_out, pipe_err


def _open(pattern: str, procid: int, node_id: int) -> int:
    """A task's output file, appended to: many tasks on many nodes share the job's (or the
    step's) file, and none may truncate what another wrote. %t: the task, %n: its node."""
    path = pattern.replace("%t", str(procid)).replace("%n", str(node_id))
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _supervise(procs: list[subprocess.Popen[bytes]], order: Step, step_dir: Path
               ) -> tuple[list[int], int | None, bool]:
    """Wait for every task; their exit codes (128 + the signal for one killed), and under
    --kill-on-bad-exit the first failing one's (None: none failed, or no -K). gqnode's
    SIGTERM passes on its stop order (a signal, then KILL after a grace, or the signal
    alone); SIGUSR1 kills at once. Last, whether gqnode stopped them so."""
    grace = float(order.grace_s)
    codes: dict[int, int] = {}
    kill_at: float | None = None
    stopping, first_bad, stopped = False, None, False
    while len(codes) < len(procs):
        for i, proc in enumerate(procs):
            if i not in codes and (rc := proc.poll()) is not None:
                codes[i] = rc if rc >= 0 else 128 - rc
                if rc != 0 and order.kill_on_bad_exit and not stopping:
                    stopping, kill_at = True, time.monotonic() + grace
                    first_bad = codes[i]
                    _signal(procs, codes, signal.SIGTERM)
        if len(codes) == len(procs):
            break
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            _signal(procs, codes, signal.SIGKILL)
            kill_at = None
        timeout = max(0.0, kill_at - now) if kill_at is not None else 60.0
        info = signal.sigtimedwait(_WATCHED, timeout)
        if info is None or info.si_signo == signal.SIGCHLD:
            continue
        if info.si_signo == signal.SIGUSR1:
            stopped = True
            _signal(procs, codes, signal.SIGKILL)
        elif not stopping:
            stop = shepherd._stop_order(step_dir, grace)
            if not stop.no_kill:
                stopping, stopped, kill_at = True, True, time.monotonic() + stop.grace_s
            _signal(procs, codes, stop.signum)
    # A stop that came as the tasks were ending (the job's own stop reaches them in its cgroup
    # too) still makes them stopped.
    stopped = stopped or bool(signal.sigpending() & {signal.SIGTERM, signal.SIGUSR1})
    return [codes[i] for i in range(len(procs))], first_bad, stopped


def _signal(procs: list[subprocess.Popen[bytes]], done: dict[int, int], sig: int) -> None:
    """Each task still running: its whole process group (a task's own children too)."""
    for i, proc in enumerate(procs):
        if i not in done:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)
