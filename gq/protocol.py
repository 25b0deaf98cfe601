"""The wire protocol: message types, msgpack encoding, and validation of every incoming message.

A message is one msgpack map with `v` (protocol version), `type`, and the type's fields.
Requests from the CLI carry `rid`; the reply echoes it. Nothing here touches a socket.
"""

from __future__ import annotations

from typing import Any

import msgpack

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

#: Report events a node sends about a job run.
STARTED = "started"
FINISHED = "finished"

_INT = (int,)
_OPT_INT = (int, type(None))
_STR = (str,)
_OPT_STR = (str, type(None))
_NUM = (int, float)
_BOOL = (bool,)
_LIST = (list,)
_OPT_LIST = (list, type(None))
_DICT = (dict,)

#: Field -> (accepted types, required). Strings are also length-checked (MAX_STR).
Schema = dict[str, tuple[tuple[type, ...], bool]]
MAX_STR = 4096
MAX_SCRIPT = 1024 * 1024

SPEC_SCHEMA: Schema = {
    "script": (_STR, True), "name": (_STR, False), "args": (_LIST, False),
    "user": (_STR, False), "uid": (_INT, False), "gid": (_INT, False), "cwd": (_STR, False),
    "env": (_DICT, False), "nodes": (_INT, False), "gpus": (_INT, False),
    "gpu_type": (_OPT_STR, False), "gpu_mem": (_OPT_INT, False), "cpus": (_INT, False),
    "mem": (_INT, False), "time_limit_s": (_OPT_INT, False), "qos": (_OPT_STR, False),
    "output": (_OPT_STR, False), "error": (_OPT_STR, False), "requeue": (_BOOL, False),
    "signal": (_OPT_STR, False),
}

SCHEMAS: dict[str, Schema] = {
    PING: {},
    SUBMIT: {"jobs": (_LIST, True)},
    CANCEL: {"ids": (_LIST, True), "user": (_OPT_STR, False)},
    QUEUE: {"user": (_OPT_STR, False), "states": (_OPT_LIST, False), "all": (_BOOL, False)},
    SHOW: {"id": (_INT, True)},
    NODES: {},
    WAIT: {"ids": (_LIST, True), "park_s": (_NUM, False)},
    DRAIN: {"nodes": (_LIST, True), "reason": (_STR, True)},
    RESUME: {"nodes": (_LIST, True)},
    # running: [job_id, restart] of every run the node holds, alive or ended with its report
    # not yet acked; the head requeues a run it knows started there and that is missing.
    REGISTER: {"node": (_STR, True), "gpus": (_LIST, True), "cpus": (_INT, True),
               "mem": (_INT, True), "running": (_LIST, True), "gpu_source": (_STR, False),
               "addr": (_STR, False)},
    HEARTBEAT: {"node": (_STR, True), "telemetry": (_DICT, False), "health": (_LIST, False)},
    REPORT: {"node": (_STR, True), "seq": (_INT, True), "job_id": (_INT, True),
             "restart": (_INT, True), "event": (_STR, True), "state": (_OPT_STR, False),
             "exit_code": (_OPT_INT, False), "time": (_NUM, True)},
    LAUNCH: {"job_id": (_INT, True), "restart": (_INT, True), "spec": (_DICT, True),
             "gpus": (_LIST, True), "rank": (_INT, True), "nodelist": (_LIST, True),
             "time_limit_s": (_INT, True), "stdout": (_STR, True), "stderr": (_STR, True),
             "job": (_DICT, True), "grace_s": (_NUM, False), "checkpoint_dir": (_STR, False),
             "master_addr": (_STR, False)},
    # signal: KILL (at once), or a name (TERM, USR1 ...) sent to the job's process group (only
    # its top process with batch_only), then SIGKILL after grace_s (default: the launch's grace_s).
    KILL: {"job_id": (_INT, True), "restart": (_INT, True), "signal": (_STR, False),
           "batch_only": (_BOOL, False), "grace_s": (_NUM, False)},
    ACK: {"seq": (_INT, True)},
    REREGISTER: {},
    REPLY: {"rid": (_INT, True), "ok": (_BOOL, True)},
}

CLIENT_REQUESTS = frozenset({PING, SUBMIT, CANCEL, QUEUE, SHOW, NODES, WAIT, DRAIN, RESUME})
NODE_MESSAGES = frozenset({REGISTER, HEARTBEAT, REPORT})
HEAD_TO_NODE = frozenset({LAUNCH, KILL, ACK, REREGISTER})


def encode(msg_type: str, **fields: Any) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "type": msg_type, **fields}, use_bin_type=True)


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
        # bool is an int in Python; never accept it where a number is meant.
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise ProtocolError(f"{what}: field {key!r} has type {type(value).__name__}")
        if isinstance(value, str) and len(value) > (MAX_SCRIPT if key == "script" else MAX_STR):
            raise ProtocolError(f"{what}: field {key!r} is too long")


def check_spec(spec: Any) -> dict[str, Any]:
    """A job spec's shape (types and lengths); the head checks meaning (ranges, QOS) itself."""
    if not isinstance(spec, dict):
        raise ProtocolError("job spec is not a map")
    check(spec, SPEC_SCHEMA, "job spec")
    if not all(isinstance(a, str) for a in spec.get("args", [])):
        raise ProtocolError("job spec: args must be strings")
    env = spec.get("env", {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ProtocolError("job spec: env must map strings to strings")
    return spec


def ok(rid: int, **data: Any) -> bytes:
    return encode(REPLY, rid=rid, ok=True, **data)


def error(rid: int, code: str, message: str) -> bytes:
    return encode(REPLY, rid=rid, ok=False, code=code, error=message)
