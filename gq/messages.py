"""The messages between gqd and gqnode, typed: one frozen dataclass per message type.

Each is declared once, here. From the declaration come its schema (a field's wire types from its
annotation, required when it has no default, plus the rules for what its container fields hold:
gq.schema), its wire form (`wire`: a map with the fields' names as keys, which gq.protocol packs
with the version and type) and its decoding (`from_wire`, of a map gq.protocol has checked
against the schema, so it cannot fail). gq.protocol.decode_message and encode_message are the
two ends. A field's RANGES and LENGTHS are those of its name (gq.schema), as for every message.

Client requests (the CLI, the relay, gq api) are declared the same way in gq/requests.py; their
replies are plain maps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any, ClassVar, Union

from gq import schema as s
from gq import stepwire
from gq.declare import Message, declare, schema_of
from gq.errors import ProtocolError
from gq.model import Gpu
from gq.unpack import clip

# Node -> head.
REGISTER = "register"
HEARTBEAT = "heartbeat"
REPORT = "report"
# Head -> node.
LAUNCH = "launch"
KILL = "kill"
ACK = "ack"
REREGISTER = "reregister"
ALIVE = "alive"
#: A job step's (srun's) tasks on a node: start them; stop them (gq/stepwire.py names them).
STEP = stepwire.STEP
STEP_KILL = stepwire.STEP_KILL

#: Report events a node sends about a job run.
STARTED = "started"
FINISHED = "finished"
#: ... and about its tasks of a job step (the report's `step`): started; all ended.
STEP_STARTED = stepwire.STEP_STARTED
STEP_ENDED = stepwire.STEP_ENDED

#: Longest note a node sends with a job's end (why it failed to start).
MAX_NOTE = 1000


# ---------------------------------------------------------------- records inside messages

declare(Gpu)  # a GPU as a node registers it (gq.model)


@dataclass(frozen=True, slots=True)
class Mark:
    """A run's checkpoint marker ($GQ_CHECKPOINT_DIR/.gq-checkpoint) as its node last saw it."""

    job_id: int
    restart: int
    #: The marker's mtime (the node's clock): the run saved its progress then.
    time: float


declare(Mark)


@dataclass(frozen=True, slots=True)
class ArrayTask:
    """What the shepherd needs of a job's record beyond its spec: which array task the job is
    (SLURM_ARRAY_JOB_ID, SLURM_ARRAY_TASK_ID); None for a job that is none."""

    array_job_id: int | None = None
    array_index: int | None = None


declare(ArrayTask)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What gqnode and the shepherd read of a job's spec (gq.model.JobSpec: these fields are
    its fields, with its defaults; tests/test_messages.py holds the two to each other): the
    script and who runs it where, its environment, and what names its SLURM_* variables and
    confines it. The rest (dependencies, mail, the scheduler's requests ...) stays in gqd.
    On the wire a map of these fields; an older gqd's whole spec reads as one (its other
    fields are not read), and an older gqnode reads this map as the spec it was."""

    script: str
    name: str = "job"
    args: tuple[str, ...] = ()
    user: str = ""
    uid: int = -1
    gid: int = -1
    cwd: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    gpu_type: str | None = None
    cpus: int = 0
    mem: int = 0
    qos: str | None = None
    signal: str | None = None
    array: str | None = None
    account: str | None = None
    submit_host: str = ""
    gpus_total: int | None = None
    gpus_per_task: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int | None = None
    cpus_per_gpu: int | None = None
    mem_per_cpu: int | None = None
    mem_per_gpu: int | None = None
    partition: str | None = None
    open_mode: str | None = None
    #: `--cache-key`: gqnode remembers it on the run's GPUs and sets GQ_CACHE_WARM.
    cache_key: str | None = None
    #: `--gpu-mem` (bytes per GPU): the room its key takes in each GPU's warm-key LRU.
    gpu_mem: int | None = None

    @classmethod
    def of(cls, spec: Any) -> RunSpec:
        """The run's part of a job spec: a JobSpec, or its map (`to_dict`)."""
        get = spec.get if isinstance(spec, dict) else partial(getattr, spec)
        values = {name: get(name, default) for name, default in _RUN_DEFAULTS}
        values["args"] = tuple(values["args"])
        values["env"] = dict(values["env"])
        return cls(**values)


def _args(key: str, value: list[Any], what: str) -> None:
    """A job's arguments: strings (of any length, as gqd took them: gq.protocol.check_spec)."""
    if not all(type(a) is str for a in value):
        raise ProtocolError(f"{what}: {key!r} must be strings")


#: What RunSpec's container fields hold, as gq.protocol.check_spec took them.
_RUN_RULES: s.Rules = {"args": _args, "env": stepwire.environment}
declare(RunSpec, **_RUN_RULES)
#: RunSpec's fields and their defaults, for RunSpec.of.
_RUN_DEFAULTS = tuple(
    (f.name, () if f.name == "args" else {} if f.name == "env" else f.default)
    for f in fields(RunSpec))
RUN_SCHEMA = schema_of(RunSpec)
GPU_SCHEMA = schema_of(Gpu)
#: What `gq nodes` shows of a GPU besides its telemetry (no reading may take these names).
_GPU_FIELDS = frozenset({*GPU_SCHEMA, "job", "cache_keys"})


def _telemetry(key: str, value: dict[Any, Any], what: str) -> None:
    """GPU index (as text) -> reading name -> a number (or None); a reading may not take the
    name of a GPU's own field, with which `gq nodes` shows it."""
    if len(value) > s.COUNTS["telemetry"]:
        raise ProtocolError(f"{what}: {key!r} has over {s.COUNTS['telemetry']} GPUs")
    for gpu, readings in value.items():
        if type(gpu) is not str or not s.GPU_INDEX.fullmatch(gpu) or type(readings) is not dict \
                or len(readings) > s.MAX_READINGS:
            raise ProtocolError(f"{what}: {key!r} must map GPU indices to readings, not "
                                f"{clip(gpu)} to {clip(readings)}")
        for name, reading in readings.items():
            kind = type(reading)
            if type(name) is not str or len(name) > 64 or name in _GPU_FIELDS or not (
                    reading is None or (kind is int and s.ANY_INT[0] <= reading <= s.ANY_INT[1])
                    or (kind is float and math.isfinite(reading))):
                raise ProtocolError(f"{what}: {key!r} of GPU {gpu}: reading {clip(name)} is "
                                    f"{clip(reading)}, not a number")


# ---------------------------------------------------------------- node -> head


@dataclass(frozen=True, slots=True)
class Register(Message):
    """What a node has, and the runs it still holds."""

    TYPE: ClassVar[str] = REGISTER
    node: str
    gpus: tuple[Gpu, ...]
    cpus: int
    #: Bytes.
    mem: int
    #: (job_id, restart) of every run the node holds, alive or ended with its report not yet
    #: acked; the head requeues a run it knows started there and that is missing.
    running: tuple[tuple[int, int], ...]
    #: Where its GPUs are read from (nvml, fake ...), for the head's log.
    gpu_source: str = ""
    #: How its peers reach it ("": by its name).
    addr: str = ""
    #: Its features (--features, [node] features), which jobs' --constraint names.
    features: tuple[str, ...] = ()
    #: [node] head_lease_s (0: none): it stops its jobs after that long without a word from
    #: gqd, and gqd requeues them only once that has surely happened.
    head_lease_s: float = 0.0


declare(Register, gpus=s.each_map(GPU_SCHEMA), running=s.int_pairs("job_id", "restart"),
         features=s.STRINGS)


@dataclass(frozen=True, slots=True)
class Heartbeat(Message):
    """A node is alive; how its GPUs are, and what is wrong with it."""

    TYPE: ClassVar[str] = HEARTBEAT
    node: str
    #: GPU index (as text) -> reading (util, mem_used, temp ...) -> a number, None if unknown
    #: (the rules check that; Any, as a dict of ints is no dict of floats to mypy).
    telemetry: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Faults that make results suspect, one line each: gqd drains the node and requeues its
    #: jobs.
    health: tuple[str, ...] = ()
    #: Why the node's state disk cannot take a job (None or "": it can); gqd drains the node
    #: while it says so and lets its running jobs go on.
    disk: str | None = None
    #: With a head lease, this heartbeat's number (1, 2, ...): gqd answers it with an Alive of
    #: the same number, which renews the lease from when the heartbeat was sent. 0: no answer.
    beat: int = 0
    #: The checkpoint markers of the runs here that have one, each beat (a lost heartbeat
    #: loses none); gqd keeps each run's latest (gq/head/checkpoints.py).
    checkpoints: tuple[Mark, ...] = ()
    #: GPU index (as text) -> the cache keys warm on it (model affinity): its recent jobs'
    #: --cache-key, and the node's [node] cache_dirs entries.
    warm: dict[str, list[str]] = field(default_factory=dict)


def _warm(key: str, value: dict[Any, Any], what: str) -> None:
    """GPU index (as text) -> a short list of short keys."""
    if len(value) > s.COUNTS["telemetry"]:
        raise ProtocolError(f"{what}: {key!r} has over {s.COUNTS['telemetry']} GPUs")
    for gpu, keys in value.items():
        if type(gpu) is not str or not s.GPU_INDEX.fullmatch(gpu) or type(keys) is not list \
                or len(keys) > MAX_WARM_KEYS \
                or not all(type(k) is str and 0 < len(k) <= s.MAX_STR for k in keys):
            raise ProtocolError(f"{what}: {key!r} must map GPU indices to lists of at most "
                                f"{MAX_WARM_KEYS} keys, not {clip(gpu)} to {clip(keys)}")


#: Most cache keys a heartbeat may name warm on one GPU (its LRU and the cache directories').
MAX_WARM_KEYS = 256
declare(Heartbeat, telemetry=_telemetry, health=s.STRINGS,
        checkpoints=s.each_map(schema_of(Mark)), warm=_warm)


@dataclass(frozen=True, slots=True)
class Report(Message):
    """A run started or finished on the node: kept in its outbox until gqd acks `seq`."""

    TYPE: ClassVar[str] = REPORT
    node: str
    #: The outbox's sequence number (0 until the outbox gives it one).
    seq: int
    job_id: int
    restart: int
    #: STARTED or FINISHED (the run's); STEP_STARTED or STEP_ENDED (step `step`'s tasks here).
    event: str
    time: float
    #: A finished run's state, exit code and why (a failed start, a node fault).
    state: str | None = None
    exit_code: int | None = None
    note: str | None = None
    #: What the run used (bytes, seconds: Slurm's MaxRSS and TotalCPU), when the node knows.
    max_rss: int | None = None
    cpu_s: float | None = None
    #: The job step of a STEP_STARTED or STEP_ENDED report (its exit_code: the worst of the
    #: node's tasks'); None for the run's own.
    step: int | None = None


declare(Report)


def usage_fields(status: dict[str, Any]) -> dict[str, Any]:
    """A finished report's usage fields from a run's status: those it knows, checked as
    Report's schema checks them (a bad one is left out rather than the report refused)."""
    out: dict[str, Any] = {}
    rss, cpu = status.get("max_rss"), status.get("cpu_s")
    if isinstance(rss, int) and not isinstance(rss, bool) and 0 <= rss <= s.I64:
        out["max_rss"] = rss
    if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and math.isfinite(cpu) \
            and cpu >= 0:
        out["cpu_s"] = cpu
    return out


# ---------------------------------------------------------------- head -> node


@dataclass(frozen=True, slots=True)
class Launch(Message):
    """Start one rank of a job's run: what its shepherd needs, and no more."""

    TYPE: ClassVar[str] = LAUNCH
    job_id: int
    restart: int
    #: What the run needs of the job's spec (older gqds send it whole).
    spec: RunSpec
    #: This node's GPUs for the run.
    gpus: tuple[int, ...]
    rank: int
    nodelist: tuple[str, ...]
    #: 0: no limit.
    time_limit_s: int
    stdout: str
    stderr: str
    #: Which array task the job is. (Older gqds send the whole job record here, of which
    #: older gqnodes read just these.)
    job: ArrayTask
    #: Seconds from a stop's signal to SIGKILL.
    grace_s: float = 10.0
    #: GQ_CHECKPOINT_DIR ("": under the job's home).
    checkpoint_dir: str = ""
    #: MASTER_ADDR of a multi-node job ("": the first node).
    master_addr: str = ""
    #: The cluster's name (SLURM_CLUSTER_NAME).
    cluster: str = ""


declare(Launch, spec=s.one_map(RUN_SCHEMA, _RUN_RULES), gpus=s.each_item(s.INT, like="index"),
         nodelist=s.STRINGS, job=s.one_map(schema_of(ArrayTask)))


@dataclass(frozen=True, slots=True)
class Kill(Message):
    """Stop (or, `no_kill`, only signal) a run."""

    TYPE: ClassVar[str] = KILL
    job_id: int
    restart: int
    #: KILL (at once), or a name (TERM, USR1 ...) sent to the job's process group (only its
    #: top process with batch_only), then SIGKILL after grace_s (None: the launch's).
    signal: str = "TERM"
    batch_only: bool = False
    grace_s: float | None = None
    #: `gq cancel --signal`: only the signal; the job is not ended.
    no_kill: bool = False


declare(Kill)


@dataclass(frozen=True, slots=True)
class Ack(Message):
    """The head holds the node's report `seq`: the node may forget it."""

    TYPE: ClassVar[str] = ACK
    seq: int


declare(Ack)


@dataclass(frozen=True, slots=True)
class Reregister(Message):
    """The head does not know the node's connection (it restarted, or rolled a registration
    back): the node registers again."""

    TYPE: ClassVar[str] = REREGISTER


declare(Reregister)


@dataclass(frozen=True, slots=True)
class Alive(Message):
    """The head heard heartbeat `beat` of a node with a head lease: the node's lease runs on
    from when it sent that heartbeat (so a late answer never stretches it)."""

    TYPE: ClassVar[str] = ALIVE
    beat: int


declare(Alive)


@dataclass(frozen=True, slots=True)
class Step(Message):
    """Start this node's tasks of a job step (srun inside the job; gq/head/steps.py sends it,
    gq/node/steps.py starts a step shepherd for it). A node starts a step's tasks once: gqd
    sends the order again until the node's STEP_STARTED report."""

    TYPE: ClassVar[str] = STEP
    job_id: int
    #: The job's run the step belongs to.
    restart: int
    step: int
    #: What each task runs, in `cwd`, with `env` (srun's environment) under its own.
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    #: Every node's part (gq.steps.to_wire: node, node_id, tasks [procid, localid, [gpu, ...]]):
    #: each node runs the tasks of its own entry, and every task's environment names them all.
    layout: tuple[dict[str, Any], ...]
    #: The tasks' output files, appended to (%t: the task, %n: its node, on the node).
    stdout: str
    stderr: str
    #: srun -K: a failing task ends the node's others.
    kill_on_bad_exit: bool = False
    #: MASTER_ADDR of the tasks ("": the first node of the layout).
    master_addr: str = ""
    cpus_per_task: int | None = None
    #: Seconds from a stop's TERM to KILL.
    grace_s: float = 10.0
    #: srun -l: each line of a task's output begins with its id.
    label: bool = False


declare(Step, argv=stepwire.command, env=stepwire.environment, layout=stepwire.layout)


@dataclass(frozen=True, slots=True)
class StepKill(Message):
    """Stop this node's tasks of step `step` of run `restart` of a job."""

    TYPE: ClassVar[str] = STEP_KILL
    job_id: int
    restart: int
    step: int
    #: TERM (then KILL after the step's grace_s) or KILL (at once).
    signal: str = "TERM"


declare(StepKill)

NodeMessage = Union[Register, Heartbeat, Report]
HeadMessage = Union[Launch, Kill, Ack, Reregister, Step, StepKill, Alive]
#: Every typed message type by its name.
TYPES: dict[str, type[Message]] = {cls.TYPE: cls for cls in (
    Register, Heartbeat, Report, Launch, Kill, Ack, Reregister, Step, StepKill, Alive)}
NODE_MESSAGES = frozenset({REGISTER, HEARTBEAT, REPORT})
HEAD_TO_NODE = frozenset({LAUNCH, KILL, ACK, REREGISTER, STEP, STEP_KILL, ALIVE})


def read(msg: dict[str, Any]) -> Message:
    """The typed message of a map of a typed message's type that passed its schema."""
    return TYPES[msg["type"]].from_wire(msg)
