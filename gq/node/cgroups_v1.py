"""cgroup v1: a hierarchy per controller, each with the run's cgroup `ROOT/NODE/job_J.R`.

What a run's cgroup gets (at the job's level; its steps inherit it):
  memory   memory.limit_in_bytes and memory.memsw.limit_in_bytes both the limit, so memory and
           swap together never pass it (no swap beyond the limit); without swap accounting,
           memory.swappiness 0. OOM kills: `oom_kill` in memory.oom_control; peak:
           memory.max_usage_in_bytes.
  cpuset   cpuset.cpus the run's CPUs (the node's when it asked for none), cpuset.mems the node's.
  cpuacct  CPU time: cpuacct.usage.
  devices  `c MAJOR:MINOR rwm` into devices.deny for each of the node's other GPUs.
  pids     pids.max.
  freezer  frozen while the kill at its end runs, so no process forks one the kill misses.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from collections.abc import Callable, Iterator
from typing import Any

from gq.node import cgroupfs as cg
from gq.node.cgroupfs import CgroupConfigError, Hierarchy, Limits, SetupError, Usage

#: Where the members of a run are listed, in order of preference (the freezer's hierarchy
#: also stops them for the kill).
_TRACKERS = ("freezer", "pids", "memory", "cpuacct", "cpuset", "devices")
#: How long a freeze may take before the kill goes ahead without it, in seconds.
FREEZE_TIMEOUT_S = 1.0


class V1Backend:
    """gqnode's side: the node's directory in each hierarchy, and the run cgroups under it."""

    kind = "v1"

    def __init__(self, hierarchies: dict[str, Hierarchy], cgroup_root: str, node: str) -> None:
        if "memory" not in hierarchies:
            raise CgroupConfigError("[node] cgroups = 'v1': the memory controller of cgroup v1 "
                                    "is not mounted (see /proc/self/mountinfo)")
        self.hierarchies, self.cgroup_root = hierarchies, cgroup_root
        self.node_dirs = {name: posixpath.join(h.base(cgroup_root), cg.node_part(node))
                          for name, h in hierarchies.items()}
        #: gqnode's own cgroups, where a shepherd goes back to once its job has started.
        self.home = {name: h.dir(h.own) for name, h in hierarchies.items()}

    def describe(self) -> str:
        return f"cgroup v1 ({', '.join(sorted(self.hierarchies))}) under " + \
            self.node_dirs["memory"]

    def prepare(self) -> None:
        """Make the node's directories; cpuset ones need CPUs and memory nodes before any
        process may join a cgroup below them, so each level gets its parent's."""
        for name, path in self.node_dirs.items():
            try:
                _makedirs(path, self.hierarchies[name].mount, name == "cpuset")
            except OSError as exc:
                raise CgroupConfigError(f"cannot make gq's {name} cgroup {path}: {exc}") \
                    from None

    def run(self, job_id: int, restart: int) -> dict[str, Any]:
        """The run's cgroup for its launch file (JobCgroup's `desc`)."""
        name = cg.run_name(job_id, restart)
        return {"kind": self.kind, "home": self.home,
                "dirs": {c: posixpath.join(d, name) for c, d in self.node_dirs.items()}}

    def close(self) -> None:
        """gqnode stops: its directories go if no run is left in them (they come back at
        start)."""
        for name, path in self.node_dirs.items():
            cg.rmdir_up(path, self.hierarchies[name].base(self.cgroup_root))

    def runs(self) -> list[tuple[int, int]]:
        """(job id, restart) of every run cgroup under the node's directories."""
        keys = set()
        for path in self.node_dirs.values():
            with contextlib.suppress(OSError):
                keys |= {k for k in map(cg.run_key, os.listdir(path)) if k}
        return sorted(keys)


def _makedirs(path: str, mount: str, cpuset: bool) -> None:
    """mkdir -p below the mount point; for cpuset, each level's CPUs and memory nodes from its
    parent when it has none."""
    parts = posixpath.relpath(path, mount).split("/")
    here = mount
    for part in parts:
        if part in ("", "."):
            continue
        parent, here = here, posixpath.join(here, part)
        with contextlib.suppress(FileExistsError):
            os.mkdir(here)
        if cpuset:
            for key in ("cpuset.cpus", "cpuset.mems"):
                if not cg.read(posixpath.join(here, key)).strip():
                    cg.write(posixpath.join(here, key), cg.read(posixpath.join(parent, key)))


class V1Job(cg.JobCgroup):
    """A run's cgroup in every v1 hierarchy (the shepherd's, and gqnode's for leftovers)."""

    kind = "v1"
    tracks = True

    def __init__(self, desc: dict[str, Any], limits: Limits) -> None:
        super().__init__(limits)
        self.dirs: dict[str, str] = dict(desc["dirs"])
        self.home: dict[str, str] = dict(desc.get("home") or {})
        self._tracker = next((self.dirs[c] for c in _TRACKERS if c in self.dirs), None)

    def create(self) -> None:
        try:
            for name, path in self.dirs.items():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(path)
                self._limit(name, path)
        except OSError as exc:
            self.remove()
            raise SetupError(exc.errno, f"cannot set up the job's cgroup: {exc}") from None
        self.create_step()  # after the limits: a devices child copies its parent's list

    def create_step(self) -> None:
        try:
            for name, path in self.dirs.items():
                step = posixpath.join(path, self.step)
                with contextlib.suppress(FileExistsError):
                    os.mkdir(step)
                if name == "cpuset":
                    for key in ("cpuset.cpus", "cpuset.mems"):
                        cg.write(posixpath.join(step, key), cg.read(posixpath.join(path, key)))
        except OSError as exc:
            raise SetupError(exc.errno, f"cannot set up the job's {self.step} cgroup: {exc}") \
                from None

    def _limit(self, name: str, path: str) -> None:
        lim = self.limits
        if name == "memory" and lim.mem:
            cg.write(posixpath.join(path, "memory.limit_in_bytes"), str(lim.mem))
            memsw = posixpath.join(path, "memory.memsw.limit_in_bytes")
            if os.path.exists(memsw):
                cg.write(memsw, str(lim.mem))
            else:  # no swap accounting (swapaccount=0): keep the job out of swap at least
                with contextlib.suppress(OSError):
                    cg.write(posixpath.join(path, "memory.swappiness"), "0")
        elif name == "cpuset":
            parent = posixpath.dirname(path)
            cpus = cg.cpu_list(lim.cpus) if lim.cpus else cg.read(
                posixpath.join(parent, "cpuset.cpus"))
            cg.write(posixpath.join(path, "cpuset.cpus"), cpus)
            cg.write(posixpath.join(path, "cpuset.mems"),
                     cg.read(posixpath.join(parent, "cpuset.mems")))
        elif name == "devices":
            for major, minor in lim.deny:
                cg.write(posixpath.join(path, "devices.deny"), f"c {major}:{minor} rwm")
        elif name == "pids" and lim.pids:
            cg.write(posixpath.join(path, "pids.max"), str(lim.pids))

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        me = str(os.getpid())
        try:
            for path in self.dirs.values():
                cg.write(posixpath.join(path, self.step, "cgroup.procs"), me)
        except OSError as exc:
            self._leave(me)
            raise SetupError(exc.errno, f"cannot enter the job's cgroup: {exc}") from None
        try:
            yield
        finally:
            self._leave(me)

    def _leave(self, me: str) -> None:
        for name, path in self.home.items():
            if name in self.dirs:
                with contextlib.suppress(OSError):
                    cg.write(posixpath.join(path, "cgroup.procs"), me)

    def pids(self) -> list[int]:
        return cg.procs(self._tracker) if self._tracker else []

    def kill(self, timeout_s: float, reap: Callable[[], None]) -> bool:
        freezer = self.dirs.get("freezer")
        return cg.kill_all(self.pids, timeout_s, reap,
                           (lambda on: _freeze(freezer, on)) if freezer else None)

    def usage(self) -> Usage:
        mem, cpu = self.dirs.get("memory"), self.dirs.get("cpuacct")
        ns = cg.read_int(posixpath.join(cpu, "cpuacct.usage")) if cpu else None
        return Usage(
            max_rss=cg.read_int(posixpath.join(mem, "memory.max_usage_in_bytes")) if mem else None,
            cpu_s=None if ns is None else ns / 1e9,
            oom_kills=_oom_kills(mem) if mem else 0)

    def remove(self) -> bool:
        gone = True
        for path in self.dirs.values():
            gone = cg.remove_tree(path) and gone
        return gone


def _oom_kills(path: str) -> int:
    """OOM kills in the memory cgroup at `path` and below: v1 counts a kill only in the cgroup
    of the process killed (a step's), not in those above it."""
    return sum(cg.read_keyed(posixpath.join(top, "memory.oom_control"), "oom_kill") or 0
               for top, _, _ in os.walk(path))


def _freeze(path: str, on: bool) -> None:
    """Freeze (or thaw) the cgroup at `path`, waiting a little for the freeze to take."""
    state = posixpath.join(path, "freezer.state")
    with contextlib.suppress(OSError):
        cg.write(state, "FROZEN" if on else "THAWED")
        deadline = time.monotonic() + FREEZE_TIMEOUT_S
        while on and cg.read(state).strip() == "FREEZING" and time.monotonic() < deadline:
            cg.pause(cg.KILL_POLL_S)
