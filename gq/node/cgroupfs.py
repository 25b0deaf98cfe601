"""What every cgroup backend shares (gq.node.cgroups chooses among them): a run's limits and
usage, reading and writing control files, killing and removing a cgroup, the base JobCgroup
(also the "off" one), and where the host's hierarchies are mounted."""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import posixpath
import re
import resource
import select
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gq.errors import GqError

#: The cgroup of a run under its node's, and of its batch script under the run's.
JOB_DIR_RE = re.compile(r"^job_(\d+)\.(\d+)$")
STEP_BATCH = "step_batch"
STEP_RE = re.compile(r"^step_[A-Za-z0-9_]{1,64}$")
#: How often a kill re-checks that the cgroup emptied, in seconds.
KILL_POLL_S = 0.01


class SetupError(OSError):
    """The node cannot confine a job (a cgroup it cannot make, a mount that fails): a node
    fault, not the job's, so the run ends NODE_FAIL and the node is drained."""


class CgroupConfigError(GqError):
    """The configured backend cannot work on this host; gqnode refuses to start."""


@dataclass(frozen=True)
class Limits:
    """What a run is confined to. Computed once by gqnode (gq.node.isolation.limits) and
    carried in its launch file, so every backend enforces the same values."""

    #: Bytes of memory, swap included (the job gets no swap beyond it); None: no limit.
    mem: int | None = None
    #: The job's CPUs (its cpuset); empty: all the node's.
    cpus: tuple[int, ...] = ()
    #: Most processes and threads at once; None: no limit.
    pids: int | None = None
    #: Character devices (major, minor) the job may not open: the node's other GPUs.
    deny: tuple[tuple[int, int], ...] = ()
    #: Character devices the job may open under a device allow-list (systemd's DeviceAllow):
    #: its own GPUs and the NVIDIA control devices.
    allow: tuple[tuple[int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"mem": self.mem, "cpus": list(self.cpus), "pids": self.pids,
                "deny": [list(d) for d in self.deny], "allow": [list(d) for d in self.allow]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Limits:
        return cls(mem=data.get("mem"), cpus=tuple(data.get("cpus") or ()),
                   pids=data.get("pids"),
                   deny=tuple((int(a), int(b)) for a, b in data.get("deny") or ()),
                   allow=tuple((int(a), int(b)) for a, b in data.get("allow") or ()))


@dataclass(frozen=True)
class Usage:
    """What a run used: Slurm's MaxRSS and TotalCPU, and the kernel's OOM kills in it."""

    #: Peak memory in bytes (what the limit counts: RSS and page cache); None: unknown.
    max_rss: int | None = None
    #: CPU seconds, user and system, of all its processes; None: unknown.
    cpu_s: float | None = None
    oom_kills: int = 0


def cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """`0,2,5` as cpuset.cpus takes it."""
    return ",".join(str(c) for c in cpus)


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """cpuset.cpus' `0-3,8` form as CPU numbers."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.extend(range(int(low), int(high or low) + 1))
    return tuple(cpus)


# ---------------------------------------------------------------- files of a cgroup


def write(path: str, text: str) -> None:
    """One write(2) of `text` (a cgroup file takes a value a write)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def read_keyed(path: str, key: str) -> int | None:
    """The value of `key` in a flat keyed file (`oom_kill 3` lines); None if it has none."""
    with contextlib.suppress(OSError, ValueError):
        for line in read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return None


def read_int(path: str) -> int | None:
    try:
        return int(read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return None


def procs(path: str) -> list[int]:
    """The processes in the cgroup at `path` and in all its descendants (cgroup.procs lists
    only a cgroup's own)."""
    found: list[int] = []
    for top, dirs, _ in os.walk(path):
        with contextlib.suppress(OSError, ValueError):
            found += [int(p) for p in read(posixpath.join(top, "cgroup.procs")).split()]
        dirs.sort()
    return found


def pause(seconds: float) -> None:
    """Wait `seconds`, for the daemons and shepherds: a select with no descriptors, not
    time.sleep. Python's time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which the
    libfaketime of the clock-step test breaks (EINVAL, libfaketime issue 426): a shepherd died of
    it mid-kill, its job requeued. A relative timeout waits the same under any clock."""
    select.select([], [], [], seconds)


def remove_tree(path: str, timeout_s: float = 1.0) -> bool:
    """rmdir the cgroup at `path`, its children first; True if it is gone. A cgroup whose last
    process was just killed may stay busy (EBUSY) for a moment after cgroup.procs reads empty,
    while the kernel finishes its exit: that is retried for up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not os.path.isdir(path):
            return True
        gone = True
        for top, dirs, _ in os.walk(path, topdown=False):
            for name in dirs:
                gone = _rmdir(posixpath.join(top, name)) and gone
        if _rmdir(path) and gone:
            return True
        if time.monotonic() > deadline:
            return False
        pause(KILL_POLL_S)


def rmdir_up(path: str, top: str) -> None:
    """rmdir `path` and its parents up to `top` (included) while they are empty."""
    here = posixpath.normpath(path)
    top = posixpath.normpath(top)
    while here == top or here.startswith(top + "/"):
        if not _rmdir(here):
            return
        here = posixpath.dirname(here)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            return False
    return True


def kill_all(members: Callable[[], list[int]], timeout_s: float, reap: Callable[[], None],
             freeze: Callable[[bool], None] | None = None) -> bool:
    """SIGKILL every process `members` lists until it lists none or `timeout_s` passes; True if
    none is left. `freeze` (a freezer) stops them first, so none forks a process the kill misses;
    `reap` reaps those that were our children (our orphans among them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pids = members()
        if not pids:
            return True
        if freeze:
            freeze(True)
        for pid in members() if freeze else pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if freeze:
            freeze(False)  # a frozen process dies of its SIGKILL once thawed
        reap()
        if time.monotonic() > deadline:
            return not members()
        pause(KILL_POLL_S)


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


# ---------------------------------------------------------------- a run's cgroup


class JobCgroup:
    """A run's cgroup, as the shepherd and gqnode use it; this base class confines nothing
    ("off"): usage then comes from getrusage, and the shepherd kills the job's session."""

    kind = "off"
    #: Holds every process of the job, so that killing it kills them all.
    tracks = False
    #: The child of the run's cgroup that what is started inside `entered` goes to.
    step = STEP_BATCH

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()

    def create(self) -> None:
        """Make the cgroup with the run's limits, and its batch step (SetupError if the node
        cannot)."""

    def for_step(self, name: str) -> JobCgroup:
        """This run's cgroup entered at its step `name` (`step_0` ...: a sibling of the batch
        step, under the job's limits, for the job steps `srun` starts); `create_step` makes
        it. The job's kill and usage cover its steps."""
        if not STEP_RE.match(name):
            raise ValueError(f"bad step name {name!r}")
        other = copy.copy(self)
        other.step = name
        return other

    def create_step(self) -> None:
        """Make the step's cgroup in the run's (SetupError if the node cannot)."""

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Inside, the calling process is in the run's batch step, so what it starts is."""
        yield

    def command(self, argv: list[str], uid: int, gid: int, switch: bool
                ) -> tuple[list[str], bool]:
        """The command line that starts the job, and whether Popen is to switch to the job's
        user (False when the command line does it)."""
        return argv, switch

    def started(self, pid: int) -> None:
        """The job's first process `pid` runs."""

    def pids(self) -> list[int]:
        return []

    def signal(self, sig: int) -> None:
        """Send `sig` to every process in the cgroup."""
        signal_all(self.pids(), sig)

    def kill(self, timeout_s: float, reap: Callable[[], None]) -> bool:
        """SIGKILL every process in the cgroup; True once none is left."""
        return True

    def usage(self) -> Usage:
        """What the run used. Without a cgroup: getrusage of the shepherd's children, which
        are all the job's processes that ended (as the child subreaper, the shepherd reaps the
        orphans too): their CPU time, and the largest one's peak RSS (a lower bound)."""
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return Usage(max_rss=ru.ru_maxrss * 1024 or None, cpu_s=ru.ru_utime + ru.ru_stime)

    def remove(self) -> bool:
        """Remove the cgroup (empty by now); True if it is gone."""
        return True


Unconfined = JobCgroup


# ---------------------------------------------------------------- where the hierarchies are


@dataclass(frozen=True)
class Hierarchy:
    """One mounted cgroup hierarchy: where, and this process's cgroup in it."""

    #: Mount point.
    mount: str
    #: The cgroup path the mount shows at its mount point (not "/" inside some containers).
    root: str = "/"
    #: This process's cgroup path.
    own: str = "/"
    controllers: frozenset[str] = field(default_factory=frozenset)

    def dir(self, path: str) -> str:
        """The directory of the cgroup `path` (absolute in the hierarchy)."""
        rel = posixpath.relpath(path, self.root) if self.root != "/" else path.lstrip("/")
        return posixpath.normpath(posixpath.join(self.mount, rel))

    def base(self, cgroup_root: str) -> str:
        """gq's subtree: `cgroup_root` if absolute, else under this process's own cgroup."""
        path = cgroup_root if cgroup_root.startswith("/") else posixpath.join(self.own,
                                                                              cgroup_root)
        return self.dir(path)


def _unescape(text: str) -> str:
    """mountinfo's octal escapes (`\\040` is a space)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), text)


def hierarchies(mountinfo: str, cgroup: str) -> tuple[dict[str, Hierarchy], Hierarchy | None]:
    """(controller -> its v1 hierarchy, the v2 hierarchy or None) from the texts of
    /proc/self/mountinfo and /proc/self/cgroup."""
    own_v1: dict[str, str] = {}
    own_v2 = "/"
    for line in cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            own_v2 = parts[2]
        for name in parts[1].split(","):
            own_v1[name] = parts[2]
    v1: dict[str, Hierarchy] = {}
    v2: Hierarchy | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or len(fields) < 5:
            continue
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        root, mount = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2" and v2 is None:
            v2 = Hierarchy(mount, root, own_v2)
        elif fstype == "cgroup":
            names = [o for o in options if o in V1_CONTROLLERS]
            for name in names:
                v1.setdefault(name, Hierarchy(mount, root, own_v1.get(name, "/"),
                                              frozenset(names)))
    if v2 is not None:
        with contextlib.suppress(OSError):
            v2 = Hierarchy(v2.mount, v2.root, v2.own,
                           frozenset(read(posixpath.join(v2.mount, "cgroup.controllers")).split()))
    return v1, v2


#: The v1 controllers gq uses: limits (memory, cpuset, devices, pids), usage (cpuacct) and
#: the freezer (so a kill misses no process forked meanwhile).
V1_CONTROLLERS = ("memory", "cpuset", "cpuacct", "devices", "freezer", "pids")
#: The v2 controllers gq enables for jobs (cpu for cpu.stat's usage under it, cpuset, memory,
#: pids); devices are an eBPF program, not a controller.
V2_CONTROLLERS = ("cpu", "cpuset", "memory", "pids")


def host_hierarchies() -> tuple[dict[str, Hierarchy], Hierarchy | None]:
    try:
        return hierarchies(read("/proc/self/mountinfo"), read("/proc/self/cgroup"))
    except OSError:
        return {}, None


def node_part(name: str) -> str:
    """A node name as one path component (names are host names; anything else is escaped)."""
    return re.sub(r"[^A-Za-z0-9._-]", lambda m: f"_{ord(m[0]):02x}", name).lstrip(".") or "_"


def run_name(job_id: int, restart: int) -> str:
    return f"job_{job_id}.{restart}"


def run_key(name: str) -> tuple[int, int] | None:
    m = JOB_DIR_RE.match(name)
    return (int(m[1]), int(m[2])) if m else None


def under_systemd() -> bool:
    """systemd manages this host (its runtime directory exists only when it is PID 1)."""
    return os.path.isdir("/run/systemd/system")
