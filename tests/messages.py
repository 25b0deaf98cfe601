"""A valid example of every message type with every field, and values each field must refuse:
what tests/test_protocol.py and tests/test_fuzz.py spoil, field by field."""

from __future__ import annotations

import math
from typing import Any

from gq import defaults, protocol, stepwire

#: Every message type with all its fields, each valid.
EXAMPLES: dict[str, dict[str, Any]] = {
    protocol.PING: {"rid": 1, "claim_uid": 1000, "claim_user": "ann"},
    protocol.SUBMIT: {"rid": 2, "jobs": [{"script": "#!/bin/sh\ntrue\n", "cwd": "/tmp"}]},
    protocol.CANCEL: {"rid": 3, "ids": [1, "2_3"], "user": "ann", "signal": "USR1",
                      "batch_only": True, "filter": {"user": "ann", "states": ["PENDING"]}},
    protocol.QUEUE: {"rid": 4, "user": "ann", "states": ["PENDING"], "all": True, "start": False,
                     "fields": ["id", "state"], "after": 0, "limit": 100, "text": False},
    protocol.SHOW: {"rid": 5, "id": "7_1"},
    protocol.NODES: {"rid": 6},
    protocol.WAIT: {"rid": 7, "ids": [1], "park_s": 20.0},
    protocol.DRAIN: {"rid": 8, "nodes": ["node1"], "reason": "bad fan"},
    protocol.RESUME: {"rid": 9, "nodes": ["node1"]},
    protocol.HOLD: {"rid": 10, "ids": [1, 2]},
    protocol.RELEASE: {"rid": 11, "ids": [" 1 "]},
    protocol.REQUEUE: {"rid": 12, "ids": [3]},
    protocol.UPDATE: {"rid": 13, "ids": [1], "time_limit_s": 60, "qos": "normal", "name": "x"},
    protocol.HISTORY: {"rid": 14, "since": 0, "until": 1.7e9, "user": "ann",
                       "states": ["COMPLETED"], "after": 0, "limit": 10, "ids": [1, 2],
                       "partition": "gpu"},
    protocol.ACCOUNTING: {"rid": 15, "since": -86400.0, "until": 1.7e9},
    protocol.TEST_SUBMIT: {"rid": 16, "job": {"script": "#!/bin/sh\ntrue\n", "gpus": 1}},
    protocol.EVENTS: {"rid": 16, "since": 5, "oldest": False, "user": "ann", "job": 1,
                      "array": 2, "kinds": ["job", "node"], "limit": 100, "park_s": 15.0},
    protocol.TOKEN_CREATE: {"rid": 17, "name": "ci", "expires_s": 86400.0, "read_only": True,
                            "user": "ann"},
    protocol.TOKEN_LIST: {"rid": 18, "all": False},
    protocol.TOKEN_REVOKE: {"rid": 19, "ids": [1, 2]},
    stepwire.STEP_LAUNCH: {"rid": 20, "job_id": 1, "argv": ["python", "train.py"],
                           "env": {"PATH": "/bin", "SLURM_JOB_ID": "1"}, "cwd": "/tmp",
                           "ntasks": 4, "nodes": 2, "ntasks_per_node": 2, "gpus_per_task": 1,
                           "cpus_per_task": 2, "kill_on_bad_exit": True, "output": "/tmp/o",
                           "error": None, "name": "train", "label": True,
                           "nodelist": ["node1", "node2"]},
    stepwire.STEP_STATUS: {"rid": 21, "job_id": 1, "step": 0},
    stepwire.STEP_CANCEL: {"rid": 22, "job_id": 1, "step": 3},
    protocol.CHECKPOINT: {"rid": 23, "job_id": 1, "restart": 2},
    protocol.REGISTER: {"node": "node1", "gpus": [{"index": 0, "type": "a100",
                                                   "memory": 80 << 30, "uuid": "GPU-1",
                                                   "name": "NVIDIA A100"}],
                        "cpus": 64, "mem": 512 << 30, "running": [[1, 0], [2, 3]],
                        "gpu_source": "fake", "addr": "10.0.0.1",
                        "features": ["ib", "nvlink"], "head_lease_s": 300.0},
    protocol.HEARTBEAT: {"node": "node1", "health": ["GPU 0: XID 79", "x" * 65536],
                         "telemetry": {"0": {"util": 50, "mem_used": 1 << 30, "temp": 40.5},
                                       "1": {"util": None}},
                         "disk": "no space left on the state disk", "beat": 7,
                         "checkpoints": [{"job_id": 1, "restart": 0, "time": 1.7e9}],
                         "warm": {"0": ["llama-70b", "sdxl"]}},
    protocol.REPORT: {"node": "node1", "seq": 3, "job_id": 1, "restart": 0, "event": "finished",
                      "state": "COMPLETED", "exit_code": 137, "time": 1.7e9, "note": "why",
                      "max_rss": 100 << 20, "cpu_s": 12.5, "step": 0},
    protocol.LAUNCH: {"job_id": 1, "restart": 0, "spec": {"script": "#!/bin/sh\n"},
                      "gpus": [0, 1], "rank": 0, "nodelist": ["node1"], "time_limit_s": 3600,
                      "stdout": "/tmp/o", "stderr": "/tmp/e", "job": {"id": 1}, "grace_s": 10.0,
                      "checkpoint_dir": "", "master_addr": "node1", "cluster": "lab"},
    protocol.KILL: {"job_id": 1, "restart": 0, "signal": "TERM", "batch_only": False,
                    "grace_s": 5, "no_kill": False},
    protocol.ACK: {"seq": 1},
    protocol.REREGISTER: {},
    protocol.ALIVE: {"beat": 7},
    stepwire.STEP: {"job_id": 1, "restart": 0, "step": 2, "argv": ["hostname"],
                    "env": {"A": "1"}, "cwd": "/tmp",
                    "layout": [{"node": "node1", "node_id": 0, "tasks": [[0, 0, [0]]]}],
                    "stdout": "/tmp/o", "stderr": "/tmp/o", "kill_on_bad_exit": False,
                    "master_addr": "node1", "cpus_per_task": 2, "grace_s": 10.0,
                    "label": False},
    stepwire.STEP_KILL: {"job_id": 1, "restart": 0, "step": 2, "signal": "KILL"},
    protocol.REPLY: {"rid": 1, "ok": True},
}
for _kind in protocol.CLIENT_REQUESTS:  # who the caller claims to be, as the client sends it
    # A relay's proven uid and gq api's token are fields of every request too (gqd reads them
    # only from relay connections).
    EXAMPLES[_kind] = {"claim_uid": 1000, "claim_user": "ann", protocol.AS_UID: 1000,
                       protocol.AS_TOKEN: "gq_x", **EXAMPLES[_kind]}

#: Nested lists, deeper than any field may hold.
DEEP: Any = 0
for _ in range(50):
    DEEP = [DEEP]
_I64 = 2**63 - 1
#: A value of each kind, for the kinds a field does not take.
_KINDS: dict[type, Any] = {int: 7, float: 1.5, str: "x", bool: True, list: [1], dict: {"k": 1},
                           type(None): None}
#: Bad items of list fields, by the rule that checks them (values that are valid items of
#: some of these fields are left out where they would be).
_BAD_REFS = [0, -1, _I64 + 1, 2**64 - 1, "x", "1_", "12345678901234567890", "1_99999999999",
             "9223372036854775808_1", "0_1", "٣", "1\0", 1.5, None, True, [1], {"a": 1}, DEEP]
_BAD_STRINGS = [1, None, True, [], {}, "a\0b", DEEP]
_GPU = {"index": 0, "type": "a100", "memory": 1}
_BAD_ITEMS: dict[tuple[str, str], list[Any]] = {
    **{(kind, "ids"): _BAD_REFS for kind in (protocol.CANCEL, protocol.WAIT, protocol.HOLD,
                                             protocol.RELEASE, protocol.REQUEUE, protocol.UPDATE)},
    (protocol.SUBMIT, "jobs"): [1, "x", None, [], DEEP],
    (protocol.TOKEN_REVOKE, "ids"): [0, -1, _I64 + 1, "1", 1.5, None, True, [1], DEEP],
    (protocol.REGISTER, "gpus"): [1, None, [], {}, {**_GPU, "index": -1},
                                  {**_GPU, "index": 2**63}, {**_GPU, "memory": math.nan},
                                  {**_GPU, "type": ["a"]}, {**_GPU, "x": DEEP}, {**_GPU, "x": []},
                                  {"index": 0, "type": "a"}],
    (protocol.REGISTER, "running"): [[1], [1, 2, 3], ["a", 0], [0, 0], [1, -1], [1, 2**63],
                                     [1.0, 0], 1, None, DEEP],
    (protocol.LAUNCH, "gpus"): [-1, 65_536, 2**64 - 1, "0", None, 1.5, [0], DEEP],
    (protocol.CANCEL, "filter"): [{"uid": 1}, {"user": 5}, {"states": "PENDING"},
                                  {"states": [1]}, {"nodes": [None]}, {"name": DEEP}],
    (protocol.HISTORY, "ids"): [[0], [-1], [2**63], ["1"], [1.5], [None], [True]],
    (protocol.HEARTBEAT, "checkpoints"): [1, None, [], {}, {"job_id": 0, "restart": 0, "time": 1},
                                          {"job_id": 1, "restart": -1, "time": 1},
                                          {"job_id": 1, "restart": 0, "time": math.nan},
                                          {"job_id": 1, "restart": 0}, {"job_id": "1"},
                                          {"job_id": 1, "restart": 0, "time": 1, "x": []}],
    (protocol.REGISTER, "features"): [[1], [None], ["a\0b"], [[]], ["x" * 5000]],
    **{(kind, "argv"): [1, None, True, [], {}, "a\0b", DEEP, "y" * (stepwire.MAX_ARG + 1)]
       for kind in (stepwire.STEP_LAUNCH, stepwire.STEP)},
    (stepwire.STEP, "layout"): [1, None, {}, DEEP, {"node": 1, "node_id": 0, "tasks": []},
                                {"node": "n", "node_id": -1, "tasks": []},
                                {"node": "n", "node_id": 0, "tasks": [[0, 0]]},
                                {"node": "n", "node_id": 0, "tasks": [[0, -1, []]]},
                                {"node": "n", "node_id": 0, "tasks": [[0, 0, [-1]]]},
                                {"node": "n", "node_id": 0, "tasks": [[0, 0, ["0"]]]}],
}


def bad_values(kind: str, field: str) -> list[Any]:
    """Values `field` of a `kind` message must refuse: wrong types, numbers out of range or
    not finite, strings too long or with NUL, lists too long or with bad items, deep nesting."""
    types, _ = protocol.SCHEMAS[kind][field]
    bad = [v for t, v in _KINDS.items() if t not in types and not (t is int and float in types)]
    if int in types or float in types:
        low, high = protocol.RANGES.get(field, (-(2**63), _I64))
        bad += [v for v in (low - 1, high + 1, 2**64 - 1, -(2**63)) if not low <= v <= high
                and -(2**63) <= v <= 2**64 - 1]
    if float in types:
        bad += [math.nan, math.inf, -math.inf, float(high) * 2 + 1]
    if str in types:
        limit = protocol.LENGTHS.get(field, protocol.MAX_STR)
        bad += ["x" * (limit + 1)] + ([] if field == "script" else ["a\0b"])
    if field == "id" and kind == protocol.SHOW:
        bad += [b for b in _BAD_REFS if not isinstance(b, (list, dict, float, type(None)))]
    if list in types:
        count = protocol.COUNTS.get(field, protocol.MAX_LIST)
        rule = protocol.RULES.get(kind, {}).get(field)
        items = _BAD_ITEMS.get((kind, field), _BAD_STRINGS + [
            "y" * (protocol.LENGTHS.get(field, protocol.MAX_STR) + 1)] if rule else [DEEP])
        bad += [[item] for item in items] + [[EXAMPLES[kind][field][0]] * (count + 1)]
    if dict in types:
        bad += [{"k": DEEP}] if field == "telemetry" else []
    if field == "telemetry":
        bad += [{"0": 1}, {"x": {}}, {"٣": {}}, {"0": {"util": "50"}}, {"0": {"index": 1}},
                {"0": {"util": math.nan}}, {"0": {"util": 2**63}}, {"0": {"u" * 65: 1}},
                {"0": {f"r{i}": 1 for i in range(protocol.MAX_READINGS + 1)}},
                {str(i): {} for i in range(protocol.COUNTS["telemetry"] + 1)}]
    if field == "warm":
        bad += [{"0": "llama"}, {"x": ["a"]}, {"0": [1]}, {"0": [""]}, {"0": ["a" * 5000]},
                {"0": ["k"] * 257}, {str(i): [] for i in range(protocol.COUNTS["telemetry"] + 1)}]
    return bad


def message(kind: str, **changes: Any) -> dict[str, Any]:
    """EXAMPLES[kind] as a full message, with `changes`."""
    return {"v": defaults.PROTOCOL_VERSION, "type": kind, **EXAMPLES[kind], **changes}


def _deep(item: bytes, size: int) -> bytes:
    """Lists of 99,999 `item`s each, each holding the next, filling `size` bytes: msgpack
    builds every item before it finishes the outermost list."""
    per = protocol.MAX_LIST - 1
    level = b"\xdd" + (per + 1).to_bytes(4, "big") + item * per
    return level * ((size - 64) // len(level)) + b"\xc0"


def hostile_frames(limit: int, rid: int) -> list[tuple[str, bytes, str]]:
    """(what, frame, "error" | "ok" | "dropped") for a socket taking frames of up to `limit`
    bytes: frames just under it that cost the most to unpack (empty maps, nils, tiny strings
    refused at the last byte), a harmless one as big, and one byte over."""
    head = b"\x84\xa1v\x01\xa4type\xa4ping\xa3rid\xcf" + rid.to_bytes(8, "big") + b"\xa3pad"
    per = protocol.MAX_LIST - 1
    maps = b"\xdd" + per.to_bytes(4, "big") + b"\x80" * per
    count = (limit - 64) // len(maps)
    strings = _deep(b"\xa2ab", limit)[:-1] + b"\xdd\x7f\xff\xff\xff"  # a list header past any limit
    pad = ["x" * min(protocol.MAX_SCRIPT, limit - 256)] * max(1, (limit - 256) // protocol.MAX_SCRIPT)
    return [
        ("empty maps", head + b"\xdd" + count.to_bytes(4, "big") + maps * count, "error"),
        ("nils, nested", head + _deep(b"\xc0", limit), "error"),
        ("tiny strings, nested, refused at the end", head + strings, "error"),
        ("long strings", protocol.encode(protocol.PING, rid=rid, pad=pad), "ok"),
        ("one byte over", b"\x81" + b"\xc0" * limit, "dropped"),
    ]


def junk(seed: int, n: int) -> list[bytes]:
    """`n` frames of the kinds the hypothesis fuzz draws, from a seeded generator (for scripts):
    random bytes, msgpack that is no message, and messages of a random type with random
    fields of random values."""
    import random

    import msgpack
    rng = random.Random(seed)
    scalars = [None, True, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, math.nan, math.inf, "",
               "x", "a\0b", b"\xff", "y" * 5000]

    def value(depth: int = 0) -> Any:
        kind = rng.random()
        if depth < 3 and kind < 0.15:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        if depth < 3 and kind < 0.3:
            return {rng.choice(["a", "ids", "id", "rid"]): value(depth + 1)
                    for _ in range(rng.randint(0, 3))}
        return rng.choice(scalars)
    fields = sorted({f for schema in protocol.SCHEMAS.values() for f in schema})
    frames = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.2:
            frames.append(rng.randbytes(rng.randint(0, 64)))
        elif kind < 0.4:
            frames.append(msgpack.packb(value(), use_bin_type=True))
        else:
            msg = {"v": 1, "type": rng.choice(sorted(protocol.SCHEMAS)), "rid": rng.randint(0, 99)}
            msg.update({rng.choice(fields): value() for _ in range(rng.randint(1, 4))})
            frames.append(msgpack.packb(msg, use_bin_type=True))
    return frames
