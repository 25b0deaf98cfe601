"""Value types of gq (jobs, nodes, GPUs, states) and the parsing of durations, sizes and GPU specs.

Pure: no I/O, no imports from the rest of the package but errors and defaults.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import math
import re
import signal as _signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gq.defaults import DEFAULT_OUTPUT, MAX_SIGNAL_LEAD_S, SIGNAL_LEAD_S
from gq.errors import UsageError


class JobState(str, enum.Enum):
    """Slurm's job state names, stored verbatim."""

    #: Waiting for resources, priority, a dependency or a hold; `reason` says which.
    PENDING = "PENDING"
    #: Its shepherd(s) have been told to start it.
    RUNNING = "RUNNING"
    #: Exited 0.
    COMPLETED = "COMPLETED"
    #: Exited non-zero or was killed by a signal it did not ask for.
    FAILED = "FAILED"
    #: Cancelled by its owner or an admin.
    CANCELLED = "CANCELLED"
    #: Ran past its time limit and was stopped.
    TIMEOUT = "TIMEOUT"
    #: Its node died under it.
    NODE_FAIL = "NODE_FAIL"
    #: Stopped to make room for higher-tier work (and requeued as PENDING).
    PREEMPTED = "PREEMPTED"

    @property
    def terminal(self) -> bool:
        return self not in (JobState.PENDING, JobState.RUNNING)


class NodeState(str, enum.Enum):
    #: Registered and heartbeating; takes jobs.
    UP = "UP"
    #: Heartbeating but taking no new jobs (admin or health check); `reason` says why.
    DRAIN = "DRAIN"
    #: Silent past the node timeout, or never seen since the head started.
    DOWN = "DOWN"


# ---------------------------------------------------------------- durations

_DURATION_FORMS = ("MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
                   "or a number with a unit: 90s, 30m, 2h, 1d")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_RE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_DAYS_RE = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK_RE = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_duration(text: str | int | float) -> int:
    """Seconds in a Slurm-style time limit. A bare number means minutes, as in Slurm."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _positive_duration(int(text * 60), str(text))
    raw = str(text).strip().lower()
    if raw in ("unlimited", "infinite"):
        return 0
    if m := _UNIT_RE.match(raw):
        return _positive_duration(int(float(m[1]) * _UNIT_S[m[2]]), raw)
    if m := _DAYS_RE.match(raw):
        days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
        return _positive_duration(((days * 24 + hours) * 60 + minutes) * 60 + seconds, raw)
    if m := _CLOCK_RE.match(raw):
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 1:
            return _positive_duration(parts[0] * 60, raw)
        if len(parts) == 2:
            return _positive_duration(parts[0] * 60 + parts[1], raw)
        return _positive_duration(parts[0] * 3600 + parts[1] * 60 + parts[2], raw)
    raise UsageError(f"bad duration {text!r}: expected {_DURATION_FORMS}")


def _positive_duration(seconds: int, raw: str) -> int:
    if seconds <= 0:
        raise UsageError(f"bad duration {raw!r}: must be more than zero; expected {_DURATION_FORMS}")
    return seconds


def format_duration(seconds: float | None) -> str:
    """Slurm's D-HH:MM:SS form (HH:MM:SS under a day); 'UNLIMITED' for no limit."""
    if not seconds:
        return "UNLIMITED" if seconds == 0 else ""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


# ---------------------------------------------------------------- points in time

_TIME_FORMS = ("now, now+N or now-N (N seconds, or with a unit: 30s, 10m, 1h, 2d, 1w), today, "
               "tomorrow, HH:MM[:SS], YYYY-MM-DD, or YYYY-MM-DDTHH:MM[:SS] (local time; a "
               "trailing Z means UTC)")
_RELATIVE_RE = re.compile(r"^now(?:([+-])(\d+)\s*([a-z]*))?$")
_RELATIVE_UNITS = {"": 1, "s": 1, "sec": 1, "seconds": 1, "m": 60, "min": 60, "minutes": 60,
                   "h": 3600, "hours": 3600, "d": 86400, "days": 86400, "w": 604800,
                   "weeks": 604800}
_HOUR_RE = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def parse_time(text: str, now: float, future: bool = False) -> float:
    """Epoch seconds of a Slurm-style time (`--begin`, `--since`). `HH:MM` is today at that time,
    or, with `future` (for --begin), the next such time, tomorrow's when today's has passed."""
    raw = str(text).strip().lower()
    local_now = _dt.datetime.fromtimestamp(now).astimezone()
    midnight = local_now.replace(hour=0, minute=0, second=0, microsecond=0)
    if m := _RELATIVE_RE.match(raw):
        if not m[1]:
            return now
        if m[3] not in _RELATIVE_UNITS:
            raise UsageError(f"bad time {text!r}: unknown unit {m[3]!r}; expected {_TIME_FORMS}")
        delta = int(m[2]) * _RELATIVE_UNITS[m[3]]
        return now + delta if m[1] == "+" else now - delta
    if raw in ("today", "midnight", "tomorrow"):
        days = 0 if raw == "today" else 1
        return (midnight + _dt.timedelta(days=days)).timestamp()
    if m := _HOUR_RE.match(raw):
        hour, minute, second = int(m[1]), int(m[2]), int(m[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise UsageError(f"bad time {text!r}: expected {_TIME_FORMS}")
        at = midnight.replace(hour=hour, minute=minute, second=second)
        if future and at.timestamp() <= now:
            at += _dt.timedelta(days=1)
        return at.timestamp()
    try:
        parsed = _dt.datetime.fromisoformat(raw.upper().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"bad time {text!r}: expected {_TIME_FORMS}") from None
    return (parsed if parsed.tzinfo else parsed.astimezone()).timestamp()


# ---------------------------------------------------------------- sizes

_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:i?b)?|(b))?$")
_SIZE_MULT = {"b": 1, "": 1024**2, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def parse_size(text: str | int) -> int:
    """Bytes in a size like `40G`, `512M`, `1.5T`. A bare number means MiB, as in Slurm's --mem."""
    raw = str(text).strip().lower()
    m = _SIZE_RE.match(raw)
    if not m:
        raise UsageError(f"bad size {text!r}: expected a number with an optional unit "
                         "K, M, G, T (powers of 1024), e.g. 40G or 512M; a bare number is MiB")
    unit = "b" if m[3] else (m[2] or "")
    return int(float(m[1]) * _SIZE_MULT[unit])


def format_size(nbytes: int | None) -> str:
    if not nbytes:
        return "-"
    for unit, mult in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes >= mult:
            value = nbytes / mult
            return f"{value:.0f}{unit}" if value == int(value) or value >= 100 else f"{value:.1f}{unit}"
    return f"{nbytes}B"


# ---------------------------------------------------------------- GPUs


@dataclass(frozen=True)
class Gpu:
    """One GPU of a node, as its gqnode reports it."""

    index: int
    #: Short model name used by --gpu-type, lower case (`h100`, `a100`, `fake`).
    type: str
    #: Memory in bytes.
    memory: int
    uuid: str = ""
    #: Full product name as NVML reports it.
    name: str = ""


_GPU_PART_RE = re.compile(r"^(\d+)(?:x([a-z0-9_.-]+))?(?::(\S+))?$")
_GPU_SPEC_FORMS = "N, NxTYPE, NxTYPE:MEM or a comma-separated list, e.g. 8, 8xh100:80G, 4xa100:40G,4xl4:24G"
#: VRAM of a fake GPU whose spec names none.
FAKE_GPU_MEMORY = 80 * 1024**3


def parse_gpu_spec(text: str) -> list[Gpu]:
    """The GPUs of a `--fake-gpus` spec, numbered from 0."""
    gpus: list[Gpu] = []
    raw = str(text).strip().lower()
    for part in raw.split(","):
        m = _GPU_PART_RE.match(part.strip())
        if not m or not raw:
            raise UsageError(f"bad GPU spec {text!r}: expected {_GPU_SPEC_FORMS}")
        count, gtype, mem = int(m[1]), m[2] or "fake", m[3]
        if count < 1:
            raise UsageError(f"bad GPU spec {text!r}: each count must be at least 1")
        try:
            memory = parse_size(mem) if mem else FAKE_GPU_MEMORY
        except UsageError as exc:
            raise UsageError(f"bad GPU spec {text!r}: {exc}") from None
        for _ in range(count):
            index = len(gpus)
            gpus.append(Gpu(index=index, type=gtype, memory=memory,
                            uuid=f"GPU-fake-{gtype}-{index}", name=f"Fake {gtype.upper()}"))
    if len(gpus) > 64:
        raise UsageError(f"bad GPU spec {text!r}: at most 64 GPUs per node")
    return gpus


# ---------------------------------------------------------------- signals

#: Signals `--signal` may name: Slurm's list, less KILL and STOP, which no job can catch or act on.
_SIGNAL_NAMES = ("HUP", "INT", "QUIT", "ABRT", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT",
                 "TSTP", "TTIN", "TTOU", "XCPU")
_SIGNAL_FORMS = (f"[B:]SIG[@SECONDS], SIG a name ({', '.join(_SIGNAL_NAMES)}; with or without "
                 f"SIG, any case) or its number, SECONDS 0 to {MAX_SIGNAL_LEAD_S} (default "
                 f"{SIGNAL_LEAD_S}), e.g. USR1@120 or B:USR2")
_SIGNAL_RE = re.compile(r"^(?:(b):)?([a-z0-9]+)(?:@([0-9]+))?$", re.IGNORECASE | re.ASCII)


@dataclass(frozen=True)
class JobSignal:
    """A job's `--signal`: sent `lead_s` before its time limit, and instead of SIGTERM when it is
    preempted (Slurm's sbatch --signal)."""

    #: Upper case, without the SIG prefix: `USR1`.
    name: str
    lead_s: int = SIGNAL_LEAD_S
    #: `B:`: only the batch script's own process gets it, not the rest of the job.
    batch_only: bool = False

    @property
    def number(self) -> int:
        return int(_signal.Signals["SIG" + self.name])

    def __str__(self) -> str:
        """The canonical form, which the spec stores and `gq show` prints: `B:USR1@60`."""
        return f"{'B:' if self.batch_only else ''}{self.name}@{self.lead_s}"


def parse_signal(text: str) -> JobSignal:
    """`[B:]SIG[@SECONDS]` as sbatch --signal takes it."""
    m = _SIGNAL_RE.match(str(text).strip())
    if not m:
        raise UsageError(f"bad --signal {text!r}: expected {_SIGNAL_FORMS}")
    lead = int(m[3]) if m[3] is not None else SIGNAL_LEAD_S
    if lead > MAX_SIGNAL_LEAD_S:
        raise UsageError(f"bad --signal {text!r}: at most {MAX_SIGNAL_LEAD_S} seconds before the "
                         f"time limit; expected {_SIGNAL_FORMS}")
    return JobSignal(name=_signal_name(m[2], text), lead_s=lead, batch_only=bool(m[1]))


def _signal_name(word: str, text: str) -> str:
    name = word.upper().removeprefix("SIG")
    if word.isdigit():
        try:
            name = _signal.Signals(int(word)).name.removeprefix("SIG")
        except ValueError:
            name = ""
    if name in ("KILL", "STOP"):
        raise UsageError(f"bad --signal {text!r}: SIG{name} cannot be caught, so the job could "
                         f"not act on it (gq sends SIGKILL itself after the grace time); "
                         f"expected {_SIGNAL_FORMS}")
    if name not in _SIGNAL_NAMES:
        raise UsageError(f"bad --signal {text!r}: {word!r} is not a signal a job may ask for; "
                         f"expected {_SIGNAL_FORMS}")
    return name


# ---------------------------------------------------------------- jobs


@dataclass
class JobSpec:
    """What a user asked for at submit; immutable once accepted (but for admin updates)."""

    script: str
    name: str = "job"
    args: list[str] = field(default_factory=list)
    user: str = ""
    uid: int = -1
    gid: int = -1
    cwd: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    nodes: int = 1
    gpus: int = 1
    gpu_type: str | None = None
    gpu_mem: int | None = None
    cpus: int = 0
    mem: int = 0
    #: Seconds; None means the QOS default.
    time_limit_s: int | None = None
    qos: str | None = None
    output: str | None = None
    error: str | None = None
    requeue: bool = True
    #: `--retries`: how many times a node fault (node down, GPU health drain, run lost on its
    #: node) requeues it before it ends NODE_FAIL; None until the head applies `[head] default_retries`.
    retries: int | None = None
    #: `--signal` in its canonical form (`B:USR1@60`, see JobSignal), or None.
    signal: str | None = None
    #: Held at submit (`--hold`): it waits until `gq release`.
    hold: bool = False
    #: Not started before this time (`--begin`), epoch seconds, or None.
    begin_time: float | None = None
    #: `--dependency` in its canonical form (`afterok:1:2,singleton`, see gq.deps), or None.
    dependency: str | None = None
    #: Cancel the job when its dependency can never be met (else it waits, as in Slurm).
    kill_on_invalid_dep: bool = False
    #: `--array` as given (`0-99%10`); the head makes one job per index.
    array: str | None = None
    #: Account charged in `gq report` (`-A`), or None.
    account: str | None = None
    #: `--share`: runs on GPUs it shares with other sharing jobs while the sum of their
    #: `gpu_mem` fits in each GPU's VRAM (never beside an exclusive job).
    share: bool = False

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        return cls(**{k: data[k] for k in _SPEC_FIELDS if k in data})

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: its deep copy, field by field, was most of a bulk submit's
        # time (a quarter of a millisecond a spec). args and env are the only containers.
        data = {name: getattr(self, name) for name in _SPEC_FIELDS}
        data["args"], data["env"] = list(self.args), dict(self.env)
        return data


#: JobSpec's field names, in order (its wire and stored form has exactly these keys).
_SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(JobSpec))


@dataclass
class Job:
    """A job as the head knows it."""

    id: int
    spec: JobSpec
    state: JobState = JobState.PENDING
    reason: str = ""
    submit_time: float = 0.0
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    #: Node name -> GPU indices on that node, in node rank order.
    alloc: dict[str, list[int]] = field(default_factory=dict)
    #: How many times it has been requeued; launches and reports carry it so stale ones are spotted.
    restart_count: int = 0
    priority: int = 0
    array_job_id: int | None = None
    array_index: int | None = None
    #: Who holds it back: "" (nobody), "user" or "admin" (`gq hold`, `--hold`).
    hold: str = ""
    #: True while its allocation is still held on the node(s) (until the node reports it ended).
    holds_alloc: bool = False
    #: How many of its requeues were for a node fault (counted against `spec.retries`).
    node_fail_count: int = 0

    @property
    def node_list(self) -> list[str]:
        return list(self.alloc)

    def to_json(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """The documented `--json` object (DESIGN: the CLI contract), or only `fields` of it
        (names from JOB_FIELDS; a listing that shows a few columns needs no more)."""
        if fields is None:
            return {name: value(self) for name, value in _JOB_FIELD_ITEMS}
        return {name: JOB_FIELDS[name](self) for name in fields}

    @property
    def ref(self) -> str:
        """How users name it: `123`, or `100_7` for task 7 of array 100 (Slurm's JobId form)."""
        if self.array_job_id is None:
            return str(self.id)
        return f"{self.array_job_id}_{self.array_index}"

    def output_path(self, which: str) -> str:
        """Absolute path of the job's stdout (`output`) or stderr (`error`) file."""
        pattern = getattr(self.spec, which) or (self.spec.output if which == "error" else None)
        expanded = expand_pattern(pattern or DEFAULT_OUTPUT, self)
        return expanded if expanded.startswith("/") else f"{self.spec.cwd.rstrip('/')}/{expanded}"


#: A job's `--json` fields, in the documented order: name -> its value for a job.
JOB_FIELDS: dict[str, Callable[[Job], Any]] = {
    "id": lambda j: j.id, "name": lambda j: j.spec.name, "user": lambda j: j.spec.user,
    "state": lambda j: j.state.value, "reason": lambda j: j.reason, "qos": lambda j: j.spec.qos,
    "priority": lambda j: j.priority, "nodes": lambda j: j.spec.nodes,
    "gpus_per_node": lambda j: j.spec.gpus, "gpu_type": lambda j: j.spec.gpu_type,
    "time_limit_s": lambda j: j.spec.time_limit_s,
    "submit_time": lambda j: iso_time(j.submit_time),
    "start_time": lambda j: iso_time(j.start_time), "end_time": lambda j: iso_time(j.end_time),
    "exit_code": lambda j: j.exit_code, "node_list": lambda j: j.node_list,
    "gpu_ids": lambda j: {node: list(ids) for node, ids in j.alloc.items()},
    "array_job_id": lambda j: j.array_job_id, "array_index": lambda j: j.array_index,
    "array_task_id": lambda j: j.array_index, "job_id": lambda j: j.ref,
    "array_task_limit": lambda j: int(j.spec.array.partition("%")[2] or 0) or None
    if j.spec.array else None,
    "account": lambda j: j.spec.account, "hold": lambda j: j.hold or None,
    "begin_time": lambda j: iso_time(j.spec.begin_time),
    "dependency": lambda j: j.spec.dependency, "restart_count": lambda j: j.restart_count,
    "retries": lambda j: j.spec.retries, "node_fail_count": lambda j: j.node_fail_count,
    "work_dir": lambda j: j.spec.cwd, "stdout": lambda j: j.output_path("output"),
    "stderr": lambda j: j.output_path("error"), "signal": lambda j: j.spec.signal,
    "share": lambda j: j.spec.share,
}
_JOB_FIELD_ITEMS = tuple(JOB_FIELDS.items())

_PATTERN_RE = re.compile(r"%(%|j|A|a|x|u|N)")
#: What each `%` pattern of an output file name stands for.
_PATTERN_VALUES: dict[str, Callable[[Job], str]] = {
    "%": lambda j: "%", "j": lambda j: str(j.id), "x": lambda j: j.spec.name,
    "u": lambda j: j.spec.user,
    "A": lambda j: str(j.array_job_id if j.array_job_id is not None else j.id),
    "a": lambda j: str(j.array_index) if j.array_index is not None else "4294967294",
    "N": lambda j: next(iter(j.alloc), ""),
}


def expand_pattern(pattern: str, job: Job) -> str:
    """Slurm's output filename patterns: %j job id, %A array job id, %a array index, %x name, %u user."""
    return _PATTERN_RE.sub(lambda m: _PATTERN_VALUES[m[1]](job), pattern)


@dataclass
class Node:
    """A GPU host as the head knows it."""

    name: str
    gpus: list[Gpu] = field(default_factory=list)
    cpus: int = 0
    mem: int = 0
    state: NodeState = NodeState.DOWN
    reason: str = ""
    #: Why an admin or a health check drained it; kept while it is DOWN, so that it comes back
    #: DRAIN, until `gq admin resume`.
    drain_reason: str = ""
    last_seen: float = 0.0
    #: Host name or address other nodes reach it at (MASTER_ADDR of multi-node jobs).
    addr: str = ""
    #: Latest per-GPU telemetry: index -> {util, mem_used, temp}.
    telemetry: dict[int, dict[str, Any]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "state": self.state.value, "reason": self.reason,
            "addr": self.addr, "cpus": self.cpus, "mem": self.mem,
            "last_seen": iso_time(self.last_seen),
            "gpus": [{**dataclasses.asdict(g), **self.telemetry.get(g.index, {})} for g in self.gpus],
        }


@functools.lru_cache(maxsize=4096)  # the jobs of one submit share their submit time
def iso_time(ts: float | None) -> str | None:
    """ISO 8601 UTC, second precision, as the --json contract says."""
    if ts is None or ts == 0 or math.isnan(ts):
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso_time(text: str | None) -> float | None:
    """Inverse of iso_time."""
    if not text:
        return None
    return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=_dt.timezone.utc).timestamp()
