"""cgroup v2 (the unified hierarchy): directly, or through systemd's transient scopes.

Directly ("v2"): the run's cgroup `ROOT/NODE/job_J.R`, made by the shepherd, with
  memory.max       the limit; memory.swap.max 0 (no swap: the limit is all the job gets)
  cpuset.cpus      the run's CPUs (empty when it asked for none: the node's)
  pids.max         the limit
  devices          an eBPF program denying the node's other GPUs (gq.node.cgroups_bpf)
and read back: memory.peak (peak), cpu.stat usage_usec (CPU time), memory.events oom_kill.
gqnode enables the controllers (cgroup.subtree_control) from ROOT's parent down to NODE.

Through systemd ("systemd"): the job's command is run by `systemd-run --scope`, which puts it in
the transient scope `gq-NODE-job_J.R.scope` of the slice named after ROOT (gq.slice) with the
same limits as unit properties (MemoryMax, MemorySwapMax, AllowedCPUs, TasksMax, DeviceAllow)
and switches to the job's user. systemd owns that tree; gq only reads the scope's files, kills
through its cgroup.kill and asks systemd to stop it.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

from gq.node import cgroupfs as cg
from gq.node import cgroups_bpf
from gq.node.cgroupfs import CgroupConfigError, Hierarchy, Limits, SetupError, Usage

#: The controllers a v2 node must have for its limits to hold.
REQUIRED = ("memory", "cpuset", "pids")


def job_of(desc: dict[str, Any], limits: Limits) -> cg.JobCgroup:
    return (SystemdJob if desc.get("kind") == "systemd" else V2Job)(desc, limits)


class V2Backend:
    """gqnode's side of direct v2: the node's directory with the controllers enabled."""

    kind = "v2"

    def __init__(self, hierarchy: Hierarchy, cgroup_root: str, node: str) -> None:
        self.hierarchy = hierarchy
        self.base = hierarchy.base(cgroup_root)
        self.node_dir = posixpath.join(self.base, cg.node_part(node))
        self.home = hierarchy.dir(hierarchy.own)
        self.controllers = [c for c in cg.V2_CONTROLLERS if c in hierarchy.controllers]

    def describe(self) -> str:
        return f"cgroup v2 ({', '.join(self.controllers) or 'no controllers'}) under " \
            f"{self.node_dir}"

    def prepare(self) -> None:
        missing = [c for c in REQUIRED if c not in self.controllers]
        if missing:
            raise CgroupConfigError(
                f"[node] cgroups = 'v2': the cgroup v2 hierarchy at {self.hierarchy.mount} "
                f"lacks the {', '.join(missing)} controller(s) (bound to cgroup v1?); use "
                "cgroups = 'v1' or 'auto'")
        enable_down(self.hierarchy.mount, self.node_dir, self.controllers)

    def run(self, job_id: int, restart: int) -> dict[str, Any]:
        return {"kind": self.kind, "home": self.home,
                "dir": posixpath.join(self.node_dir, cg.run_name(job_id, restart)),
                "controllers": self.controllers}

    def runs(self) -> list[tuple[int, int]]:
        with contextlib.suppress(OSError):
            return sorted(k for k in map(cg.run_key, os.listdir(self.node_dir)) if k)
        return []

    def close(self) -> None:
        cg.rmdir_up(self.node_dir, self.base)


def enable_down(mount: str, node_dir: str, controllers: list[str]) -> None:
    """mkdir -p `node_dir`, and enable `controllers` for the children of each level from the
    one above gq's first directory down to `node_dir` (a level's own cgroup then has them too)."""
    parts = [p for p in posixpath.relpath(node_dir, mount).split("/") if p not in ("", ".")]
    levels = [mount] + [posixpath.join(mount, *parts[:i + 1]) for i in range(len(parts))]
    wanted = " ".join(f"+{c}" for c in controllers)
    for parent, here in zip(levels, levels[1:]):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(here)
            if wanted:
                enabled: list[str] = []
                with contextlib.suppress(FileNotFoundError):
                    enabled = cg.read(posixpath.join(parent, "cgroup.subtree_control")).split()
                if any(c not in enabled for c in controllers):
                    cg.write(posixpath.join(parent, "cgroup.subtree_control"), wanted)
        except OSError as exc:
            # EBUSY: the parent has processes of its own (cgroup v2 puts processes only in
            # leaves once controllers are enabled below them): give gq a root beside them.
            raise CgroupConfigError(f"cannot enable {wanted} in {parent}: {exc}; set [node] "
                                    "cgroup_root to a path outside gqnode's own cgroup") \
                from None
    if wanted:
        try:
            cg.write(posixpath.join(node_dir, "cgroup.subtree_control"), wanted)
        except OSError as exc:
            raise CgroupConfigError(f"cannot enable {wanted} in {node_dir}: {exc}") from None


class V2Job(cg.JobCgroup):
    """A run's cgroup in the unified hierarchy."""

    kind = "v2"
    tracks = True

    def __init__(self, desc: dict[str, Any], limits: Limits) -> None:
        super().__init__(limits)
        self.dir: str = desc["dir"]
        self.home: str = desc.get("home") or ""
        self.controllers = set(desc.get("controllers") or ())

    def create(self) -> None:
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.dir)
            for name, value in self.settings().items():
                cg.write(posixpath.join(self.dir, name), value)
            if self.limits.deny:
                attach_devices(self.dir, self.limits.deny)
        except OSError as exc:
            self.remove()
            raise SetupError(exc.errno, f"cannot set up the job's cgroup: {exc}") from None
        self.create_step()

    def create_step(self) -> None:
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(posixpath.join(self.dir, self.step))
        except OSError as exc:
            raise SetupError(exc.errno, f"cannot set up the job's {self.step} cgroup: {exc}") \
                from None

    def settings(self) -> dict[str, str]:
        """The files the run's limits are written to, and what each gets."""
        lim, out = self.limits, {}
        if "memory" in self.controllers and lim.mem:
            out.update({"memory.max": str(lim.mem), "memory.swap.max": "0"})
        if "cpuset" in self.controllers and lim.cpus:
            out["cpuset.cpus"] = cg.cpu_list(lim.cpus)
        if "pids" in self.controllers and lim.pids:
            out["pids.max"] = str(lim.pids)
        return out

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        me = str(os.getpid())
        try:
            cg.write(posixpath.join(self.dir, self.step, "cgroup.procs"), me)
        except OSError as exc:
            raise SetupError(exc.errno, f"cannot enter the job's cgroup: {exc}") from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                cg.write(posixpath.join(self.home, "cgroup.procs"), me)

    def pids(self) -> list[int]:
        return cg.procs(self.dir)

    def kill(self, timeout_s: float, reap: Callable[[], None]) -> bool:
        """cgroup.kill (Linux 5.14) kills the whole subtree at once, forks racing it included;
        before it, cgroup.freeze stops them for the kill."""
        kill_file = posixpath.join(self.dir, "cgroup.kill")
        if os.path.exists(kill_file):
            with contextlib.suppress(OSError):
                cg.write(kill_file, "1")
            return cg.kill_all(self.pids, timeout_s, reap)
        freeze = posixpath.join(self.dir, "cgroup.freeze")
        return cg.kill_all(self.pids, timeout_s, reap,
                           (lambda on: cg.write(freeze, "1" if on else "0"))
                           if os.path.exists(freeze) else None)

    def usage(self) -> Usage:
        usec = cg.read_keyed(posixpath.join(self.dir, "cpu.stat"), "usage_usec")
        return Usage(max_rss=cg.read_int(posixpath.join(self.dir, "memory.peak")),
                     cpu_s=None if usec is None else usec / 1e6,
                     oom_kills=cg.read_keyed(posixpath.join(self.dir, "memory.events"),
                                             "oom_kill") or 0)

    def remove(self) -> bool:
        return cg.remove_tree(self.dir)


def attach_devices(path: str, deny: tuple[tuple[int, int], ...]) -> None:
    cgroups_bpf.attach(path, deny)


# ---------------------------------------------------------------- through systemd


class SystemdBackend(V2Backend):
    """gqnode's side through systemd: scopes in a slice named after cgroup_root."""

    kind = "systemd"

    def __init__(self, hierarchy: Hierarchy, cgroup_root: str, node: str) -> None:
        super().__init__(hierarchy, cgroup_root, node)
        name = posixpath.basename(cgroup_root.rstrip("/")) or "gq"
        self.slice = unit_escape(name, dash=True) + ".slice"
        self.node = node
        # A slice directly under -.slice sits at the hierarchy's top as NAME.slice.
        self.slice_dir = hierarchy.dir("/" + self.slice)

    def describe(self) -> str:
        return f"systemd transient scopes in {self.slice}"

    def close(self) -> None:
        pass  # systemd's slice

    def prepare(self) -> None:
        if shutil.which("systemd-run") is None:
            raise CgroupConfigError("[node] cgroups = 'systemd': systemd-run is not on PATH")
        missing = [c for c in REQUIRED if c not in self.controllers]
        if missing:
            raise CgroupConfigError(f"[node] cgroups = 'systemd': the cgroup v2 hierarchy "
                                    f"lacks the {', '.join(missing)} controller(s)")

    def unit(self, job_id: int, restart: int) -> str:
        return f"gq-{unit_escape(self.node)}-{cg.run_name(job_id, restart)}.scope"

    def run(self, job_id: int, restart: int) -> dict[str, Any]:
        unit = self.unit(job_id, restart)
        return {"kind": self.kind, "unit": unit, "slice": self.slice,
                "dir": posixpath.join(self.slice_dir, unit), "devices": device_groups(),
                "mount": self.hierarchy.mount, "root": self.hierarchy.root}

    def runs(self) -> list[tuple[int, int]]:
        prefix, found = f"gq-{unit_escape(self.node)}-", []
        with contextlib.suppress(OSError):
            for name in os.listdir(self.slice_dir):
                if name.startswith(prefix) and name.endswith(".scope"):
                    key = cg.run_key(name[len(prefix):-len(".scope")])
                    if key:
                        found.append(key)
        return sorted(found)


class SystemdJob(V2Job):
    """A run in a transient scope that `systemd-run --scope` makes as it starts the job."""

    kind = "systemd"

    def __init__(self, desc: dict[str, Any], limits: Limits) -> None:
        super().__init__(desc, limits)
        self.unit: str = desc["unit"]
        self.slice: str = desc.get("slice") or "gq.slice"
        self.groups: list[list[Any]] = list(desc.get("devices") or ())
        self.hierarchy = Hierarchy(desc.get("mount") or "/sys/fs/cgroup", desc.get("root") or "/")

    def create(self) -> None:
        pass  # systemd makes the scope as the job starts

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """The batch step is the scope itself (systemd-run puts the job there); a later step
        is a child of the scope, whose subtree is delegated to us."""
        if self.step == cg.STEP_BATCH:
            yield
        else:
            with super().entered():
                yield

    def command(self, argv: list[str], uid: int, gid: int, switch: bool
                ) -> tuple[list[str], bool]:
        """systemd-run puts itself in the new scope, switches to the job's user (its groups
        too) and execs the job: the job's pid, session and environment are systemd-run's."""
        user = [f"--uid={uid}", f"--gid={gid}"] if switch else []
        props = [arg for prop in self.properties() for arg in ("-p", prop)]
        return ["systemd-run", "--scope", "--quiet", "--collect", f"--unit={self.unit}",
                f"--slice={self.slice}", *props, *user, "--", *argv], False

    def properties(self) -> list[str]:
        """The scope's unit properties for the run's limits."""
        lim = self.limits
        props = ["Delegate=yes", "CPUAccounting=yes", "MemoryAccounting=yes"]
        if lim.mem:
            props += [f"MemoryMax={lim.mem}", "MemorySwapMax=0"]
        if lim.cpus:
            props.append(f"AllowedCPUs={cg.cpu_list(lim.cpus)}")
        if lim.pids:
            props.append(f"TasksMax={lim.pids}")
        return props + self.device_properties()

    def device_properties(self) -> list[str]:
        """DeviceAllow is an allow-list, so the deny-list becomes: every device group of
        /proc/devices but those with a denied device in them, and of those majors only the
        devices allowed (the job's GPUs, the NVIDIA control devices)."""
        lim = self.limits
        if not lim.deny:
            return []
        denied = {major for major, _ in lim.deny}
        props = ["DevicePolicy=closed"]
        props += [f"DeviceAllow={kind}-{name} rwm" for kind, major, name in self.groups
                  if kind == "block" or major not in denied]
        props += [f"DeviceAllow=/dev/char/{major}:{minor} rw" for major, minor in lim.allow
                  if major in denied]
        return props

    def started(self, pid: int) -> None:
        """Where systemd really put the job: the slice may sit deeper than gq thought."""
        with contextlib.suppress(OSError):
            for line in cg.read(f"/proc/{pid}/cgroup").splitlines():
                if line.startswith("0::") and line.endswith("/" + self.unit):
                    self.dir = self.hierarchy.dir(line[3:])

    def remove(self) -> bool:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["systemctl", "stop", self.unit], stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30,
                           check=False)
        return not os.path.isdir(self.dir) or cg.remove_tree(self.dir)


def device_groups(text: str | None = None) -> list[list[Any]]:
    """[kind, major, name] of each group in /proc/devices (DeviceAllow names them
    `char-NAME`, `block-NAME`)."""
    if text is None:
        try:
            text = cg.read("/proc/devices")
        except OSError:
            return []
    groups, kind = [], ""
    for line in text.splitlines():
        if line.startswith("Character devices"):
            kind = "char"
        elif line.startswith("Block devices"):
            kind = "block"
        elif kind and (m := re.match(r"^\s*(\d+)\s+(\S+)$", line)):
            groups.append([kind, int(m[1]), m[2]])
    return groups


def unit_escape(text: str, dash: bool = False) -> str:
    """systemd-escape: what a unit name may not hold as \\xHH; `dash` too for a slice's name,
    where '-' means a parent slice."""
    keep = r"[^A-Za-z0-9:_.]" if dash else r"[^A-Za-z0-9:_.-]"
    return re.sub(keep, lambda m: "".join(f"\\x{b:02x}" for b in m[0].encode()), text)
