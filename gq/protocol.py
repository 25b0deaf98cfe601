"""The wire protocol: message types, msgpack encoding, and validation of every incoming message.

A message is one msgpack map with `v` (protocol version), `type`, and the type's fields.
Requests from the CLI carry `rid`; the reply echoes it. Nothing here touches a socket.
The messages between gqd and gqnode are typed (gq.messages: decode_message, encode_message);
so are client requests (gq.requests, read in gqd); replies are maps checked against the
schemas here. What each field may hold
(types, ranges, lengths, rules) is checked by gq.schema.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import repeat

import msgpack

from gq import spec as spec_fields
from gq import stepwire, unpack
from gq.defaults import MAX_SUBMIT_SPECS, PROTOCOL_VERSION  # noqa: F401 (tests read them here)
from gq.errors import ProtocolError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

    from gq import messages
    from gq.messages import (  # noqa: F401 (named here too)
        ACK, ALIVE, FINISHED, GPU_SCHEMA, HEAD_TO_NODE, HEARTBEAT, KILL, LAUNCH, MAX_NOTE,
        NODE_MESSAGES, REGISTER, REPORT, REREGISTER, STARTED, Message, usage_fields)
    from gq.schema import Rules
from gq.schema import (  # noqa: F401 (named here too)
    AS_TOKEN, AS_UID, BOOL, COUNTS, DICT, INT, LENGTHS, LIST, MAX_DEPTH, MAX_FIELDS,
    MAX_HEALTH_LINE, MAX_LIST, MAX_READINGS, MAX_SCRIPT, MAX_STR, NUM, OPT_INT, OPT_LIST,
    OPT_STR, RANGES, REF, STR, STRINGS, ENV_NAME, Schema, check, check_extras, each_item,
    refs)
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
#: `gq checkpoint` inside a job: its run saved its progress (gq/head/checkpoints.py).
CHECKPOINT = "checkpoint"
# Head -> client.
REPLY = "reply"

#: A job spec's fields, as gq/spec.py declares them; their ranges (RANGES) hold the bounds
#: it declares (tests/test_spec.py), which `gq.spec.check` applies with its own wording.
SPEC_SCHEMA: Schema = {f.name: (f.types, f.required) for f in spec_fields.FIELDS}
#: What every client request may carry: its id (echoed by the reply), for a caller the kernel
#: cannot vouch for (TCP), who it claims to be, and through a relay the uid the relay proved or
#: (gq api) the user's token (gqd reads those two only on the relay endpoint: gq/head/auth.py).
_CALLER: Schema = {"rid": (INT, False), "claim_uid": (INT, False), "claim_user": (STR, False),
                   AS_UID: (INT, False), AS_TOKEN: (STR, False)}

#: Client requests declared as schemas only, here (each handler gets the checked map): none
#: now. The rest are typed (gq/requests.py: DECLARED), their schemas added when first needed.
_CLIENT_SCHEMAS: dict[str, Schema] = {}
#: The client requests gq/requests.py declares (tests/test_requests.py holds the two to each
#: other), srun's (gq/stepwire.py) among them.
DECLARED = frozenset({PING, SUBMIT, CANCEL, QUEUE, SHOW, NODES, WAIT, DRAIN, RESUME, HOLD,
                      RELEASE, REQUEUE, UPDATE, HISTORY, ACCOUNTING, TEST_SUBMIT, EVENTS,
                      TOKEN_CREATE, TOKEN_LIST, TOKEN_REVOKE, CHECKPOINT, *stepwire.CLIENT_REQUESTS})


#: Message type -> its schema: the replies' and those declared here; the typed messages'
#: (gq.messages: gqd's and gqnode's; gq.requests: the clients') are added from their
#: declarations when first needed (_node_types), so that the CLI, which sends requests and
#: reads replies only, never builds them (~20 ms of every command's start).
#: `protocol.SCHEMAS` (and RULES) from outside are the whole tables.
_SCHEMAS: dict[str, Schema] = {
    **{kind: {**_CALLER, **fields} for kind, fields in _CLIENT_SCHEMAS.items()},
    REPLY: {"rid": (INT, True), "ok": (BOOL, True)},
}

CLIENT_REQUESTS = frozenset(_CLIENT_SCHEMAS) | DECLARED


class PackedItems(list):
    """A message's list field whose items were packed already, one msgpack form each in `parts`:
    encode sends those as they are. (A listing page measures each record's size as it builds
    the page; packing each again in the reply was a third of gqd's time answering it.) A
    listing page's items are those packed forms themselves (gq/head/records.py keeps them, not
    the records): gqd only sends its replies."""

    def __init__(self, items: list[Any], parts: list[bytes]) -> None:
        super().__init__(items)
        self.parts = parts


def packer() -> Callable[[Any], bytes]:
    """A function packing one value as encode does, cheaper than packb for many small values."""
    return msgpack.Packer(use_bin_type=True).pack


def map_header(n: int) -> bytes:
    """The header encode packs before a map of `n` items."""
    return msgpack.Packer(use_bin_type=True).pack_map_header(n)


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
    msg_type = _envelope(msg, allowed)
    check(msg, _SCHEMAS[msg_type], msg_type, _RULES.get(msg_type))
    _bounds(msg, msg_type)
    return msg


def _envelope(msg: Any, allowed: frozenset[str] | None) -> str:
    """The type of a map with this protocol's version and an `allowed` type."""
    if type(msg) is not dict:
        raise ProtocolError("message is not a map")
    if type(msg.get("v")) is not int or msg["v"] != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {clip(msg.get('v'))} not supported "
                            f"(this peer speaks {PROTOCOL_VERSION})")
    msg_type = msg.get("type")
    if isinstance(msg_type, str) and msg_type not in _SCHEMAS:
        _node_types()  # a node message's type (or none)
    if not isinstance(msg_type, str) or msg_type not in _SCHEMAS or (
            allowed is not None and msg_type not in allowed):
        raise ProtocolError(f"unknown message type {clip(msg_type)}")
    return msg_type


def _bounds(msg: dict[str, Any], msg_type: str) -> None:
    """What a message holds beside its schema's fields: few fields, none nested deep."""
    if msg_type != REPLY:  # a reply's data is the client's to read
        if len(msg) > MAX_FIELDS:
            raise ProtocolError(f"{msg_type}: {len(msg)} fields, over {MAX_FIELDS}")
        if not msg.keys() <= _KNOWN[msg_type]:  # else no field is for check_extras to walk
            check_extras(msg, _SCHEMAS[msg_type], msg_type)


def decode_message(frame: bytes | memoryview, allowed: frozenset[str]) -> Message:
    """A typed message (gq.messages) of one of the `allowed` types, or ProtocolError saying
    exactly what is wrong with the frame (as `decode` would)."""
    msg = unpack.unpack(frame, LIMITS)
    msg_type = _envelope(msg, allowed)
    read = _readers.get(msg_type)
    if read is None or msg_type in CLIENT_REQUESTS:  # gq.requests' are read in gqd's handling
        raise ProtocolError(f"{msg_type}: not a message between gqd and gqnode")
    out: Message = read(msg)  # its fields checked as it is read
    _bounds(msg, msg_type)
    return out


def from_node(frame: bytes | memoryview) -> messages.NodeMessage:
    """What a node sends gqd: Register, Heartbeat or Report (else ProtocolError)."""
    _node_types()
    from typing import cast  # here: loaded in gqd and gqnode anyway, not for the CLI
    return cast("messages.NodeMessage", decode_message(frame, _node_messages))


def from_head(frame: bytes | memoryview) -> messages.HeadMessage:
    """What gqd sends a node: Launch, Kill, Ack, Reregister, Step, StepKill or Alive (else
    ProtocolError)."""
    _node_types()
    from typing import cast  # here: loaded in gqd and gqnode anyway, not for the CLI
    return cast("messages.HeadMessage", decode_message(frame, _head_to_node))


def encode_message(msg: Message) -> bytes:
    """A typed message's frame."""
    return msgpack.packb({"v": PROTOCOL_VERSION, "type": msg.TYPE, **msg.wire()},
                         use_bin_type=True)


#: Message type -> field -> what the field holds, checked after its type (node messages' added
#: with their schemas, as _SCHEMAS).
_RULES: dict[str, Rules] = {}
#: Each type's fields, with the envelope's.
_KNOWN = {kind: frozenset({"v", "type", *schema}) for kind, schema in _SCHEMAS.items()}
_loaded = False
#: Set by _node_types, for the daemons' hot path (an import statement in each decode cost
#: ~1.7 µs, a tenth to a third of one): each node message type's reader, and which go which way.
_readers: dict[str, Callable[[dict[str, Any]], Message]] = {}
_node_messages: frozenset[str] = frozenset()
_head_to_node: frozenset[str] = frozenset()


def _node_types() -> None:
    """Add the messages between gqd and gqnode (gq.messages) to the tables, once."""
    global _loaded, _readers, _node_messages, _head_to_node
    if _loaded:
        return
    from gq import declare, messages, requests
    for kind, cls in [*messages.TYPES.items(), *requests.TYPES.items()]:
        _SCHEMAS[kind] = cls.SCHEMA
        if cls.RULES:
            _RULES[kind] = cls.RULES
        _KNOWN[kind] = frozenset({"v", "type", *cls.SCHEMA})
    _readers = declare.READERS  # the same table, so a type declared later is read too
    _node_messages, _head_to_node = messages.NODE_MESSAGES, messages.HEAD_TO_NODE
    _loaded = True


#: Names of gq.messages that are read here too (protocol.HEARTBEAT ...), loaded when asked.
_FROM_MESSAGES = frozenset({
    "ACK", "ALIVE", "FINISHED", "GPU_SCHEMA", "HEAD_TO_NODE", "HEARTBEAT", "KILL", "LAUNCH",
    "MAX_NOTE", "NODE_MESSAGES", "REGISTER", "REPORT", "REREGISTER", "STARTED", "Message",
    "usage_fields"})

if TYPE_CHECKING:
    SCHEMAS = _SCHEMAS
    RULES = _RULES
else:
    def __getattr__(name: str) -> Any:
        """SCHEMAS and RULES whole, and the names of gq.messages, built on first use."""
        if name in ("SCHEMAS", "RULES"):
            _node_types()
            return _SCHEMAS if name == "SCHEMAS" else _RULES
        if name in _FROM_MESSAGES:
            from gq import messages
            return getattr(messages, name)
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    """Every name matches ENV_NAME and no value has a NUL or is over 32 KiB: tested on all
    entries at once, as an environment of a hundred variables comes with each spec."""
    if values and ("\0" in "".join(values) or max(map(len, values)) > MAX_STR * 8):
        return False
    if not names:
        return True
    if max(map(len, names)) > 1024:  # the pattern's own reading of a name this long
        return all(ENV_NAME.match(k) for k in names)
    joined = "".join(names)
    return min(map(len, names)) > 0 and "=" not in joined and "\0" not in joined


def ok(rid: int, **data: Any) -> bytes:
    return encode(REPLY, rid=rid, ok=True, **data)


def error(rid: int, code: str, message: str) -> bytes:
    return encode(REPLY, rid=rid, ok=False, code=code, error=message)
