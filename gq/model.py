"""Value types of gq (jobs, nodes, GPUs, states) and the parsing of GPU specs (durations, sizes,
times and signals: gq.units).

Pure: no I/O, no imports from the rest of the package but errors, defaults, units and spec.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import enum
import functools
import re
import signal as _signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gq.defaults import DEFAULT_OUTPUT, SIGNAL_LEAD_S
from gq.errors import UsageError
from gq.spec import complete as complete_spec
# Durations, times, sizes and `--signal` are parsed in gq.units (which the CLI loads without
# this module's dataclasses); the rest of gq finds them here too.
from gq.units import (format_duration, format_size, parse_duration, parse_iso_time,  # noqa: F401
                      parse_size, parse_time, signal_parts, signal_text)


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
    #: Went past its memory limit and the kernel's OOM killer killed a process of it (Slurm's
    #: OUT_OF_MEMORY): the job's own fault, so ended, not requeued; `reason` says so.
    OUT_OF_MEMORY = "OUT_OF_MEMORY"

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
    #: Power saving ([power] nodes, gq/head/power.py; Slurm's POWERED_DOWN, POWERING_UP,
    #: POWERING_DOWN): off, and resumed when pending jobs fit it; its resume program has run
    #: and it has not registered yet; its suspend program is running (its messages ignored).
    #: None takes jobs.
    POWERED_DOWN = "POWERED_DOWN"
    POWERING_UP = "POWERING_UP"
    POWERING_DOWN = "POWERING_DOWN"


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
        return signal_text(self.name, self.lead_s, self.batch_only)


def parse_signal(text: str) -> JobSignal:
    """`[B:]SIG[@SECONDS]` as sbatch --signal takes it."""
    name, lead_s, batch_only = signal_parts(text)
    return JobSignal(name=name, lead_s=lead_s, batch_only=batch_only)


# ---------------------------------------------------------------- jobs


@dataclass(frozen=True)
class JobSpec:
    """What a user asked for at submit, its fields as gq/spec.py declares them
    (tests/test_spec.py holds the two to each other). Frozen: a change (`gq update`, the
    defaults gqd fills in) makes a new one (dataclasses.replace), and gqd's caches of what it
    made from a spec tell a change by identity (`is`)."""

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
    #: The host `gq submit` ran on (SLURM_SUBMIT_HOST).
    submit_host: str = ""
    # Slurm's requests as given (None: not given). gqd works out nodes, gpus, cpus and mem
    # from them when it accepts the spec (gq/tasks.py); they also name the SLURM_* variables.
    #: `--gpus`: GPUs for the whole job.
    gpus_total: int | None = None
    gpus_per_task: int | None = None
    #: `-n`: tasks of the whole job; None when neither it nor --ntasks-per-node was given.
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    #: Bytes.
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    #: `--exclusive`: it holds whole nodes.
    exclusive: bool = False
    #: The partition it runs in (or Slurm's comma list of them); None until gqd fills in the
    #: default.
    partition: str | None = None
    #: `--constraint` on node features (gq/features.py).
    constraint: str | None = None
    #: `-w`, `-x`: nodes it must, or must not, run on, as given (hostlist form allowed).
    nodelist: str | None = None
    exclude: str | None = None
    #: `--open-mode`: "append" or "truncate" its output files (None: truncate, but append
    #: after a requeue).
    open_mode: str | None = None
    #: `--nice`: priority points taken off (added, when negative).
    nice: int = 0
    comment: str | None = None
    #: `--mail-type` (upper case, comma-separated) and `--mail-user` (None: the owner).
    mail_type: str | None = None
    mail_user: str | None = None
    #: `--cache-key`: what the job loads (model affinity, docs/SCHEDULING.md), or None.
    cache_key: str | None = None
    #: `--cold-wait`: seconds it waits for a GPU where its key is warm before a cold one.
    cold_wait_s: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """The spec of a wire or stored form (keys naming no field are ignored, missing ones
        take their defaults). Not through __init__: a frozen dataclass's sets each field with
        object.__setattr__, which doubled the cost of each spec gqd reads from its store."""
        spec = object.__new__(cls)
        spec.__dict__.update(complete_spec(data))
        return spec

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
    #: When it last saved its progress (`gq checkpoint`, the marker file), in any of its runs;
    #: None: never (gq/head/checkpoints.py).
    checkpoint_time: float | None = None

    def to_json(self, fields: Iterable[str] | None = None) -> dict[str, Any]:
        """The documented `--json` object (DESIGN: the CLI contract), or only `fields` of it
        (names from JOB_FIELDS; a listing that shows a few columns needs no more)."""
        return job_record(None if fields is None else tuple(fields))(self)

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


#: A job's `--json` fields, in the documented order: name -> the Python expression of its
#: value for job `j` (whose spec is `s`), compiled into record functions by `job_record`.
#: (`_value_`: what Enum's `value` property returns, without the property's call; the times
#: of a job that has not started or ended skip iso_time's call.)
JOB_FIELDS: dict[str, str] = {
    "id": "j.id", "name": "s.name", "user": "s.user", "state": "j.state._value_",
    "reason": "j.reason", "qos": "s.qos", "priority": "j.priority", "nodes": "s.nodes",
    "gpus_per_node": "s.gpus", "gpu_type": "s.gpu_type", "time_limit_s": "s.time_limit_s",
    "submit_time": "iso_time(j.submit_time)",
    "start_time": "iso_time(j.start_time) if j.start_time else None",
    "end_time": "iso_time(j.end_time) if j.end_time else None", "exit_code": "j.exit_code",
    "node_list": "list(j.alloc)",
    "gpu_ids": "{node: list(ids) for node, ids in j.alloc.items()}",
    "array_job_id": "j.array_job_id", "array_index": "j.array_index",
    "array_task_id": "j.array_index", "job_id": "j.ref",
    "array_task_limit": "(int(s.array.partition('%')[2] or 0) or None) if s.array else None",
    "account": "s.account", "hold": "j.hold or None", "begin_time": "iso_time(s.begin_time)",
    "dependency": "s.dependency", "restart_count": "j.restart_count", "retries": "s.retries",
    "node_fail_count": "j.node_fail_count", "work_dir": "s.cwd",
    "stdout": "j.output_path('output')", "stderr": "j.output_path('error')",
    "signal": "s.signal", "share": "s.share", "partition": "s.partition", "uid": "s.uid",
    "gid": "s.gid",
    "cpus_per_node": "s.cpus", "mem_per_node": "s.mem", "ntasks": "s.ntasks",
    "cpus_per_task": "s.cpus_per_task", "exclusive": "s.exclusive",
    "constraint": "s.constraint", "nice": "s.nice", "comment": "s.comment",
    "nodelist": "s.nodelist", "exclude": "s.exclude", "requeue": "s.requeue",
    "last_checkpoint": "iso_time(j.checkpoint_time) if j.checkpoint_time else None",
    "cache_key": "s.cache_key", "cold_wait_s": "s.cold_wait_s",
}


@functools.lru_cache(maxsize=64)  # a few field sets in use: the full record and the CLI's tables
def job_record(fields: tuple[str, ...] | None = None) -> Callable[[Job], dict[str, Any]]:
    """The function making a job's `--json` object (DESIGN: the CLI contract), or only `fields`
    of it (names from JOB_FIELDS; KeyError for another name).

    Compiled into one dict display, as dataclasses compiles its __init__: a function call per
    field made gqd's records of a 5,000-job listing page cost ~100 ms. Only JOB_FIELDS'
    expressions and the names' repr() reach the source, never a caller's text."""
    names = tuple(JOB_FIELDS) if fields is None else fields
    items = ", ".join(f"{name!r}: {JOB_FIELDS[name]}" for name in names)
    scope: dict[str, Any] = {"iso_time": iso_time}
    exec(f"def record(j):\n    s = j.spec\n    return {{{items}}}\n", scope)
    return scope["record"]


_PATTERN_RE = re.compile(r"%(%|j|J|A|a|x|u|N|n|t)")
#: What each `%` pattern of an output file name stands for.
_PATTERN_VALUES: dict[str, Callable[[Job], str]] = {
    "%": lambda j: "%", "j": lambda j: str(j.id), "x": lambda j: j.spec.name,
    # %J is jobid.stepid, but the batch script is no numbered step: the job id alone, as
    # slurmstepd writes it (srun's -o puts the step's number, gq/head/steps.py).
    "J": lambda j: str(j.id),
    "u": lambda j: j.spec.user,
    "A": lambda j: str(j.array_job_id if j.array_job_id is not None else j.id),
    "a": lambda j: str(j.array_index) if j.array_index is not None else "4294967294",
    "N": lambda j: next(iter(j.alloc), ""),
    # The node and task, relative to the job, of what writes the file: the batch script is
    # node 0, task 0 (sbatch's `%n`, `%t`; a step's own -o gives them per task).
    "n": lambda j: "0", "t": lambda j: "0",
}


def expand_pattern(pattern: str, job: Job) -> str:
    """Slurm's output filename patterns: %j (and %J) job id, %A array job id, %a array index,
    %x name, %u user, %N first node, %n and %t the batch script's node and task (0)."""
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
    #: When that telemetry came (wall clock); older than `[head] telemetry_stale_s`, it is stale.
    telemetry_at: float = 0.0
    #: Its features (`[node] features`), which jobs' --constraint names.
    features: list[str] = field(default_factory=list)
    #: GPU index -> the cache keys warm on it (model affinity), as its last heartbeat said.
    warm: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "state": self.state.value, "reason": self.reason,
            "addr": self.addr, "cpus": self.cpus, "mem": self.mem,
            "features": list(self.features),
            "last_seen": iso_time(self.last_seen),
            "gpus": [{**dataclasses.asdict(g), **self.telemetry.get(g.index, {}),
                      "cache_keys": list(self.warm.get(g.index, ()))} for g in self.gpus],
        }


@functools.lru_cache(maxsize=4096)  # the jobs of one submit share their submit time
def iso_time(ts: float | None) -> str | None:
    """ISO 8601 UTC, second precision, as the --json contract says."""
    if ts is None or ts == 0 or ts != ts:  # ts != ts: NaN
        return None
    whole = int(ts)
    # datetime rounds a timestamp to the microsecond before dropping the fraction, so a time
    # a hair below a whole second (or before 1970, where int() rounds up) takes its exact path.
    if ts < 0 or ts - whole >= 0.999999:
        return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{_iso_minute(whole // 60)}{whole % 60:02d}Z"


@functools.lru_cache(maxsize=1024)
def _iso_minute(minute: int) -> str:
    """`YYYY-MM-DDTHH:MM:` of a minute since the epoch: listings of jobs submitted one by one
    (times all different) format the date once a minute, not once a job."""
    return _dt.datetime.fromtimestamp(minute * 60, _dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:")
