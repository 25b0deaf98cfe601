"""The client requests to gqd (the CLI, the relay, gq api), typed: one frozen dataclass each.

Declared once, here, as gq/messages.py declares the node messages (gq/declare.py): from each
come the schema gq.protocol checks a request against (the same checks and words as the maps
it replaced) and its reading, which gqd does once (`read`) before a handler sees it, so that
handlers read typed fields. Every request has the caller's fields (`Request`). A field that is
None only when left out (`unset()`) may not be None on the wire. The type names are
gq.protocol's (tests/test_requests.py holds the two to each other); gq.protocol loads this
module only where requests are checked (gqd, the relay), never in the CLI, which only sends
them. A request declared only as a schema in gq.protocol stays a map: the handler of such a
type gets the checked map.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gq import schema as s
from gq import stepwire
from gq.declare import Message, declare, unset
from gq.errors import ProtocolError
from gq.unpack import clip

#: A job reference: a job id, or an "ARRAYID_INDEX" string (an array's id: all its tasks).
Ref = int | str


@dataclass(frozen=True, slots=True, kw_only=True)
class Request(Message):
    """What every client request may carry: its id (echoed by the reply), for a caller the
    kernel cannot vouch for (TCP), who it claims to be, and through a relay the uid the relay
    proved or (gq api) the user's token (gqd reads those two only on the relay endpoint:
    gq/head/auth.py)."""

    rid: int = 0
    claim_uid: int | None = unset()
    claim_user: str | None = unset()
    as_uid: int | None = unset()
    as_token: str | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Named(Request):
    """A request acting on the jobs `ids` names (each type's own fields follow). Reply, for
    hold, release, requeue and update: done (the ids acted on) and errors (id -> why not)."""

    ids: tuple[Ref, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ping(Request):
    TYPE: ClassVar[str] = "ping"


@dataclass(frozen=True, slots=True, kw_only=True)
class Submit(Request):
    """Job specs, all or none; each checked (gq.protocol.check_spec) as gqd takes it."""

    TYPE: ClassVar[str] = "submit"
    jobs: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Named):
    """End jobs. signal (scancel --signal): send it to the running jobs (only their script with
    batch_only) and do not end them. filter (scancel -u/-t/-n/-p ...; gq/head/select.py): the
    live jobs whose fields all match, only the caller's unless it names a user; with ids, only
    among those. Reply: cancelled (the ids acted on) and errors (id -> why not)."""

    TYPE: ClassVar[str] = "cancel"
    user: str | None = None
    signal: str | None = None
    batch_only: bool = False
    filter: dict[str, Any] | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Queue(Request):
    """The live jobs. start (squeue --start): pending jobs get expected_start and
    expected_nodes. fields: only these of each job (names of the --json object). Paging (here
    and in history): with limit, the reply holds at most that many jobs, those with ids past
    `after`, and `next`: the `after` of the next page, or None when there is none. text
    (with limit, neither start nor fields): each job as its `gq queue --json` text, ASCII
    bytes (gq/head/records.py: texts), instead of a map."""

    TYPE: ClassVar[str] = "queue"
    user: str | None = None
    states: tuple[str, ...] | None = None
    all: bool = False
    start: bool = False
    fields: tuple[str, ...] | None = None
    text: bool = False
    after: int = 0
    limit: int | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Show(Request):
    TYPE: ClassVar[str] = "show"
    id: Ref


@dataclass(frozen=True, slots=True, kw_only=True)
class Nodes(Request):
    TYPE: ClassVar[str] = "nodes"


@dataclass(frozen=True, slots=True, kw_only=True)
class Wait(Named):
    """Answered when every job named has ended (parked up to park_s seconds a time)."""

    TYPE: ClassVar[str] = "wait"
    park_s: float | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain(Request):
    TYPE: ClassVar[str] = "drain"
    nodes: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Resume(Request):
    TYPE: ClassVar[str] = "resume"
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Hold(Named):
    TYPE: ClassVar[str] = "hold"


@dataclass(frozen=True, slots=True, kw_only=True)
class Release(Named):
    TYPE: ClassVar[str] = "release"


@dataclass(frozen=True, slots=True, kw_only=True)
class Requeue(Named):
    TYPE: ClassVar[str] = "requeue"


@dataclass(frozen=True, slots=True, kw_only=True)
class Update(Named):
    """`gq update` (scontrol update): the fields given are changed (time_limit_s 0: no
    limit); reply as for hold."""

    TYPE: ClassVar[str] = "update"
    time_limit_s: int | None = unset()
    qos: str | None = unset()
    name: str | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class History(Request):
    """Jobs from the store (sacct): submitted by `until` and not ended before `since`; only
    those of `ids` (job ids; an array's id: its tasks) and `partition` when given."""

    TYPE: ClassVar[str] = "history"
    since: float
    until: float
    user: str | None = None
    states: tuple[str, ...] | None = None
    after: int = 0
    limit: int | None = unset()
    ids: tuple[int, ...] | None = None
    partition: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Accounting(Request):
    """`gq report`: GPU-seconds of runs inside [since, until] by user, account, QOS and
    outcome."""

    TYPE: ClassVar[str] = "accounting"
    since: float
    until: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TestSubmit(Request):
    """`sbatch --test-only`: one spec, checked as a submit's. Reply: start (ISO time, None: no
    estimate), nodes, cpus, gpus, partition, reason, warnings. Nothing is submitted."""

    TYPE: ClassVar[str] = "test_submit"
    job: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Events(Request):
    """Events with seq > since (None: from now on; with oldest, from the oldest kept), only
    those of `user`, job `job`, array `array`, of `kinds` (job, node); at most `limit`; parked
    up to park_s seconds until one is committed. Reply: events, next (the since of the next
    request), first (the oldest kept), last (the newest committed)."""

    TYPE: ClassVar[str] = "events"
    since: int | None = None
    oldest: bool = False
    user: str | None = None
    job: int | None = None
    array: int | None = None
    kinds: tuple[str, ...] | None = None
    limit: int | None = unset()
    park_s: float | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenCreate(Request):
    """A token of the caller's (an admin's: of `user`), lasting expires_s seconds. Reply: the
    token (shown once) and its record (id, name, user, uid, created, expires, read_only)."""

    TYPE: ClassVar[str] = "token_create"
    name: str | None = None
    expires_s: float | None = unset()
    read_only: bool = False
    user: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenList(Request):
    """The caller's tokens (with all, an admin's: everyone's), never the tokens themselves."""

    TYPE: ClassVar[str] = "token_list"
    all: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenRevoke(Request):
    """Reply as for hold: done (token ids) and errors (id -> why not)."""

    TYPE: ClassVar[str] = "token_revoke"
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLaunch(Request):
    """srun inside a job: a step of job `job_id` (the caller's, running) running `argv` in
    `cwd` with `env` (srun's environment), laid out as gq.steps.layout does; output and error:
    the step's files (default: the job's); label: srun -l; nodelist: srun -w, only these nodes
    of the job. Reply: step, ntasks, nodes."""

    TYPE: ClassVar[str] = stepwire.STEP_LAUNCH
    job_id: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    kill_on_bad_exit: bool = False
    output: str | None = None
    error: str | None = None
    name: str | None = None
    label: bool = False
    nodelist: tuple[str, ...] | None = unset()


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStatus(Request):
    """Reply: the step's record (gq.head.steps.step_record): state RUNNING until every node's
    tasks ended, exit_code."""

    TYPE: ClassVar[str] = stepwire.STEP_STATUS
    job_id: int
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCancel(Request):
    TYPE: ClassVar[str] = stepwire.STEP_CANCEL
    job_id: int
    step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Request):
    """`gq checkpoint` inside a job: run `restart` of job `job_id` (the caller's, running) saved
    its progress now; a preemption then loses only the work since. Reply: recorded (False: an
    older run's, ignored), time (ISO)."""

    TYPE: ClassVar[str] = "checkpoint"
    job_id: int
    restart: int


#: What a filtered cancel's `filter` may name (scancel -u/-t/-n/-p ...): gq/head/select.py.
FILTER_SCHEMA: s.Schema = {"user": (s.OPT_STR, False), "states": (s.OPT_LIST, False),
                           "name": (s.OPT_STR, False), "partition": (s.OPT_STR, False),
                           "account": (s.OPT_STR, False), "qos": (s.OPT_STR, False),
                           "nodes": (s.OPT_LIST, False)}


def _filter(key: str, value: dict[str, Any], what: str) -> None:
    """A filter map: only FILTER_SCHEMA's fields, its lists of strings."""
    where = f"{what}: {key}"
    unknown = set(value) - set(FILTER_SCHEMA)
    if unknown:
        raise ProtocolError(f"{where}: unknown field {clip(sorted(map(str, unknown))[0])}")
    s.check(value, FILTER_SCHEMA, where)
    for name in ("states", "nodes"):
        s.STRINGS(name, value.get(name) or [], where)


_plain: tuple[type[Request], ...] = (Ping, Nodes, TokenList, Accounting, TestSubmit, TokenCreate,
                                     StepStatus, StepCancel, Checkpoint)
for _cls in _plain:
    declare(_cls)
_by_refs: tuple[type[Request], ...] = (Wait, Hold, Release, Requeue, Update)
for _cls in _by_refs:
    declare(_cls, ids=s.refs)
declare(Cancel, ids=s.refs, filter=_filter)
declare(Submit, jobs=s.each_item(s.DICT))
declare(Show, id=s.refs)
declare(Queue, states=s.STRINGS, fields=s.STRINGS)
declare(History, states=s.STRINGS, ids=s.each_item(s.INT, like="id"))
declare(Drain, nodes=s.STRINGS)
declare(Resume, nodes=s.STRINGS)
declare(Events, kinds=s.STRINGS)
declare(TokenRevoke, ids=s.each_item(s.INT, like="id"))
declare(StepLaunch, argv=stepwire.command, env=stepwire.environment, nodelist=stepwire.node_names)

#: Every typed request type by its name.
TYPES: dict[str, type[Request]] = {cls.TYPE: cls for cls in (
    Ping, Submit, Cancel, Queue, Show, Nodes, Wait, Drain, Resume, Hold, Release, Requeue,
    Update, History, Accounting, TestSubmit, Events, TokenCreate, TokenList, TokenRevoke,
    StepLaunch, StepStatus, StepCancel, Checkpoint)}


def read(msg: dict[str, Any]) -> Any:
    """The typed request of a checked map (gq.protocol.checked) of a declared type; any other
    request's checked map as it is (srun's, and those declared only as schemas)."""
    cls = TYPES.get(msg["type"])
    return msg if cls is None else cls.from_wire(msg)
