"""The wire protocol: message types, msgpack encoding, and validation of every incoming message.

A message is one msgpack map with `v` (protocol version), `type`, and the type's fields.
Requests from the CLI carry `rid`; the reply echoes it. Nothing here touches a socket.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from itertools import repeat
from typing import Any

import msgpack

from gq import spec as spec_fields
from gq import unpack
from gq.defaults import MAX_ARRAY_INDEX, MAX_SUBMIT_SPECS, PROTOCOL_VERSION
from gq.errors import ProtocolError
from gq.unpack import clip

# Client -> head requests.
PING = "ping"
SUBMIT = "submit"
CANCEL = "cancel"
QUEUE = "queue"
SHOW = "show"
NODES = "nodes"
WAIT = "wait"
DRAIN = "drain"
RESUME = "resume"
HOLD = "hold"
RELEASE = "release"
REQUEUE = "requeue"
#: `gq update` (scontrol update): a pending job's time limit, QOS or name.
UPDATE = "update"
HISTORY = "history"
#: `gq report` (GPU-hours); not "report", which is a node's message.
ACCOUNTING = "accounting"
#: `sbatch --test-only`: when and where a job would start; nothing is submitted.
TEST_SUBMIT = "test_submit"
#: Job and node events after a sequence number (gq/events.py, gq/head/feed.py).
EVENTS = "events"
#: Users' API tokens (gq/head/tokens.py).
TOKEN_CREATE = "token_create"
TOKEN_LIST = "token_list"
TOKEN_REVOKE = "token_revoke"
# Head -> client.
REPLY = "reply"
# Node -> head.
REGISTER = "register"
HEARTBEAT = "heartbeat"
REPORT = "report"
# Head -> node.
LAUNCH = "launch"
KILL = "kill"
ACK = "ack"
REREGISTER = "reregister"

#: The uid a relay proved for the caller of a request it forwards (SO_PEERCRED on its host),
#: added by the relay to any client request; gqd reads it only from relay connections.
AS_UID = "as_uid"
#: The user's token with which gq api forwards a request (gqd acts as the token's user).
AS_TOKEN = "as_token"

#: Report events a node sends about a job run.
STARTED = "started"
FINISHED = "finished"

_NONE = type(None)
_INT = (int,)
_OPT_INT = (int, _NONE)
_STR = (str,)
_OPT_STR = (str, _NONE)
_NUM = (int, float)
_OPT_NUM = (int, float, _NONE)
#: A job reference: a job id, or "ARRAYID_INDEX" for an array task.
_REF = (int, str)
_BOOL = (bool,)
_LIST = (list,)
_OPT_LIST = (list, _NONE)
_DICT = (dict,)

#: Field -> (accepted types, required). Strings are also length-checked (LENGTHS, else MAX_STR),
#: and RANGES, COUNTS and the NUL check apply to a field of that name wherever it appears;
#: RULES say what a message's container fields hold.
Schema = dict[str, tuple[tuple[type, ...], bool]]
MAX_STR = 4096
MAX_SCRIPT = 1024 * 1024
#: Most items in a list field (job ids, nodes, env entries ...) unless COUNTS says fewer.
MAX_LIST = 100_000
#: Longest note a node sends with a job's end (why it failed to start).
MAX_NOTE = 1000
#: Most fields of one message, and the deepest nesting of a field no schema describes (the
#: schema fixes the depth of the others).
MAX_FIELDS = 64
MAX_DEPTH = 8
#: Most items in all the fields of a message that no schema names (its walk costs as much).
MAX_EXTRA_ITEMS = 10_000
#: Most job references of one request given as ARRAYID_INDEX text (each read with a pattern;
#: job ids are checked all at once).
MAX_REF_TEXTS = 10_000
#: Longest health problem a node reports: its health check's first line of output is read up
#: to 64 KiB.
MAX_HEALTH_LINE = 128 * 1024
_I64 = 2**63 - 1
#: What SQLite stores: an int field RANGES does not name may take any of these, a float any
#: finite value.
_ANY_INT = (-(2**63), _I64)
_ANY_FLOAT = (-math.inf, math.inf)
#: Seconds since the epoch a date can show (years 1 to 9999), and durations in seconds.
_TIME = (-62_135_596_800, 253_402_300_799)
_DURATION = (0, 10 * 365 * 86400)
_UID = (-1, 2**32 - 1)
#: Number fields' accepted ranges (inclusive); a list field's int items take their field's.
RANGES: dict[str, tuple[float, float]] = {
    # ids, counters and paging
    "rid": (0, _I64), "id": (1, _I64), "job_id": (1, _I64), "seq": (0, _I64),
    "after": (0, _I64), "limit": (1, MAX_LIST), "restart": (0, 1_000_000),
    "rank": (0, 65_535), "index": (0, 65_535),
    # who
    "uid": _UID, "gid": _UID, "claim_uid": _UID, AS_UID: _UID,
    # sizes and counts (memory in bytes)
    "nodes": (0, 65_535), "gpus": (0, 65_535), "cpus": (0, 2**31), "mem": (0, _I64),
    "gpu_mem": (0, _I64), "memory": (0, _I64), "retries": (0, 1_000_000),
    "exit_code": (-255, 65_535), "max_rss": (0, _I64), "cpu_s": (0, 2**53),
    # times and durations
    "since": _TIME, "until": _TIME, "time": _TIME, "time_limit_s": _DURATION,
    # a spec's --begin: shown as a date in every listing (1e300 made each one fail)
    "begin_time": _TIME,
    "park_s": _DURATION, "grace_s": _DURATION,
    "gpus_total": (0, 65_535), "gpus_per_task": (0, 65_535), "ntasks": (0, 2**31),
    "ntasks_per_node": (0, 2**31), "cpus_per_task": (0, 2**31), "cpus_per_gpu": (0, 2**31),
    "mem_per_cpu": (0, _I64), "mem_per_gpu": (0, _I64), "nice": (-2**31, 2**31),
    # events (gq/head/feed.py): a sequence number, a job's and an array's id
    "job": (1, _I64), "array": (1, _I64), "expires_s": (1, 3650 * 86400),
}
#: Most items of a list field, where fewer than MAX_LIST make sense.
COUNTS: dict[str, int] = {"jobs": MAX_SUBMIT_SPECS, "states": 64, "fields": 256, "gpus": 1024,
                          "health": 1024, "telemetry": 1024, "running": 10_000}
#: Most telemetry readings of one GPU (NVML's: util, mem_used, temp).
MAX_READINGS = 32
#: Longest string of a field (or of each item of a list field), where it is not MAX_STR.
LENGTHS: dict[str, int] = {"script": MAX_SCRIPT, "health": MAX_HEALTH_LINE}
#: Any name execve takes (exported bash functions are `BASH_FUNC_name%%`), but no '='.
_ENV_NAME = re.compile(r"^[^=\0]{1,1024}$")
#: A job reference as text, as gq.arrays.parse_ref reads it (ASCII digits only).
_REF_TEXT = re.compile(r"\s*([0-9]{1,19})(?:_([0-9]{1,19}))?\s*", re.ASCII)
_GPU_INDEX = re.compile(r"[0-9]{1,5}", re.ASCII)

#: A job spec's fields, as gq/spec.py declares them; their ranges (RANGES) hold the bounds
#: it declares (tests/test_spec.py), which `gq.spec.check` applies with its own wording.
SPEC_SCHEMA: Schema = {f.name: (f.types, f.required) for f in spec_fields.FIELDS}
#: A GPU as a node registers it.
GPU_SCHEMA: Schema = {"index": (_INT, True), "type": (_STR, True), "memory": (_INT, True),
                      "uuid": (_STR, False), "name": (_STR, False)}
#: What every client request may carry: its id (echoed by the reply), for a caller the kernel
#: cannot vouch for (TCP), who it claims to be, and through a relay the uid the relay proved or
#: (gq api) the user's token (gqd reads those two only on the relay endpoint: gq/head/auth.py).
_CALLER: Schema = {"rid": (_INT, False), "claim_uid": (_INT, False), "claim_user": (_STR, False),
                   AS_UID: (_INT, False), AS_TOKEN: (_STR, False)}

_CLIENT_SCHEMAS: dict[str, Schema] = {
    PING: {},
    SUBMIT: {"jobs": (_LIST, True)},
    # signal (scancel --signal): send it to the running jobs (only their script with
    # batch_only) and do not end them.
    # filter (scancel -u/-t/-n/-p ...; gq/head/select.py): the live jobs whose fields all
    # match, only the caller's unless it names a user; with ids, only among those.
    CANCEL: {"ids": (_LIST, True), "user": (_OPT_STR, False), "signal": (_OPT_STR, False),
             "batch_only": (_BOOL, False), "filter": (_DICT, False)},
    # start (squeue --start): pending jobs get expected_start and expected_nodes.
    # fields: only these of each job (names of the --json object). Paging (here and in
    # history): with limit, the reply holds at most that many jobs, those with ids past
    # `after`, and `next`: the `after` of the next page, or None when there is none.
    QUEUE: {"user": (_OPT_STR, False), "states": (_OPT_LIST, False), "all": (_BOOL, False),
            "start": (_BOOL, False), "fields": (_OPT_LIST, False), "after": (_INT, False),
            "limit": (_INT, False)},
    SHOW: {"id": (_REF, True)},
    NODES: {},
    WAIT: {"ids": (_LIST, True), "park_s": (_NUM, False)},
    DRAIN: {"nodes": (_LIST, True), "reason": (_STR, True)},
    RESUME: {"nodes": (_LIST, True)},
    # ids (of these, of cancel and of wait): job ids, or "ARRAYID_INDEX" strings; an array's
    # id stands for all its tasks. Reply: done (the ids acted on) and errors (id -> why not).
    HOLD: {"ids": (_LIST, True)},
    RELEASE: {"ids": (_LIST, True)},
    REQUEUE: {"ids": (_LIST, True)},
    # The fields given are changed (time_limit_s 0: no limit); reply as for hold.
    UPDATE: {"ids": (_LIST, True), "time_limit_s": (_INT, False), "qos": (_STR, False),
             "name": (_STR, False)},
    # Jobs from the store (sacct): submitted by `until` and not ended before `since`; only
    # those of `ids` (job ids; an array's id: its tasks) and `partition` when given.
    HISTORY: {"since": (_NUM, True), "until": (_NUM, True), "user": (_OPT_STR, False),
              "states": (_OPT_LIST, False), "after": (_INT, False), "limit": (_INT, False),
              "ids": (_OPT_LIST, False), "partition": (_OPT_STR, False)},
    # GPU-seconds of runs inside [since, until] by user, account, QOS and outcome.
    ACCOUNTING: {"since": (_NUM, True), "until": (_NUM, True)},
    # job: one spec, checked as a submit's. Reply: start (ISO time, None: no estimate),
    # nodes, cpus, gpus, partition, reason, warnings.
    TEST_SUBMIT: {"job": (_DICT, True)},
    # Events with seq > since (None: from now on; with oldest, from the oldest kept), only
    # those of `user`, job `job`, array `array`, of `kinds` (job, node); at most `limit`;
    # parked up to park_s seconds until one is committed. Reply: events, next (the since of
    # the next request), first (the oldest kept), last (the newest committed).
    EVENTS: {"since": (_OPT_INT, False), "oldest": (_BOOL, False), "user": (_OPT_STR, False),
             "job": (_OPT_INT, False), "array": (_OPT_INT, False), "kinds": (_OPT_LIST, False),
             "limit": (_INT, False), "park_s": (_NUM, False)},
    # A token of the caller's (an admin's: of `user`), lasting expires_s seconds. Reply: the
    # token (shown once) and its record (id, name, user, uid, created, expires, read_only).
    TOKEN_CREATE: {"name": (_OPT_STR, False), "expires_s": (_NUM, False),
                   "read_only": (_BOOL, False), "user": (_OPT_STR, False)},
    # The caller's tokens (with all, an admin's: everyone's), never the tokens themselves.
    TOKEN_LIST: {"all": (_BOOL, False)},
    # Reply as for hold: done (token ids) and errors (id -> why not).
    TOKEN_REVOKE: {"ids": (_LIST, True)},
}

SCHEMAS: dict[str, Schema] = {
    **{kind: {**_CALLER, **fields} for kind, fields in _CLIENT_SCHEMAS.items()},
    # running: [job_id, restart] of every run the node holds, alive or ended with its report
    # not yet acked; the head requeues a run it knows started there and that is missing.
    REGISTER: {"node": (_STR, True), "gpus": (_LIST, True), "cpus": (_INT, True),
               "mem": (_INT, True), "running": (_LIST, True), "gpu_source": (_STR, False),
               "addr": (_STR, False), "features": (_LIST, False)},
    # telemetry: GPU index (as text) -> reading -> number; health: problems, one line each.
    HEARTBEAT: {"node": (_STR, True), "telemetry": (_DICT, False), "health": (_LIST, False),
                "disk": (_OPT_STR, False)},
    # disk: why the node's state disk cannot take a job ("" or absent: it can); gqd drains the
    # node while it says so and lets its running jobs go on (health problems stop them).
    # max_rss (bytes) and cpu_s (seconds): what a finished run used on the node (Slurm's
    # MaxRSS and TotalCPU), when the node knows.
    REPORT: {"node": (_STR, True), "seq": (_INT, True), "job_id": (_INT, True),
             "restart": (_INT, True), "event": (_STR, True), "state": (_OPT_STR, False),
             "exit_code": (_OPT_INT, False), "time": (_NUM, True), "note": (_OPT_STR, False),
             "max_rss": (_OPT_INT, False), "cpu_s": (_OPT_NUM, False)},
    LAUNCH: {"job_id": (_INT, True), "restart": (_INT, True), "spec": (_DICT, True),
             "gpus": (_LIST, True), "rank": (_INT, True), "nodelist": (_LIST, True),
             "time_limit_s": (_INT, True), "stdout": (_STR, True), "stderr": (_STR, True),
             "job": (_DICT, True), "grace_s": (_NUM, False), "checkpoint_dir": (_STR, False),
             "master_addr": (_STR, False), "cluster": (_STR, False)},
    # signal: KILL (at once), or a name (TERM, USR1 ...) sent to the job's process group (only
    # its top process with batch_only), then SIGKILL after grace_s (default: the launch's grace_s).
    # no_kill (gq cancel --signal): only the signal; the job is not ended.
    KILL: {"job_id": (_INT, True), "restart": (_INT, True), "signal": (_STR, False),
           "batch_only": (_BOOL, False), "grace_s": (_NUM, False), "no_kill": (_BOOL, False)},
    ACK: {"seq": (_INT, True)},
    REREGISTER: {},
    REPLY: {"rid": (_INT, True), "ok": (_BOOL, True)},
}

CLIENT_REQUESTS = frozenset({PING, SUBMIT, CANCEL, QUEUE, SHOW, NODES, WAIT, DRAIN, RESUME,
                             HOLD, RELEASE, REQUEUE, UPDATE, HISTORY, ACCOUNTING, TEST_SUBMIT, EVENTS,
                             TOKEN_CREATE, TOKEN_LIST, TOKEN_REVOKE})
NODE_MESSAGES = frozenset({REGISTER, HEARTBEAT, REPORT})
HEAD_TO_NODE = frozenset({LAUNCH, KILL, ACK, REREGISTER})


class PackedItems(list):
    """A message's list field whose items were packed already, one msgpack form each in `parts`:
    encode sends those as they are. (A listing page measures each record's size as it builds
    the page; packing each again in the reply was a third of gqd's time answering it.)"""

    def __init__(self, items: list[Any], parts: list[bytes]) -> None:
        super().__init__(items)
        self.parts = parts


def packer() -> Callable[[Any], bytes]:
    """A function packing one value as encode does, cheaper than packb for many small values."""
    return msgpack.Packer(use_bin_type=True).pack


def encode(msg_type: str, **fields: Any) -> bytes:
    msg = {"v": PROTOCOL_VERSION, "type": msg_type, **fields}
    if not any(type(value) is PackedItems for value in fields.values()):
        return msgpack.packb(msg, use_bin_type=True)
    # The same bytes as packb would give: a map header, then each key and value packed.
    pack = msgpack.Packer(use_bin_type=True)
    out = [pack.pack_map_header(len(msg))]
    for key, value in msg.items():
        out.append(pack.pack(key))
        if type(value) is PackedItems and len(value.parts) == len(value):
            out.append(pack.pack_array_header(len(value)))
            out += value.parts
        else:
            out.append(pack.pack(value))
    return b"".join(out)


# ---------------------------------------------------------------- decoding

#: msgpack's own limits for what gqd and gqnode receive (gq.unpack): no string, list or map
#: longer than a field takes, no extension types.
LIMITS: unpack.Limits = {"max_str_len": MAX_SCRIPT, "max_bin_len": MAX_STR,
                         "max_array_len": MAX_LIST, "max_map_len": MAX_LIST, "max_ext_len": 0}
#: Replies come from gqd, which the client trusts: a page may hold 100,000 records.
_REPLIES = frozenset({REPLY})


def decode(frame: bytes | memoryview, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """A validated message, or ProtocolError saying exactly what is wrong with it."""
    return checked(unpack.unpack(frame, None if allowed == _REPLIES else LIMITS), allowed)


def unpacking(frame: bytes | memoryview) -> unpack.Unpacking:
    """`frame` to be unpacked a slice at a time (then `checked`), within LIMITS."""
    return unpack.Unpacking(frame, LIMITS)


def rid_of(frame: bytes | memoryview) -> int:
    """The request id of a possibly malformed request (0 when none can be read quickly)."""
    low, high = RANGES["rid"]
    return unpack.rid_of(frame, LIMITS, int(low), int(high))


def checked(msg: Any, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """`msg` (unpacked) if it is a valid message of an `allowed` type; else ProtocolError."""
    if type(msg) is not dict:
        raise ProtocolError("message is not a map")
    if type(msg.get("v")) is not int or msg["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {clip(msg.get('v'))} not supported "
                            f"(this peer speaks {PROTOCOL_VERSION})")
    msg_type = msg.get("type")
    if not isinstance(msg_type, str) or msg_type not in SCHEMAS or (
            allowed is not None and msg_type not in allowed):
        raise ProtocolError(f"unknown message type {clip(msg_type)}")
    schema = SCHEMAS[msg_type]
    check(msg, schema, msg_type)
    if msg_type != REPLY:  # a reply's data is the client's to read
        if len(msg) > MAX_FIELDS:
            raise ProtocolError(f"{msg_type}: {len(msg)} fields, over {MAX_FIELDS}")
        _check_extras(msg, schema, msg_type)
    return msg


def check(obj: dict[str, Any], schema: Schema, what: str) -> None:
    """Raise ProtocolError unless `obj` has the schema's required fields with the right types,
    in range, and (for a message, `what` being its type) holding what RULES say."""
    rules = RULES.get(what)
    for key, (types, required) in schema.items():
        if key not in obj:
            if required:
                raise ProtocolError(f"{what}: missing field {key!r}")
            continue
        value = obj[key]
        kind = type(value)
        if rules is not None and key in rules and value is not None:
            _check_value(key, value, types, what)
            rules[key](key, value, what)
            continue
        # The usual cases first, each checked as _check_value would, for speed: a bulk submit
        # checks some thirty fields of each of thousands of specs.
        if kind is str and str in types:
            if len(value) > LENGTHS.get(key, MAX_STR):
                raise ProtocolError(f"{what}: field {key!r} is too long")
            if key != "script" and "\0" in value:
                raise ProtocolError(f"{what}: field {key!r} contains a NUL character")
            continue
        if kind is int and int in types:
            low, high = RANGES.get(key, _ANY_INT)
            if not low <= value <= high:
                raise ProtocolError(f"{what}: field {key!r} is {value}, outside {low}..{high}")
            continue
        if (value is None and _NONE in types) or (kind is bool and bool in types) or (
                kind is dict and dict in types):
            continue
        _check_value(key, value, types, what)
        if kind is list:
            for item in value:  # a spec's args: the rest have RULES
                if type(item) is str and "\0" in item:
                    raise ProtocolError(f"{what}: field {key!r} contains a NUL character")


def _check_value(key: str, value: Any, types: tuple[type, ...], what: str) -> None:
    """Type, range, length and characters of one field's value (not what a list holds)."""
    # bool is an int in Python; never accept it where a number is meant.
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise ProtocolError(f"{what}: field {key!r} has type {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{what}: field {key!r} is not a finite number")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        low, high = RANGES.get(key, _ANY_FLOAT if isinstance(value, float) else _ANY_INT)
        if not low <= value <= high:
            raise ProtocolError(f"{what}: field {key!r} is {value}, outside {low}..{high}")
    elif isinstance(value, str):
        if len(value) > LENGTHS.get(key, MAX_STR):
            raise ProtocolError(f"{what}: field {key!r} is too long")
        if "\0" in value and key != "script":
            raise ProtocolError(f"{what}: field {key!r} contains a NUL character")
    elif isinstance(value, list) and len(value) > COUNTS.get(key, MAX_LIST):
        raise ProtocolError(f"{what}: field {key!r} has over {COUNTS.get(key, MAX_LIST)} items")


def _check_extras(obj: dict[str, Any], schema: Schema, what: str) -> None:
    """Fields no schema names are kept (a newer peer's) but never read: they may not nest
    deeper than MAX_DEPTH, nor hold over MAX_EXTRA_ITEMS items in all."""
    left = MAX_EXTRA_ITEMS
    for key, value in obj.items():
        if key in schema or (type(value) is not list and type(value) is not dict):
            continue
        level, depth = [value], 1
        while level:
            left -= sum(map(len, level))
            if depth > MAX_DEPTH or left < 0:
                raise ProtocolError(f"{what}: field {clip(key)} nests deeper than {MAX_DEPTH}"
                                    if depth > MAX_DEPTH else f"{what}: fields no schema names"
                                    f" hold over {MAX_EXTRA_ITEMS} items")
            level = [x for v in level for x in (v.values() if type(v) is dict else v)
                     if type(x) is list or type(x) is dict]
            depth += 1


# ---------------------------------------------------------------- what container fields hold

#: A rule for a field's contents: (field, value, message type) -> None, or ProtocolError.
Rule = Callable[[str, Any, str], None]


def _bad_item(what: str, key: str, i: int, item: Any, expected: str) -> ProtocolError:
    return ProtocolError(f"{what}: {key}[{i}] is {clip(item)}, not {expected}")


def _items(types: tuple[type, ...], like: str | None = None) -> Rule:
    """Each item one of `types`, an int in the range (a string no longer than the length) of
    the field `like` (default: the field itself)."""
    expected = " or ".join(t.__name__ for t in types)

    def rule(key: str, value: list[Any], what: str) -> None:
        name = like or key
        if types == _STR and all(type(s) is str for s in value):  # the usual case, at once
            if value and (max(map(len, value)) > LENGTHS.get(name, MAX_STR)
                          or "\0" in "".join(value)):
                raise ProtocolError(f"{what}: an item of {key!r} is too long or has a NUL")
            return
        low, high = RANGES.get(name, _ANY_INT)
        for i, item in enumerate(value):
            kind = type(item)
            if kind not in types or (kind is int and not low <= item <= high) or (
                    kind is str and (len(item) > LENGTHS.get(name, MAX_STR) or "\0" in item)):
                raise _bad_item(what, key, i, item, f"{expected} (in range, without NUL)")
    return rule


def _maps(schema: Schema) -> Rule:
    """Each item a map with `schema`'s fields."""
    def rule(key: str, value: list[Any], what: str) -> None:
        for i, item in enumerate(value):
            where = f"{what}: {key}[{i}]"
            if type(item) is not dict:
                raise ProtocolError(f"{where} has type {type(item).__name__}, not a map")
            check(item, schema, where)
            for name, field in item.items():  # nothing nested beside what the schema names
                if name not in schema and (type(field) is list or type(field) is dict):
                    raise ProtocolError(f"{where}: field {clip(name)} holds a container")
    return rule


def _int_pairs(first: str, second: str) -> Rule:
    """Each item a list [first, second] of ints in those fields' ranges."""
    (low1, high1), (low2, high2) = RANGES[first], RANGES[second]

    def rule(key: str, value: list[Any], what: str) -> None:
        for i, item in enumerate(value):
            if type(item) is not list or len(item) != 2 or type(item[0]) is not int or \
                    type(item[1]) is not int or not low1 <= item[0] <= high1 or \
                    not low2 <= item[1] <= high2:
                raise _bad_item(what, key, i, item, f"[{first}, {second}]")
    return rule


def _refs(key: str, value: Any, what: str) -> None:
    """A job reference, or a list of them: a job id, or an ARRAYID_INDEX string."""
    low, high = RANGES["id"]
    items = value if type(value) is list else [value]
    if all(type(i) is int for i in items):  # the usual case, at once
        if not items or low <= min(items) and max(items) <= high:
            return
    elif sum(type(i) is str for i in items) > MAX_REF_TEXTS:
        raise ProtocolError(f"{what}: {key!r} holds over {MAX_REF_TEXTS} ARRAYID_INDEX strings")
    for i, item in enumerate(items):
        if type(item) is int and low <= item <= high:
            continue
        m = _REF_TEXT.fullmatch(item) if type(item) is str else None
        if m is None or not low <= int(m[1]) <= high or (
                m[2] is not None and int(m[2]) > MAX_ARRAY_INDEX):
            raise _bad_item(what, key, i, item, f"a job id (1..{high}) or ARRAYID_INDEX")


def _telemetry(key: str, value: dict[Any, Any], what: str) -> None:
    """GPU index (as text) -> reading name -> a number (or None); a reading may not take the
    name of a GPU's own field, with which `gq nodes` shows it."""
    if len(value) > COUNTS["telemetry"]:
        raise ProtocolError(f"{what}: {key!r} has over {COUNTS['telemetry']} GPUs")
    for gpu, readings in value.items():
        if type(gpu) is not str or not _GPU_INDEX.fullmatch(gpu) or type(readings) is not dict \
                or len(readings) > MAX_READINGS:
            raise ProtocolError(f"{what}: {key!r} must map GPU indices to readings, not "
                                f"{clip(gpu)} to {clip(readings)}")
        for name, reading in readings.items():
            kind = type(reading)
            if type(name) is not str or len(name) > 64 or name in _GPU_FIELDS or not (
                    reading is None or (kind is int and _ANY_INT[0] <= reading <= _ANY_INT[1])
                    or (kind is float and math.isfinite(reading))):
                raise ProtocolError(f"{what}: {key!r} of GPU {gpu}: reading {clip(name)} is "
                                    f"{clip(reading)}, not a number")


#: What `gq nodes` shows of a GPU besides its telemetry.
_GPU_FIELDS = frozenset({*GPU_SCHEMA, "job"})
_STRINGS = _items(_STR)
#: What a filtered cancel's `filter` may name (scancel -u/-t/-n/-p ...): gq/head/select.py.
FILTER_SCHEMA: Schema = {"user": (_OPT_STR, False), "states": (_OPT_LIST, False),
                         "name": (_OPT_STR, False), "partition": (_OPT_STR, False),
                         "account": (_OPT_STR, False), "qos": (_OPT_STR, False),
                         "nodes": (_OPT_LIST, False)}


def _filter(key: str, value: dict[str, Any], what: str) -> None:
    """A filter map: only FILTER_SCHEMA's fields, its lists of strings."""
    where = f"{what}: {key}"
    unknown = set(value) - set(FILTER_SCHEMA)
    if unknown:
        raise ProtocolError(f"{where}: unknown field {clip(sorted(map(str, unknown))[0])}")
    check(value, FILTER_SCHEMA, where)
    for name in ("states", "nodes"):
        _STRINGS(name, value.get(name) or [], where)


#: Message type -> field -> what the field holds, checked after its type.
RULES: dict[str, dict[str, Rule]] = {
    **{kind: {"ids": _refs} for kind in (WAIT, HOLD, RELEASE, REQUEUE, UPDATE)},
    CANCEL: {"ids": _refs, "filter": _filter},
    SUBMIT: {"jobs": _items(_DICT)},  # each a job spec, checked (check_spec) as gqd takes it
    SHOW: {"id": _refs},
    QUEUE: {"states": _STRINGS, "fields": _STRINGS},
    HISTORY: {"states": _STRINGS, "ids": _items(_INT, like="id")},
    DRAIN: {"nodes": _STRINGS},
    RESUME: {"nodes": _STRINGS},
    REGISTER: {"gpus": _maps(GPU_SCHEMA), "running": _int_pairs("job_id", "restart"),
               "features": _STRINGS},
    HEARTBEAT: {"telemetry": _telemetry, "health": _STRINGS},
    LAUNCH: {"gpus": _items(_INT, like="index"), "nodelist": _STRINGS},
    EVENTS: {"kinds": _STRINGS},
    TOKEN_REVOKE: {"ids": _items(_INT, like="id")},
}


def check_spec(spec: Any) -> dict[str, Any]:
    """A job spec's shape (types, lengths, wire ranges); gqd then checks what its values mean
    (gq.spec.check, the QOS and the nodes)."""
    if not isinstance(spec, dict):
        raise ProtocolError("job spec is not a map")
    check(spec, SPEC_SCHEMA, "job spec")
    if not all(isinstance(a, str) for a in spec.get("args", [])):
        raise ProtocolError("job spec: args must be strings")
    env = spec.get("env", {})
    names, values = list(env), list(env.values())
    if not all(map(isinstance, names, repeat(str))) or not all(
            map(isinstance, values, repeat(str))):
        raise ProtocolError("job spec: env must map strings to strings")
    if len(env) > MAX_LIST or not _env_ok(names, values):
        raise ProtocolError("job spec: env has a bad name (empty, or with '=' or NUL) or a "
                            "bad value (NUL, or over 32 KiB)")
    return spec


def _env_ok(names: list[str], values: list[str]) -> bool:
    """Every name matches _ENV_NAME and no value has a NUL or is over 32 KiB: tested on all
    entries at once, as an environment of a hundred variables comes with each spec."""
    if values and ("\0" in "".join(values) or max(map(len, values)) > MAX_STR * 8):
        return False
    if not names:
        return True
    if max(map(len, names)) > 1024:  # the pattern's own reading of a name this long
        return all(_ENV_NAME.match(k) for k in names)
    joined = "".join(names)
    return min(map(len, names)) > 0 and "=" not in joined and "\0" not in joined


def usage_fields(status: dict[str, Any]) -> dict[str, Any]:
    """A finished report's usage fields from a run's status: those it knows, checked as
    REPORT's schema checks them (a bad one is left out rather than the report refused)."""
    out: dict[str, Any] = {}
    rss, cpu = status.get("max_rss"), status.get("cpu_s")
    if isinstance(rss, int) and not isinstance(rss, bool) and 0 <= rss <= _I64:
        out["max_rss"] = rss
    if isinstance(cpu, (int, float)) and not isinstance(cpu, bool) and math.isfinite(cpu) \
            and cpu >= 0:
        out["cpu_s"] = cpu
    return out


def ok(rid: int, **data: Any) -> bytes:
    return encode(REPLY, rid=rid, ok=True, **data)


def error(rid: int, code: str, message: str) -> bytes:
    return encode(REPLY, rid=rid, ok=False, code=code, error=message)
