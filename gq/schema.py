"""The checks every field of an incoming message passes: its type, range, length and characters,
and what a container field holds (rules). gq.protocol (client requests, the envelope) and
gq.messages (the typed messages between gqd and gqnode) declare their schemas with these; nothing
here knows a message type.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from gq.defaults import MAX_ARRAY_INDEX, MAX_SUBMIT_SPECS
from gq.errors import ProtocolError
from gq.unpack import clip

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

#: The uid a relay proved for the caller of a request it forwards (SO_PEERCRED on its host),
#: added by the relay to any client request; gqd reads it only from relay connections.
AS_UID = "as_uid"
#: The user's token with which gq api forwards a request (gqd acts as the token's user).
AS_TOKEN = "as_token"

NONE = type(None)
INT = (int,)
OPT_INT = (int, NONE)
STR = (str,)
OPT_STR = (str, NONE)
NUM = (int, float)
OPT_NUM = (int, float, NONE)
#: A job reference: a job id, or "ARRAYID_INDEX" for an array task.
REF = (int, str)
BOOL = (bool,)
LIST = (list,)
OPT_LIST = (list, NONE)
DICT = (dict,)

#: Field -> (accepted types, required). Strings are also length-checked (LENGTHS, else MAX_STR),
#: and RANGES, COUNTS and the NUL check apply to a field of that name wherever it appears;
#: a message's rules (Rules) say what its container fields hold.
Schema = dict[str, tuple[tuple[type, ...], bool]]
if TYPE_CHECKING:
    #: A rule for a field's contents: (field, value, message type) -> None, or ProtocolError.
    Rule = Callable[[str, Any, str], None]
    #: Field -> the rule its value (when not None) passes after its type.
    Rules = dict[str, Rule]
else:
    def __getattr__(name: str) -> object:
        """Rule and Rules for get_type_hints (gq.declare, in gqd and gqnode), made on first
        use: they need typing's Any, which the CLI's requests do not import."""
        if name not in ("Rule", "Rules"):
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from typing import Any
        rule = Callable[[str, Any, str], None]
        globals().update(Rule=rule, Rules=dict[str, rule])
        return globals()[name]
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
I64 = 2**63 - 1
#: What SQLite stores: an int field RANGES does not name may take any of these, a float any
#: finite value.
ANY_INT = (-(2**63), I64)
ANY_FLOAT = (-math.inf, math.inf)
#: Seconds since the epoch a date can show (years 1 to 9999), and durations in seconds.
_TIME = (-62_135_596_800, 253_402_300_799)
_DURATION = (0, 10 * 365 * 86400)
_UID = (-1, 2**32 - 1)
#: Number fields' accepted ranges (inclusive); a list field's int items take their field's.
RANGES: dict[str, tuple[float, float]] = {
    # ids, counters and paging
    "rid": (0, I64), "id": (1, I64), "job_id": (1, I64), "seq": (0, I64),
    "after": (0, I64), "limit": (1, MAX_LIST), "restart": (0, 1_000_000),
    "rank": (0, 65_535), "index": (0, 65_535),
    # who
    "uid": _UID, "gid": _UID, "claim_uid": _UID, AS_UID: _UID,
    # sizes and counts (memory in bytes)
    "nodes": (0, 65_535), "gpus": (0, 65_535), "cpus": (0, 2**31), "mem": (0, I64),
    "gpu_mem": (0, I64), "memory": (0, I64), "retries": (0, 1_000_000),
    "exit_code": (-255, 65_535), "max_rss": (0, I64), "cpu_s": (0, 2**53),
    # times and durations
    "since": _TIME, "until": _TIME, "time": _TIME, "time_limit_s": _DURATION,
    # a spec's --begin: shown as a date in every listing (1e300 made each one fail)
    "begin_time": _TIME,
    "park_s": _DURATION, "grace_s": _DURATION, "head_lease_s": _DURATION,
    "cold_wait_s": _DURATION,
    # a heartbeat's number under a head lease (gq.messages.Heartbeat, Alive)
    "beat": (0, I64),
    "gpus_total": (0, 65_535), "gpus_per_task": (0, 65_535), "ntasks": (0, 2**31),
    "ntasks_per_node": (0, 2**31), "cpus_per_task": (0, 2**31), "cpus_per_gpu": (0, 2**31),
    "mem_per_cpu": (0, I64), "mem_per_gpu": (0, I64), "nice": (-2**31, 2**31),
    # events (gq/head/feed.py): a sequence number, a job's and an array's id
    "job": (1, I64), "array": (1, I64), "expires_s": (1, 3650 * 86400),
    # a launch's array task (gq.messages.ArrayTask)
    "array_job_id": (1, I64), "array_index": (0, MAX_ARRAY_INDEX),
    # job steps (gq/stepwire.py, gq.messages.Step): a step's number, a node's SLURM_NODEID
    "step": (0, 1_000_000), "node_id": (0, 65_535),
}
#: Most items of a list field, where fewer than MAX_LIST make sense.
COUNTS: dict[str, int] = {"jobs": MAX_SUBMIT_SPECS, "states": 64, "fields": 256, "gpus": 1024,
                          "health": 1024, "telemetry": 1024, "running": 10_000,
                          # a heartbeat's checkpoint markers, one a run: as many as runs
                          "checkpoints": 10_000}
#: Most telemetry readings of one GPU (NVML's: util, mem_used, temp).
MAX_READINGS = 32
#: Longest string of a field (or of each item of a list field), where it is not MAX_STR.
LENGTHS: dict[str, int] = {"script": MAX_SCRIPT, "health": MAX_HEALTH_LINE}
#: Any name execve takes (exported bash functions are `BASH_FUNC_name%%`), but no '='.
ENV_NAME = re.compile(r"^[^=\0]{1,1024}$")
#: A job reference as text, as gq.arrays.parse_ref reads it (ASCII digits only).
_REF_TEXT = re.compile(r"\s*([0-9]{1,19})(?:_([0-9]{1,19}))?\s*", re.ASCII)
GPU_INDEX = re.compile(r"[0-9]{1,5}", re.ASCII)


def check(obj: dict[str, Any], schema: Schema, what: str, rules: Rules | None = None) -> None:
    """Raise ProtocolError unless `obj` has the schema's required fields with the right types,
    in range, and holding what `rules` say (`what` names it in the error)."""
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
            low, high = RANGES.get(key, ANY_INT)
            if not low <= value <= high:
                raise ProtocolError(f"{what}: field {key!r} is {value}, outside {low}..{high}")
            continue
        if (value is None and NONE in types) or (kind is bool and bool in types) or (
                kind is dict and dict in types):
            continue
        _check_value(key, value, types, what)
        if kind is list:
            for item in value:  # a spec's args: the rest have rules
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
        low, high = RANGES.get(key, ANY_FLOAT if isinstance(value, float) else ANY_INT)
        if not low <= value <= high:
            raise ProtocolError(f"{what}: field {key!r} is {value}, outside {low}..{high}")
    elif isinstance(value, str):
        if len(value) > LENGTHS.get(key, MAX_STR):
            raise ProtocolError(f"{what}: field {key!r} is too long")
        if "\0" in value and key != "script":
            raise ProtocolError(f"{what}: field {key!r} contains a NUL character")
    elif isinstance(value, list) and len(value) > COUNTS.get(key, MAX_LIST):
        raise ProtocolError(f"{what}: field {key!r} has over {COUNTS.get(key, MAX_LIST)} items")


def check_extras(obj: dict[str, Any], schema: Schema, what: str) -> None:
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

def _bad_item(what: str, key: str, i: int, item: Any, expected: str) -> ProtocolError:
    return ProtocolError(f"{what}: {key}[{i}] is {clip(item)}, not {expected}")


def each_item(types: tuple[type, ...], like: str | None = None) -> Rule:
    """Each item one of `types`, an int in the range (a string no longer than the length) of
    the field `like` (default: the field itself)."""
    expected = " or ".join(t.__name__ for t in types)

    def rule(key: str, value: list[Any], what: str) -> None:
        name = like or key
        if types == STR and all(type(s) is str for s in value):  # the usual case, at once
            if value and (max(map(len, value)) > LENGTHS.get(name, MAX_STR)
                          or "\0" in "".join(value)):
                raise ProtocolError(f"{what}: an item of {key!r} is too long or has a NUL")
            return
        low, high = RANGES.get(name, ANY_INT)
        for i, item in enumerate(value):
            kind = type(item)
            if kind not in types or (kind is int and not low <= item <= high) or (
                    kind is str and (len(item) > LENGTHS.get(name, MAX_STR) or "\0" in item)):
                raise _bad_item(what, key, i, item, f"{expected} (in range, without NUL)")
    return rule


def each_map(schema: Schema) -> Rule:
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


def one_map(schema: Schema, rules: Rules | None = None) -> Rule:
    """A map with `schema`'s fields (holding what `rules` say); others (an older or newer
    peer's) are not read."""
    def rule(key: str, value: dict[str, Any], what: str) -> None:
        check(value, schema, f"{what}: {key}", rules)
    return rule


def int_pairs(first: str, second: str) -> Rule:
    """Each item a list [first, second] of ints in those fields' ranges."""
    (low1, high1), (low2, high2) = RANGES[first], RANGES[second]

    def rule(key: str, value: list[Any], what: str) -> None:
        for i, item in enumerate(value):
            if type(item) is not list or len(item) != 2 or type(item[0]) is not int or \
                    type(item[1]) is not int or not low1 <= item[0] <= high1 or \
                    not low2 <= item[1] <= high2:
                raise _bad_item(what, key, i, item, f"[{first}, {second}]")
    return rule


def refs(key: str, value: Any, what: str) -> None:
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


STRINGS = each_item(STR)
