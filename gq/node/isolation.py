"""What confines each run: gqnode's decisions (`NodeIsolation`: the backend, each run's limits,
CPUs and device rules, its private /tmp) and the shepherd's use of them (`RunIsolation`).

gqnode writes its decisions into the run's launch file (key "isolation"), so that the shepherd,
and a restarted gqnode re-adopting the run, read the same ones: the CPUs a run holds are known
again after a restart, and what a dead shepherd left is found and killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from gq import defaults
from gq.messages import Launch, RunSpec
from gq.model import Gpu, JobState, format_size
from gq.node import cgroups as cg
from gq.node import privatetmp
from gq.node.cgroups import Limits, SetupError, Usage

log = logging.getLogger("gq.node.isolation")

#: The NVIDIA driver's character major, and its control devices' minors (nvidiactl,
#: nvidia-modeset), which every GPU job needs; nvidia-uvm and nvidia-caps have majors of their own.
NVIDIA_MAJOR = 195
NVIDIA_CONTROL_FILES = ("nvidiactl", "nvidia-modeset")
NVIDIA_CONTROL_MINORS = (255, 254)
#: A GPU's device file in the device directory: nvidiaMINOR.
GPU_FILE = "nvidia{}"
TMP_DIR = "tmp"
LAUNCH_KEY = "isolation"

__all__ = ["NodeIsolation", "RunIsolation", "SetupError", "job_memory"]


def job_memory(spec: RunSpec, node_mem: int) -> int | None:
    """A job's memory limit in bytes: its --mem, else all the node offers to jobs (`[node]
    mem`). The one place it is computed, so that --mem-per-cpu and --mem-per-gpu plug in here."""
    return int(spec.mem or 0) or node_mem or None


def gpu_devices(gpus: list[Gpu], minors: dict[int, int], dev_dir: str
                ) -> dict[int, tuple[int, int]]:
    """GPU index -> (major, minor) of its device file DEV_DIR/nvidiaM, M its minor number
    (NVML's; a fake GPU's is its index): read from the file, else (195, M)."""
    out = {}
    for gpu in gpus:
        minor = minors.get(gpu.index, gpu.index)
        out[gpu.index] = _char_device(os.path.join(dev_dir, GPU_FILE.format(minor))) or (
            NVIDIA_MAJOR, minor)
    return out


def _char_device(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else None


def gpu_files(dev_dir: str) -> set[tuple[int, int]]:
    """The devices of every DEV_DIR/nvidiaN file (N digits): GPUs, found or not by NVML."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir(dev_dir):
            if name.startswith("nvidia") and name[6:].isdigit():
                device = _char_device(os.path.join(dev_dir, name))
                if device:
                    found.add(device)
    return found


class NodeIsolation:
    """gqnode's side. `backend` None: no cgroups ("off")."""

    def __init__(self, backend: Any, state_dir: Path, *, cpus: list[int] | None = None,
                 mem: int = 0, pids_max: int = 0, devices: dict[int, tuple[int, int]] | None = None,
                 other_gpus: set[tuple[int, int]] | None = None, private_tmp: bool = False,
                 control: tuple[tuple[int, int], ...] = ()) -> None:
        self.backend = backend
        self.tmp_dir = state_dir / TMP_DIR
        self.cpus = list(cpus or [])
        self.mem, self.pids_max, self.private_tmp = mem, pids_max, private_tmp
        self.devices = dict(devices or {})
        self.all_gpus = set(self.devices.values()) | set(other_gpus or ())
        self.control = control or tuple((NVIDIA_MAJOR, m) for m in NVIDIA_CONTROL_MINORS)
        #: Run -> the CPUs its cpuset holds.
        self.taken: dict[tuple[int, int], tuple[int, ...]] = {}

    @classmethod
    def configured(cls, node_cfg: Any, name: str, state_dir: Path, gpus: list[Gpu],
                   minors: dict[int, int], cpus: int, mem: int,
                   kind: str | None = None) -> NodeIsolation:
        """As `[node]` says, or with the backend `kind` (CgroupConfigError if the backend
        cannot work here)."""
        kind = kind or node_cfg.cgroups
        backend = cg.open_backend(kind, node_cfg.cgroup_root, name)
        if backend is not None:
            try:
                backend.prepare()
            except cg.CgroupConfigError as exc:
                if kind != "auto":
                    raise
                # "auto" takes what works (a container's cgroup v2 may not delegate).
                log.warning("%s", exc)
                backend = None
        if backend is not None:
            log.info("jobs are confined in %s", backend.describe())
        elif kind != "off":
            log.warning("no cgroups gq can use on this host (cgroups = %r): jobs are not "
                        "confined", kind)
        if node_cfg.private_tmp and _under(state_dir, privatetmp.TMP):
            # The job would not see its own run directory (its script) under its /tmp.
            raise cg.CgroupConfigError(f"[node] private_tmp needs gqnode's state directory "
                                       f"outside {privatetmp.TMP}, not {state_dir}")
        dev_dir = node_cfg.dev_dir
        host_cpus = sorted(os.sched_getaffinity(0))
        return cls(backend, state_dir, cpus=host_cpus[:cpus] if cpus else host_cpus, mem=mem,
                   pids_max=node_cfg.job_pids_max, devices=gpu_devices(gpus, minors, dev_dir),
                   other_gpus=gpu_files(dev_dir), private_tmp=node_cfg.private_tmp,
                   control=tuple(_char_device(os.path.join(dev_dir, f)) or (NVIDIA_MAJOR, m)
                                 for f, m in zip(NVIDIA_CONTROL_FILES, NVIDIA_CONTROL_MINORS)))

    def close(self, runs_live: bool = False) -> None:
        """gqnode stops: the node's cgroup directories go, unless a run is live (its shepherd
        makes its own cgroup in them, perhaps only after this)."""
        if self.backend is not None and not runs_live:
            self.backend.close()

    # ------------------------------------------------------------ launches

    def plan(self, launch: Launch) -> dict[str, Any]:
        """The run's isolation for its launch file; the CPUs it gets are taken."""
        key = (launch.job_id, launch.restart)
        own = {self.devices[i] for i in launch.gpus if i in self.devices}
        limits = Limits(mem=job_memory(launch.spec, self.mem),
                        cpus=self._take_cpus(key, int(launch.spec.cpus or 0)),
                        pids=self.pids_max or None, deny=tuple(sorted(self.all_gpus - own)),
                        allow=tuple(sorted(own | set(self.control))))
        return {"limits": limits.to_dict(),
                "cgroup": self.backend.run(*key) if self.backend else None,
                "tmp": str(self.tmp_dir / f"{key[0]}.{key[1]}") if self.private_tmp else None}

    def _take_cpus(self, key: tuple[int, int], count: int) -> tuple[int, ...]:
        """`count` CPUs for a run: the free ones first (lowest numbered), then those the
        fewest other runs share; none (all the node's) when it asked for none."""
        if count <= 0 or self.backend is None or not self.cpus:
            return ()
        used = Counter(c for cpus in self.taken.values() for c in cpus)
        chosen = tuple(sorted(sorted(self.cpus, key=lambda c: (used[c], c))[:count]))
        self.taken[key] = chosen
        return chosen

    def adopted(self, key: tuple[int, int], run_dir: Path) -> None:
        """A live run found at start-up holds the CPUs its launch file says."""
        cpus = (_plan_of(run_dir).get("limits") or {}).get("cpus")
        if cpus:
            self.taken[key] = tuple(cpus)

    def forget(self, key: tuple[int, int]) -> None:
        self.taken.pop(key, None)

    def ended(self, key: tuple[int, int], run_dir: Path, shepherd_died: bool
              ) -> tuple[Usage | None, bool]:
        """The run's shepherd is gone: its CPUs are free. One that died without a status left
        the job's cgroup (and /tmp) behind: everything in it is killed and it is removed.
        (What the run used, None when unknown or its shepherd said; whether any process of
        it was left to kill.)"""
        self.forget(key)
        if not shepherd_died:
            return None, False
        run = RunIsolation(_plan_of(run_dir))
        if not run.tracks:  # nothing to read what it used from (our getrusage is gqnode's)
            if run.tmp:
                privatetmp.remove(run.tmp)
            return None, False
        left = bool(run.cgroup.pids())
        return run.finish(lambda: None, defaults.CGROUP_KILL_NODE_S), left

    def sweep(self, live: set[tuple[int, int]]) -> None:
        """At start-up: kill and remove the cgroups and private /tmp directories of runs that
        are not live (their shepherds died, or could not clean up)."""
        if self.backend is not None:
            for key in self.backend.runs():
                if key not in live:
                    run = cg.job_cgroup(self.backend.run(*key), Limits())
                    run.kill(defaults.CGROUP_KILL_NODE_S, lambda: None)
                    if run.remove():
                        log.info("removed the leftover cgroup of job %d run %d", *key)
                    else:
                        log.warning("cannot remove the leftover cgroup of job %d run %d", *key)
        with contextlib.suppress(OSError):
            for entry in self.tmp_dir.iterdir():
                parts = entry.name.split(".")
                if len(parts) == 2 and all(p.isdigit() for p in parts) and \
                        (int(parts[0]), int(parts[1])) not in live:
                    privatetmp.remove(str(entry))


def _under(path: Path, top: str) -> bool:
    real = os.path.realpath(path)
    return real == top or real.startswith(top.rstrip("/") + "/")


def _plan_of(run_dir: Path) -> dict[str, Any]:
    """The isolation a run's launch file holds ({} for none, or a run of an older gqnode)."""
    from gq.node.runfiles import LAUNCH_FILE
    try:
        launch = msgpack.unpackb((run_dir / LAUNCH_FILE).read_bytes(), raw=False)
        return dict(launch.get(LAUNCH_KEY) or {})
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


class RunIsolation:
    """The shepherd's side: one run's cgroup and private /tmp."""

    def __init__(self, plan: dict[str, Any] | None) -> None:
        plan = plan or {}
        self.limits = Limits.from_dict(plan.get("limits") or {})
        self.cgroup = cg.job_cgroup(plan.get("cgroup"), self.limits)
        self.tmp: str | None = plan.get("tmp")

    @property
    def tracks(self) -> bool:
        """Every process of the job is in its cgroup (else the shepherd kills its session)."""
        return self.cgroup.tracks

    def prepare(self, uid: int, gid: int) -> None:
        """Make the run's cgroup and /tmp (SetupError: the node cannot)."""
        self.cgroup.create()
        if self.tmp:
            privatetmp.make(self.tmp, uid, gid)

    @contextlib.contextmanager
    def spawning(self) -> Iterator[None]:
        """What is started inside is in the run's cgroup (and sees its /tmp)."""
        with self.cgroup.entered():
            if self.tmp:
                with privatetmp.entered(self.tmp):
                    yield
            else:
                yield

    def command(self, argv: list[str], uid: int, gid: int, switch: bool
                ) -> tuple[list[str], bool]:
        return self.cgroup.command(argv, uid, gid, switch)

    def started(self, pid: int) -> None:
        self.cgroup.started(pid)

    def signal(self, sig: int) -> None:
        self.cgroup.signal(sig)

    def finish(self, reap: Callable[[], None],
               timeout_s: float = defaults.CGROUP_KILL_TIMEOUT_S) -> Usage:
        """The job has ended: kill what is left of it (waiting up to `timeout_s` for it to go),
        read what it used, remove its cgroup and /tmp."""
        emptied = self.cgroup.kill(timeout_s, reap)
        usage = self.cgroup.usage()
        if not emptied:
            print(f"gq: processes of the job outlived SIGKILL for {timeout_s:.0f}s; its cgroup "
                  "is left (gqnode removes it when it next starts)", file=sys.stderr)
        elif not self.cgroup.remove():
            print("gq: cannot remove the job's cgroup", file=sys.stderr)
        if self.tmp:
            privatetmp.remove(self.tmp)
        return usage

    def outcome(self, state: JobState, usage: Usage) -> tuple[JobState, str]:
        """A job that the kernel's OOM killer hit ends OUT_OF_MEMORY (as in Slurm, whatever its
        exit code), unless it was being stopped anyway (cancel, time limit)."""
        if usage.oom_kills and state in (JobState.COMPLETED, JobState.FAILED):
            limit = format_size(self.limits.mem) if self.limits.mem else "its limit"
            return JobState.OUT_OF_MEMORY, (
                f"out of memory: the job reached its memory limit ({limit}) and the kernel "
                f"killed {usage.oom_kills} of its processes")
        return state, ""
