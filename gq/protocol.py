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
from gq.defaults import MAX_MESSAGE_BYTES, PROTOCOL_VERSION
from gq.errors import ProtocolError

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

#: Field -> (accepted types, required). Strings are also length-checked (MAX_STR), and
#: RANGES and the NUL check apply to a field of that name wherever it appears.
Schema = dict[str, tuple[tuple[type, ...], bool]]
MAX_STR = 4096
MAX_SCRIPT = 1024 * 1024
#: Most items in a list field (job ids, specs, nodes, env entries ...).
MAX_LIST = 100_000
#: Longest note a node sends with a job's end (why it failed to start).
MAX_NOTE = 1000
_I64 = 2**63 - 1
_ANY_INT = (-math.inf, math.inf)
#: Integer fields' accepted ranges (inclusive).
RANGES: dict[str, tuple[int, int]] = {
    "rid": (0, _I64), "id": (1, _I64), "job_id": (1, _I64), "seq": (0, _I64),
    "restart": (0, 1_000_000), "rank": (0, 65_535), "uid": (-1, 2**32 - 1),
    "gid": (-1, 2**32 - 1), "nodes": (0, 65_535), "gpus": (0, 65_535), "cpus": (0, 2**31),
    "mem": (0, _I64), "gpu_mem": (0, _I64), "time_limit_s": (0, 10 * 365 * 86400),
    "exit_code": (-255, 65_535), "retries": (0, 1_000_000), "after": (0, _I64),
    "limit": (1, MAX_LIST), "max_rss": (0, _I64), AS_UID: (0, 2**32 - 1),
    "since": (0, _I64), "job": (1, _I64), "array": (1, _I64),
}
#: Any name execve takes (exported bash functions are `BASH_FUNC_name%%`), but no '='.
_ENV_NAME = re.compile(r"^[^=\0]{1,1024}$")

#: A job spec's fields, as gq/spec.py declares them; their ranges (RANGES) hold the bounds
#: it declares (tests/test_spec.py), which `gq.spec.check` applies with its own wording.
SPEC_SCHEMA: Schema = {f.name: (f.types, f.required) for f in spec_fields.FIELDS}

SCHEMAS: dict[str, Schema] = {
    PING: {},
    SUBMIT: {"jobs": (_LIST, True)},
    # signal (scancel --signal): send it to the running jobs (only their script with
    # batch_only) and do not end them.
    CANCEL: {"ids": (_LIST, True), "user": (_OPT_STR, False), "signal": (_OPT_STR, False),
             "batch_only": (_BOOL, False)},
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
    # Jobs from the store (sacct): submitted by `until` and not ended before `since`.
    HISTORY: {"since": (_NUM, True), "until": (_NUM, True), "user": (_OPT_STR, False),
              "states": (_OPT_LIST, False), "after": (_INT, False), "limit": (_INT, False)},
    # GPU-seconds of runs inside [since, until] by user, account, QOS and outcome.
    ACCOUNTING: {"since": (_NUM, True), "until": (_NUM, True)},
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
    # running: [job_id, restart] of every run the node holds, alive or ended with its report
    # not yet acked; the head requeues a run it knows started there and that is missing.
    REGISTER: {"node": (_STR, True), "gpus": (_LIST, True), "cpus": (_INT, True),
               "mem": (_INT, True), "running": (_LIST, True), "gpu_source": (_STR, False),
               "addr": (_STR, False)},
    # disk: why the node's state disk cannot take a job ("" or absent: it can); gqd drains the
    # node while it says so and lets its running jobs go on (health problems stop them).
    HEARTBEAT: {"node": (_STR, True), "telemetry": (_DICT, False), "health": (_LIST, False),
                "disk": (_OPT_STR, False)},
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
             "master_addr": (_STR, False)},
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
                             HOLD, RELEASE, REQUEUE, UPDATE, HISTORY, ACCOUNTING, EVENTS,
                             TOKEN_CREATE, TOKEN_LIST, TOKEN_REVOKE})
NODE_MESSAGES = frozenset({REGISTER, HEARTBEAT, REPORT})
# Any client request may come through a relay, which adds the uid it proved.
for _request in CLIENT_REQUESTS:
    SCHEMAS[_request][AS_UID] = (_INT, False)
    SCHEMAS[_request][AS_TOKEN] = (_STR, False)
HEAD_TO_NODE = frozenset({LAUNCH, KILL, ACK, REREGISTER})


class PackedItems(list):  # type: ignore[type-arg]
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


def decode(frame: bytes, allowed: frozenset[str] | None = None) -> dict[str, Any]:
    """A validated message, or ProtocolError saying exactly what is wrong with it."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(frame)} bytes is over the {MAX_MESSAGE_BYTES} limit")
    try:
        msg = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"undecodable message: {type(exc).__name__}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
    if type(msg.get("v")) is not int or msg["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {msg.get('v')!r} not supported "
                            f"(this peer speaks {PROTOCOL_VERSION})")
    msg_type = msg.get("type")
    if not isinstance(msg_type, str) or msg_type not in SCHEMAS or (
            allowed is not None and msg_type not in allowed):
        raise ProtocolError(f"unknown message type {msg_type!r}")
    check(msg, SCHEMAS[msg_type], msg_type)
    return msg


def check(obj: dict[str, Any], schema: Schema, what: str) -> None:
    """Raise ProtocolError unless `obj` has the schema's required fields with the right types."""
    for key, (types, required) in schema.items():
        if key not in obj:
            if required:
                raise ProtocolError(f"{what}: missing field {key!r}")
            continue
        value = obj[key]
        kind = type(value)
        # The usual cases first, each checked as the general code below would, for speed: a
        # bulk submit checks some thirty fields of each of thousands of specs.
        if kind is str and str in types:
            if len(value) > (MAX_SCRIPT if key == "script" else MAX_STR):
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
        # bool is an int in Python; never accept it where a number is meant.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ProtocolError(f"{what}: field {key!r} has type {type(value).__name__}")
        if isinstance(value, str) and len(value) > (MAX_SCRIPT if key == "script" else MAX_STR):
            raise ProtocolError(f"{what}: field {key!r} is too long")
        _check_value(key, value, what)


def _check_value(key: str, value: Any, what: str) -> None:
    """Ranges, list items and characters: what a type check alone lets through."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ProtocolError(f"{what}: field {key!r} is not a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and key in RANGES:
        low, high = RANGES[key]
        if not low <= value <= high:
            raise ProtocolError(f"{what}: field {key!r} is {value}, outside {low}..{high}")
    if isinstance(value, str) and "\0" in value and key != "script":
        raise ProtocolError(f"{what}: field {key!r} contains a NUL character")
    if isinstance(value, list):
        if len(value) > MAX_LIST:
            raise ProtocolError(f"{what}: field {key!r} has over {MAX_LIST} items")
        for item in value:  # item types are the handlers' to check (ids, names, specs)
            if isinstance(item, str):
                _check_value(key, item, what)


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
