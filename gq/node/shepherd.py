"""The shepherd: one process per job run, outside gqnode's lifetime.

It starts the job in its own session with the contract's environment, sends the job's `--signal`
before its time limit, enforces the limit, passes on stops (a signal, grace, SIGKILL to the whole
process group), reaps it, kills what is left of its session (the job's orphans are reparented
to the shepherd, so it knows when nothing is), and writes the final status durably and
atomically into the run's directory. gqnode forks it (no new interpreter per job) and reads that
status; a restarted gqnode re-adopts it.

Signals gqnode sends the shepherd: SIGTERM stop gracefully, as the run's stop order says
(`order_stop`); SIGUSR1 kill at once.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import json
import math
import os
import pwd
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from gq.errors import GqError
from gq.fsutil import write_atomic
from gq.messages import Launch, RunSpec
from gq.model import JobSignal, JobState, parse_signal
from gq.node import cgroupfs as cg
from gq.node.isolation import RunIsolation, SetupError
# The run directory's files, named here too (gqnode and the tests use them as shepherd.X).
from gq.node.runfiles import (  # noqa: F401
    JOB_PID_FILE, LAUNCH_FILE, LOG_FILE, PID_FILE, RECORD_FILE, STATUS_FILE, STOP_FILE,
    RunOrder, open_ours, order_stop, read_order, read_pid, read_record, read_status, read_trusted,
    record)
from gq.node import lease, procstat, slurmenv, stepdirs
from gq.slurm import shims

_WATCHED = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
#: When nothing else is due, the shepherd still wakes this often (seconds) to re-check its child.
_IDLE_WAKE_S = 60.0
_PR_SET_CHILD_SUBREAPER = 36
#: Longest note kept in a status (gqd keeps as much), and how often a status that found the disk
#: full is tried again, in seconds.
_MAX_NOTE, _STATUS_RETRY_S = 1000, 1.0
#: What a job's other nodes run instead of its batch script, which runs on the first node only
#: (Slurm's): a process that holds the allocation (its cgroup, its time limit) for the steps
#: srun starts there, until the job ends and gqd stops it (TERM, KILL). The signals a job is
#: sent to act on (`gq cancel --signal`, `--signal`) are for its script and tasks: ignored.
HOLDER_ARGV = ["/bin/sh", "-c", "trap '' HUP INT QUIT USR1 USR2 ALRM PIPE; exec sleep 2147483647"]


def _libc_prctl() -> Any:
    """prctl(2), looked up once in gqnode: importing ctypes costs tens of ms, too much for every
    shepherd. None where there is none."""
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).prctl
    except (ImportError, OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()


def spawn(run_dir: Path) -> int:
    """Fork a shepherd for the run in `run_dir`; returns its pid (in gqnode)."""
    pid = fork_blocked(_WATCHED)
    if pid:
        return pid
    # gqnode's objects are shared copy-on-write with it: a full collection walking them would
    # copy most of its memory (~9 ms of CPU, measured). Frozen, no collection walks them.
    gc.freeze()
    code = 1
    try:
        _detach(run_dir)
        code = run(run_dir)
    except BaseException:  # noqa: BLE001  (told, then os._exit: gqnode requeues the run)
        # os._exit would drop the traceback: the run's log keeps it for whoever asks why.
        traceback.print_exc()
    finally:
        os._exit(code)  # never return into gqnode's code in the child


def fork_blocked(signals: set[signal.Signals]) -> int:
    """os.fork() with `signals` blocked in the child from its first instruction (the parent's
    mask is restored at once). A stop gqnode sends the moment after the fork then waits,
    pending, for the child's own handling: unblocked, it ran gqnode's handler copied into the
    child (and was lost: a job cancelled as it was launched ran on) or, after _detach, killed
    the child outright."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        raise
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return pid


def _detach(run_dir: Path) -> None:
    """Leave gqnode behind: own session, no inherited sockets or locks, default signals."""
    os.setsid()
    os.umask(0o022)  # the job's files: the owner's to write, not gqnode's umask's
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    # gqnode's zmq sockets and its pid-file lock must not live on in us.
    os.closerange(3, 65536)
    # The log is created only when there is something to say (a file a job otherwise; the job's
    # output goes to its own files). What only C would write to fd 2 is lost.
    sys.stdout = sys.stderr = _LazyLog(run_dir / LOG_FILE)


class _LazyLog(io.TextIOBase):
    """A text stream that opens its file at the first write (ours only, see _open_ours)."""

    def __init__(self, path: Path):
        self.path = path
        self.file: Any = None

    def write(self, text: str) -> int:
        if self.file is None:
            try:
                fd = open_ours(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            except OSError:
                return len(text)  # nowhere to write it: dropped, as on a full disk
            self.file = open(fd, "w", buffering=1)  # noqa: SIM115
        return int(self.file.write(text))

    def flush(self) -> None:
        if self.file is not None:
            self.file.flush()


def run(run_dir: Path) -> int:
    order = read_order(run_dir)
    launch = order.launch
    signal.pthread_sigmask(signal.SIG_BLOCK, _WATCHED)
    adopter = _adopt_orphans()
    started = time.time()  # for the status (a date); the limit counts from `began`
    began = time.monotonic()
    jail = RunIsolation(order.isolation)  # its cgroup and private /tmp (gq.node.isolation)
    try:
        proc = _start(run_dir, order, jail)
    except OSError as exc:
        jail.finish(lambda: _reap_orphans(0))
        if isinstance(exc, SetupError):  # the node's fault: requeued, and the node drained
            _write_status(run_dir, JobState.NODE_FAIL, None, started, note=str(exc),
                          setup_error=True)
            return 0
        # The note reaches `gq show` as the job's reason; the error file may be what failed.
        _note(launch, f"gq: job could not start: {exc}")
        _write_status(run_dir, JobState.FAILED, 127 if isinstance(exc, FileNotFoundError) else 126,
                      started, note=str(exc))
        return 0
    jail.started(proc.pid)
    with contextlib.suppress(OSError):
        # No fsync: the job's processes do not outlive a host crash either.
        record(run_dir, "job", f"{proc.pid} {procstat.create_time(proc.pid)}")
    state, code = _supervise(proc, launch, began, run_dir, jail)
    if not jail.tracks and (not adopter or _children() != []):
        # Something of the job may be left; as the adopter of its orphans, having no children
        # proves that nothing is, which saves scanning every process on the host (most jobs).
        # (A job's cgroup holds all of its processes: `finish` kills them.)
        _kill_session(proc.pid)
    usage = jail.finish(lambda: _reap_orphans(proc.pid))
    state, note = jail.outcome(state, usage)
    if state == JobState.NODE_FAIL and not note:  # only the head lease ends a job so here
        note = lease.LAPSED
    _write_status(run_dir, state, code, started, note=note, usage=usage)
    return 0


def _adopt_orphans() -> bool:
    """Become the child subreaper of the job: its processes whose parent dies are reparented to
    the shepherd rather than to init, so they are all our descendants. True if that worked."""
    return _PRCTL is not None and _PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _children() -> list[int] | None:
    """Our child processes (ended ones not yet reaped too); None if the kernel does not say."""
    pid = os.getpid()
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return None


def _reap_orphans(job_pid: int) -> None:
    """Reap the ended orphans of the job that came to us (the job itself is Popen's to reap)."""
    for pid in _children() or ():
        if pid != job_pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _start(run_dir: Path, order: RunOrder, jail: RunIsolation) -> subprocess.Popen[bytes]:
    launch = order.launch
    spec = launch.spec
    uid, gid, switch = owner(spec)
    jail.prepare(uid, gid)
    script = run_dir / "script"
    write_atomic(script, spec.script.encode(), mode=0o700, durable=False)  # run at once
    if switch:
        os.chown(script, uid, gid)
        os.chown(run_dir, uid, gid)
    env = job_env(order, str(shims.ensure(run_dir.parent.parent / "slurm-bin")))
    # --open-mode: append, truncate; else truncate the first run's files, append a requeue's.
    mode = spec.open_mode
    append = mode == "append" or (mode is None and launch.restart > 0)
    holder = launch.rank > 0
    with _as_user(uid, gid, switch):
        os.makedirs(env["GQ_CHECKPOINT_DIR"], exist_ok=True)
        if holder:  # it writes nothing, and must not truncate the job's files
            out = err = os.open(os.devnull, os.O_WRONLY)
        else:
            out = _open_output(launch.stdout, append=append)
            err = out if launch.stderr == launch.stdout else \
                _open_output(launch.stderr, append=append)
    command = HOLDER_ARGV if holder else [str(script), *spec.args]
    # The command may be wrapped (systemd-run, which then switches to the user itself).
    argv, popen_switch = jail.command(slurmenv.task_pid_argv(command), uid, gid, switch)
    try:
        with _signals_unblocked(), jail.spawning():
            return subprocess.Popen(
                argv, cwd=spec.cwd, env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                user=uid if popen_switch else None, group=gid if popen_switch else None,
                extra_groups=_groups(uid, gid) if popen_switch else None, close_fds=True)
    finally:
        os.close(out)
        if err != out:
            os.close(err)


def owner(spec: RunSpec) -> tuple[int, int, bool]:
    """The uid and gid a job (and its steps) runs as, and whether we switch to them."""
    uid, gid = spec.uid, spec.gid
    if os.geteuid() != 0 and uid != os.geteuid():
        # Only root can become the job's owner; running it as gqnode's user instead would be
        # running someone's job as someone else.
        raise PermissionError(f"gqnode runs as uid {os.geteuid()}, not root, and cannot run a "
                              f"job of uid {uid}")
    return uid, gid, os.geteuid() == 0 and uid != 0


@contextlib.contextmanager
def _signals_unblocked() -> Iterator[None]:
    """No signal blocked while the job is started, so that it starts with none blocked.

    The job inherits our signal mask. Clearing it in a preexec_fn would run Python in the child
    and rule out vfork: ~3 ms of CPU a job. Instead the signals _supervise waits for are caught
    while unblocked here, and raised again once they are blocked, for it to see.
    """
    caught: list[int] = []
    handlers = {sig: signal.signal(sig, lambda signum, _: caught.append(signum))
                for sig in _WATCHED}
    mask = signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)  # runs the handler of any signal still pending first
        for signum in caught:
            os.kill(os.getpid(), signum)


def _open_output(path: str, append: bool) -> int:
    """The job's file, truncated unless `append`, and written at its end either way: the
    tasks of its steps append to it from every node, and the script's own writes must not
    land over theirs (at an offset of its own)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if append else os.O_TRUNC)
    return os.open(path, flags, 0o644)


@contextlib.contextmanager
def _as_user(uid: int, gid: int, switch: bool) -> Iterator[None]:
    """Open files with the job owner's rights, so root never writes where the user cannot."""
    if not switch:
        yield
        return
    groups = os.getgroups()
    os.setgroups(_groups(uid, gid))
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(groups)


def _groups(uid: int, gid: int) -> list[int]:
    try:
        return os.getgrouplist(pwd.getpwuid(uid).pw_name, gid)
    except KeyError:
        return [gid]


def job_env(order: RunOrder, slurm_bin: str | None = None) -> dict[str, str]:
    """The job's environment: what --export kept, the passwd basics, the contract's GQ_* and
    Slurm's SLURM_* (gq/node/slurmenv.py); `slurm_bin` (gq's sbatch, squeue ...) first on
    PATH."""
    launch = order.launch
    spec, task = launch.spec, launch.job
    env = dict(spec.env or {})
    try:
        pw = pwd.getpwuid(spec.uid)
        # Who the job runs as, from the passwd entry, whatever the submitter's shell had.
        env.update(USER=pw.pw_name, LOGNAME=pw.pw_name)
        # HOME and SHELL are where the job looks for its files and what runs its commands, not
        # who it is: those it was submitted with (--export), as Slurm keeps them (a site's or a
        # test's HOME, a login shell's ~/.bash_profile); the passwd entry's when none came
        # (--export=NONE, gq api).
        env.setdefault("HOME", pw.pw_dir)
        env.setdefault("SHELL", pw.pw_shell or "/bin/sh")
    except KeyError:
        pass
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    if slurm_bin:
        env["PATH"] = f"{slurm_bin}:{env['PATH']}"
        # `#!/bin/bash -l` resets PATH in /etc/profile; bash then sources BASH_ENV, which puts
        # the commands back (the job's own BASH_ENV, Lmod's say, is sourced from it).
        hook = shims.bash_env(Path(slurm_bin))
        if env.get("BASH_ENV") and not env["BASH_ENV"].endswith(hook.name):  # not a gq job's
            env["GQ_BASH_ENV"] = env["BASH_ENV"]
        env["BASH_ENV"] = str(hook)
    gpus = ",".join(str(g) for g in launch.gpus)
    nodelist = launch.nodelist
    job_id = str(launch.job_id)
    ours = {
        "GQ_JOB_ID": job_id, "GQ_JOB_NAME": spec.name,
        "GQ_NODELIST": ",".join(nodelist), "GQ_NODE_RANK": str(launch.rank),
        "GQ_NUM_NODES": str(len(nodelist)), "GQ_GPUS": gpus,
        # NVML numbers GPUs in PCI bus order; make CUDA agree so the indices mean the same GPUs.
        "CUDA_VISIBLE_DEVICES": gpus, "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GQ_CHECKPOINT_DIR": launch.checkpoint_dir or os.path.join(
            env["HOME"] if "HOME" in env else spec.cwd, ".gq", "checkpoints", job_id),
        "GQ_RESTART_COUNT": str(launch.restart), "GQ_SUBMIT_DIR": spec.cwd,
        # Slurm's names too, so existing batch scripts keep working.
        **slurmenv.batch_env(launch),
    }
    if task.array_job_id is not None:
        ours.update(GQ_ARRAY_JOB_ID=str(task.array_job_id),
                    GQ_ARRAY_TASK_ID=str(task.array_index))
    if order.cache_warm is not None:  # model affinity: whether its --cache-key was warm here
        ours["GQ_CACHE_WARM"] = "1" if order.cache_warm else "0"
    if order.relay:
        # gq (and the Slurm commands) inside the job reach gqd through this node's relay.
        ours["GQ_ENDPOINT"] = order.relay
    if len(nodelist) > 1:
        ours.update(MASTER_ADDR=launch.master_addr or nodelist[0],
                    MASTER_PORT=str(20000 + launch.job_id % 20000),
                    WORLD_SIZE=str(len(nodelist)), NODE_RANK=str(launch.rank))
    env.update(ours)
    return env


def _supervise(proc: subprocess.Popen[bytes], launch: Launch, started: float,
               run_dir: Path, jail: RunIsolation) -> tuple[JobState, int]:
    """Wait for the job, sending its --signal, enforcing its time limit and passing on stops;
    (state, exit code). `started` and every timer are time.monotonic(): a step of the wall clock
    (NTP, an admin's `date -s`) moves no limit or grace time. The shepherd holds them for the
    whole run, also while a restarted gqnode adopts it."""
    limit = launch.time_limit_s
    grace = float(launch.grace_s)
    deadline = started + limit if limit else None
    warning = _job_signal(launch) if deadline is not None else None
    # sbatch --signal: once, lead_s before the limit (at the start when the limit is shorter).
    warn_at = max(started, deadline - warning.lead_s) if warning and deadline else None
    ending: JobState | None = None  # why we are stopping it, once we are
    kill_at: float | None = None
    while (rc := proc.poll()) is None:
        now = time.monotonic()
        # [node] head_lease_s: gqnode renews it; past its end (gqnode dead or cut off from
        # gqd), the job stops as for a cancel and ends NODE_FAIL, for gqd to requeue.
        lease_end = lease.lease_end(run_dir.parent.parent)
        if ending is None and now >= lease_end:
            ending, kill_at = JobState.NODE_FAIL, now + grace
            stepdirs.stop_run(run_dir.parent.parent, launch.job_id, launch.restart)
            _signal_group(proc.pid, signal.SIGTERM, jail)
        if warning and warn_at is not None and ending is None and now >= warn_at:
            _deliver(proc.pid, warning.number, warning.batch_only, jail)
            if not warning.batch_only:  # the tasks of its steps on this node too
                stepdirs.signal_run(run_dir.parent.parent, launch.job_id, launch.restart,
                                    warning.name)
            warn_at = None
        if deadline is not None and ending is None and now >= deadline:
            ending, kill_at = JobState.TIMEOUT, now + grace
            # Its steps first (they end stopped, as for a cancel), then the job's processes.
            stepdirs.stop_run(run_dir.parent.parent, launch.job_id, launch.restart)
            _signal_group(proc.pid, signal.SIGTERM, jail)
        if kill_at is not None and now >= kill_at:
            _signal_group(proc.pid, signal.SIGKILL, jail)
            kill_at = None
        timers = (warn_at, deadline, lease_end) if ending is None else ()
        wake = [t for t in (*timers, kill_at) if t is not None and t < math.inf]
        timeout = max(0.0, min(wake) - now) if wake else _IDLE_WAKE_S
        info = signal.sigtimedwait(_WATCHED, timeout)
        if info is None:
            continue
        if info.si_signo == signal.SIGCHLD:
            _reap_orphans(proc.pid)
            continue
        if info.si_signo == signal.SIGUSR1:
            ending = ending or JobState.CANCELLED
            _signal_group(proc.pid, signal.SIGKILL, jail)
        elif ending is None:  # SIGTERM / SIGINT: a cancel, a preemption or `cancel --signal`
            stop = _stop_order(run_dir, grace)
            if not stop.no_kill:
                ending, kill_at = JobState.CANCELLED, time.monotonic() + stop.grace_s
            _deliver(proc.pid, stop.signum, stop.batch_only, jail)
    code = rc if rc >= 0 else 128 - rc
    if ending is not None:
        return ending, code
    return (JobState.COMPLETED if rc == 0 else JobState.FAILED), code


def _job_signal(launch: Launch) -> JobSignal | None:
    text = launch.spec.signal
    try:
        return parse_signal(text) if text else None
    except GqError as exc:  # the head checked it at submit; a bad one must not end supervision
        print(f"gq shepherd: ignoring the job's --signal: {exc}", file=sys.stderr)
        return None


@dataclass(frozen=True)
class _Stop:
    """How to stop the job gracefully: `signum` (to the group, or only the script with
    `batch_only`), then SIGKILL to the group after `grace_s`."""

    signum: int
    batch_only: bool
    grace_s: float
    #: `gq cancel --signal`: only the signal; the job goes on.
    no_kill: bool = False


def _stop_order(run_dir: Path, default_grace: float) -> _Stop:
    """The stop order gqnode wrote; without one (or with a bad one), SIGTERM to the group and the
    launch's grace, as for a cancel."""
    default = _Stop(signal.SIGTERM, False, default_grace)
    try:
        order = json.loads(read_trusted(run_dir / STOP_FILE))
        grace = order.get("grace_s")
        stop = _Stop(parse_signal(order["signal"]).number, bool(order.get("batch_only")),
                     default_grace if grace is None else max(0.0, float(grace)),
                     no_kill=order.get("no_kill") is True)
        if stop.no_kill:
            # Used once: a later SIGTERM without a fresh order must stop the job, not signal it.
            with contextlib.suppress(OSError):
                (run_dir / STOP_FILE).unlink()
        return stop
    except FileNotFoundError:
        return default
    except (OSError, ValueError, TypeError, KeyError, AttributeError, GqError) as exc:
        print(f"gq shepherd: bad stop order ({exc!r}); sending SIGTERM", file=sys.stderr)
        return default


def _deliver(pid: int, signum: int, batch_only: bool, jail: RunIsolation) -> None:
    """Signal the job: its whole process group, or (`B:`) only its top process, the script."""
    if batch_only:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    else:
        _signal_group(pid, signum, jail)


def _signal_group(pgid: int, sig: int, jail: RunIsolation) -> None:
    """The job's process group, and every other process in its cgroup (those that left it)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    jail.signal(sig)


def kill_orphaned_job(run_dir: Path) -> bool:
    """The shepherd of `run_dir` died without a status: kill its job's session if it is still
    there (gqnode, which cannot supervise it any more). True if something was killed."""
    pid, started = read_pid(run_dir, "job", JOB_PID_FILE)
    if pid <= 0:
        # Killed between starting the job and recording its pid (a window of microseconds):
        # the job's first process is known by the environment it was started with.
        pid = _job_by_environment(run_dir)
        if pid > 0:
            _kill_session(pid)
        return pid > 0
    try:
        if abs(procstat.create_time(pid) - started) >= 1.0:
            return False  # that pid is another process now, which may lead a session of its own
    except (FileNotFoundError, ProcessLookupError):
        pass  # the job's first process is gone; what is left in its session is still the job's
    except OSError:
        return False
    _kill_session(pid)
    return True


def _job_by_environment(run_dir: Path) -> int:
    """The pid of the session leader started with this run's GQ_JOB_ID, GQ_RESTART_COUNT and
    GQ_NODE_RANK (unique on a host, also with several gqnode identities on it), else 0. Reads
    every process's environment: only for a shepherd that died before recording its job."""
    try:
        launch = msgpack.unpackb((run_dir / LAUNCH_FILE).read_bytes(), raw=False)
        marks = [f"\0{key}={launch[field]}\0".encode() for key, field in (
            ("GQ_JOB_ID", "job_id"), ("GQ_RESTART_COUNT", "restart"), ("GQ_NODE_RANK", "rank"))]
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except (OSError, ValueError, KeyError, TypeError):  # msgpack.UnpackException is a ValueError
        return 0
    for pid in pids:
        with contextlib.suppress(OSError):
            if os.getsid(pid) != pid:
                continue  # the job's first process leads its own session
            with open(f"/proc/{pid}/environ", "rb") as f:
                environment = b"\0" + f.read()  # NUL-separated, ending with one
            if all(mark in environment for mark in marks):
                return pid
    return 0


def _kill_session(sid: int) -> None:
    """Kill whatever the job left behind in its session (background children, grandchildren).

    This scans every process on the host, so it reads /proc with bare syscalls (psutil's
    objects cost ~60 us a process, 90 ms a job on a host with 1,500). The kernel keeps a session's id from being reused while
    the session has members; a member that exits between its check and its kill leaves its pid
    free for reuse only after a whole pid wrap-around in those microseconds (psutil's
    is_running check had the same window)."""
    me = os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(OSError):
            if pid != me and os.getsid(pid) == sid:
                os.kill(pid, signal.SIGKILL)


def _note(launch: Launch, text: str) -> None:
    """Tell the job's owner why it did not start, in its error file (only as that owner)."""
    if os.geteuid() != launch.spec.uid:
        return  # root would write where the user may not; the status note says it instead
    with contextlib.suppress(OSError):
        with open(launch.stderr, "a") as f:
            f.write(text + "\n")


def _write_status(run_dir: Path, state: JobState, code: int | None, started: float,
                  note: str = "", usage: Any = None, setup_error: bool = False) -> None:
    """The run's only result: on a full disk (past what gqnode reserved for the record, see
    gq.node.disk), the shepherd waits for space rather than end without it, a lost run."""
    status = {"state": state.value, "exit_code": code, "start_time": started,
              "end_time": time.time(), "note": note[:_MAX_NOTE]}
    if usage is not None:  # a gq.node.cgroups.Usage: what the run used (MaxRSS, TotalCPU)
        status.update(max_rss=usage.max_rss, cpu_s=usage.cpu_s)
    if setup_error:
        status["setup_error"] = True
    while True:
        try:
            return record(run_dir, "status", json.dumps(status), durable=True)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            cg.pause(_STATUS_RETRY_S)


if __name__ == "__main__":  # debugging aid: run one shepherd in the foreground
    sys.exit(run(Path(sys.argv[1])))
