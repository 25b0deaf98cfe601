"""What the isolation tests need from the host, checked once: root, and cgroup hierarchies gq
can write (v1 here; v2's unified hierarchy for the parts of the v2 backend it can run)."""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import subprocess
from pathlib import Path

import pytest

from gq.node import cgroups as cg


def _writable(h: cg.Hierarchy, what: str) -> str:
    """Why a cgroup cannot be made under our own in `h` ("" if it can)."""
    probe = h.base(f"gq-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        return f"cannot make a cgroup in the {what} hierarchy ({probe}): {exc}"
    return ""


@functools.lru_cache(maxsize=1)
def _v1_problem() -> str:
    if os.geteuid() != 0:
        return "needs root to make cgroups"
    v1, _ = cg.host_hierarchies()
    missing = [c for c in cg.V1_CONTROLLERS if c not in v1]
    if missing:
        return f"cgroup v1 controllers not mounted: {', '.join(missing)}"
    return next(filter(None, (_writable(h, name) for name, h in v1.items())), "")


@functools.lru_cache(maxsize=1)
def _v2_problem() -> str:
    if os.geteuid() != 0:
        return "needs root to make cgroups"
    _, v2 = cg.host_hierarchies()
    return _writable(v2, "cgroup v2") if v2 is not None else "no cgroup v2 hierarchy mounted"


needs_v1 = pytest.mark.skipif(bool(_v1_problem()), reason=_v1_problem() or "cgroup v1")
needs_v2 = pytest.mark.skipif(bool(_v2_problem()), reason=_v2_problem() or "cgroup v2")


def nvidia_driver() -> bool:
    """A real NVIDIA driver owns major 195 (an allowed open then succeeds, not ENXIO)."""
    with contextlib.suppress(OSError):
        return any(line.split()[:1] == ["195"] for line in Path("/proc/devices").read_text()
                   .split("Block devices")[0].splitlines())
    return False


def fake_gpu_nodes(directory: Path, count: int) -> Path:
    """DIR/nvidia0.. as character devices 195:N (no driver behind them here)."""
    directory.mkdir(parents=True, exist_ok=True)
    for n in range(count):
        subprocess.run(["mknod", str(directory / f"nvidia{n}"), "c", "195", str(n)], check=True)
    return directory


def run_cgroup(cgroup_root: str, node: str, job_id: int, restart: int = 0) -> dict[str, str]:
    """Controller -> the directory of a run's v1 cgroup, for a gqnode in our own cgroups (the
    test's clusters are started by the test's process)."""
    v1, _ = cg.host_hierarchies()
    return {name: posixpath.join(h.base(cgroup_root), cg.node_part(node),
                                 cg.run_name(job_id, restart)) for name, h in v1.items()}
