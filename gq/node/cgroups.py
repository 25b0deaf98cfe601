"""Job cgroups (Slurm's proctrack, task and jobacct_gather cgroup plugins): the interface every
backend has, what they share, and the choice among them.

A run's cgroup is `ROOT/NODE/job_J.R` in each hierarchy (ROOT: `[node] cgroup_root`), its batch
script in the child `step_batch`, so that the job steps still to come (`srun` inside a job) are
siblings with their own child cgroups under the job's limits. The limits are set on the job's
cgroup; the job's usage is read from it (it counts its children).

Who does what: gqnode picks the backend and prepares `ROOT/NODE` (gq.node.isolation); the
shepherd creates the run's cgroup, starts the job in it, kills everything in it at the end,
reads its usage and removes it; gqnode kills and removes what a dead shepherd left behind.
The backends: gq.node.cgroups_v1 (one hierarchy a controller), gq.node.cgroups_v2 (the unified
hierarchy, directly or through systemd's transient scopes), and `Unconfined` here ("off").
"""

from __future__ import annotations

import os
from typing import Any

from gq.config import CGROUP_KINDS as KINDS  # noqa: F401  (`[node] cgroups` values)
# What the backends share lives in gq.node.cgroupfs (which they import, so that this module may
# import them); it is named here too, for gqnode, the shepherd and the tests.
from gq.node.cgroupfs import (  # noqa: F401
    CgroupConfigError, Hierarchy, JOB_DIR_RE, JobCgroup, KILL_POLL_S, Limits, STEP_BATCH, STEP_RE,
    SetupError, Unconfined, Usage, V1_CONTROLLERS, V2_CONTROLLERS, cpu_list, hierarchies,
    host_hierarchies, kill_all, node_part, parse_cpu_list, procs, read, read_int, read_keyed,
    remove_tree, rmdir_up, run_key, run_name, signal_all, under_systemd, write,
)


def job_cgroup(desc: dict[str, Any] | None, limits: Limits) -> JobCgroup:
    """The run's cgroup its launch describes (`desc` from a backend's `describe`)."""
    if not desc:
        return Unconfined(limits)
    kind = desc.get("kind")
    if kind == "v1":
        from gq.node.cgroups_v1 import V1Job
        return V1Job(desc, limits)
    if kind in ("v2", "systemd"):
        from gq.node.cgroups_v2 import job_of
        return job_of(desc, limits)
    return Unconfined(limits)


def open_backend(kind: str, cgroup_root: str, node: str) -> Any:
    """The backend `[node] cgroups` names ("auto": what this host has), for gqnode; None for
    "off". CgroupConfigError if the one named cannot work here."""
    if kind == "off":
        return None
    v1, v2 = host_hierarchies()
    if kind == "auto":
        kind = _auto(v1, v2)
        if kind == "off":
            return None
    if kind == "v1":
        from gq.node.cgroups_v1 import V1Backend
        return V1Backend(v1, cgroup_root, node)
    from gq.node.cgroups_v2 import SystemdBackend, V2Backend
    if v2 is None:
        raise CgroupConfigError(f"[node] cgroups = {kind!r}: no cgroup v2 hierarchy is mounted")
    return (SystemdBackend if kind == "systemd" else V2Backend)(v2, cgroup_root, node)


def _auto(v1: dict[str, Hierarchy], v2: Hierarchy | None) -> str:
    """cgroup v2 where its memory controller is there (through systemd where systemd runs the
    host: it owns the tree), else v1 where its memory controller is mounted, else none; and
    none unless we are root (only root may make cgroups for other users' jobs)."""
    if os.geteuid() != 0:
        return "off"
    if v2 is not None and "memory" in v2.controllers:
        return "systemd" if under_systemd() else "v2"
    if "memory" in v1:
        return "v1"
    return "off"
