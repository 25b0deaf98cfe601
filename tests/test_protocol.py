"""Unit tests for gq.protocol: encoding, decoding and validation of every message type."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gq import defaults, protocol
from gq.defaults import MAX_MESSAGE_BYTES, PROTOCOL_VERSION
from gq.errors import GqError, ProtocolError
from gq.protocol import MAX_SCRIPT, MAX_STR, SCHEMAS, SPEC_SCHEMA, check_spec, decode, encode
from gq.unpack import clip
from tests.messages import DEEP, EXAMPLES, bad_values, message

#: One valid value per accepted type; the first listed type of a field decides.
_SAMPLE: dict[type, Any] = {int: 7, float: 1.5, str: "x", bool: True, list: [1, "a"],
                            dict: {"k": "v"}, type(None): None}

def _valid_fields(schema: protocol.Schema, *, optional: bool = True) -> dict[str, Any]:
    kind = next(k for k, v in SCHEMAS.items() if v is schema)
    return {key: EXAMPLES[kind][key] for key, (_, required) in schema.items()
            if required or optional}


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _msg(msg_type: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "type": msg_type, **fields}


# ---------------------------------------------------------------- round trips


def test_the_examples_hold_every_field_of_every_type():
    assert sorted(EXAMPLES) == sorted(SCHEMAS)
    for kind, schema in SCHEMAS.items():
        assert sorted(EXAMPLES[kind]) == sorted(schema), kind


@pytest.mark.parametrize("msg_type", sorted(SCHEMAS))
@pytest.mark.parametrize("optional", [True, False], ids=["all-fields", "required-only"])
def test_round_trip_every_type(msg_type: str, optional: bool):
    fields = _valid_fields(SCHEMAS[msg_type], optional=optional)
    out = decode(encode(msg_type, **fields))
    assert out == _msg(msg_type, **fields)


def test_round_trip_keeps_extra_fields_and_allowed_passes():
    frame = encode(protocol.REPLY, rid=3, ok=False, code="refused", error="no")
    assert decode(frame, allowed=frozenset({protocol.REPLY})) == _msg(
        protocol.REPLY, rid=3, ok=False, code="refused", error="no")


def test_ok_and_error_replies_decode():
    assert decode(protocol.ok(5, id=42)) == _msg(protocol.REPLY, rid=5, ok=True, id=42)
    assert decode(protocol.error(6, "refused", "nope")) == _msg(
        protocol.REPLY, rid=6, ok=False, code="refused", error="nope")


def test_packed_items_are_sent_as_packed_the_same_bytes_as_the_items():
    """A listing page's records, packed once to measure them, go into the reply as they are."""
    records = [{"id": i, "name": "x" * i, "gpu_ids": {"n": [i]}, "t": None} for i in range(40)]
    parts = [msgpack.packb(r, use_bin_type=True) for r in records]
    items = protocol.PackedItems(records, parts)
    plain = msgpack.packb({"v": PROTOCOL_VERSION, "type": protocol.REPLY, "rid": 9, "ok": True,
                           "jobs": records, "next": 39}, use_bin_type=True)
    assert protocol.ok(9, jobs=items, next=39) == plain
    assert decode(protocol.ok(9, jobs=protocol.PackedItems([], []), next=None))["jobs"] == []
    # Parts that do not match the items (a list changed after packing) are not trusted.
    items.append({"id": 99})
    assert decode(protocol.ok(9, jobs=items))["jobs"] == [*records, {"id": 99}]


def test_float_accepted_where_number_meant_and_none_where_optional():
    msg = decode(encode(protocol.REPORT, node="n", seq=1, job_id=2, restart=0, event="finished",
                        state=None, exit_code=None, time=12.25))
    assert msg["time"] == 12.25 and msg["state"] is None and msg["exit_code"] is None
    assert decode(encode(protocol.WAIT, ids=[1], park_s=3))["park_s"] == 3


def test_bytes_and_unicode_strings_survive():
    msg = decode(encode(protocol.HEARTBEAT, node="gpü-01", blob=b"\x00\xff"))
    assert msg["node"] == "gpü-01"
    assert msg["blob"] == b"\x00\xff"


# ---------------------------------------------------------------- rejections


def test_non_msgpack_bytes_rejected():
    with pytest.raises(ProtocolError, match="undecodable"):
        decode(b"\xc1")  # 0xc1 is never used in msgpack
    with pytest.raises(ProtocolError, match="undecodable"):
        decode(b"")
    with pytest.raises(ProtocolError, match="undecodable"):
        decode(encode(protocol.PING) + b"\x01")  # trailing data


@pytest.mark.parametrize("obj", [[1, 2], "ping", 7, None, b"map"])
def test_non_map_rejected(obj: Any):
    with pytest.raises(ProtocolError, match="not a map"):
        decode(_raw(obj))


@pytest.mark.parametrize("version", [99, 0, "1", None])
def test_wrong_version_rejected(version: Any):
    with pytest.raises(ProtocolError, match=f"protocol version {version!r} not supported"):
        decode(_raw({"v": version, "type": protocol.PING}))


def test_missing_version_rejected():
    with pytest.raises(ProtocolError, match="protocol version None"):
        decode(_raw({"type": protocol.PING}))


@pytest.mark.parametrize("msg_type", ["explode", "", 5, None, ["ping"]])
def test_unknown_type_rejected(msg_type: Any):
    with pytest.raises(ProtocolError, match="unknown message type"):
        decode(_raw({"v": PROTOCOL_VERSION, "type": msg_type}))


def test_missing_type_rejected():
    with pytest.raises(ProtocolError, match="unknown message type None"):
        decode(_raw({"v": PROTOCOL_VERSION}))


def test_type_outside_allowed_set_rejected():
    frame = encode(protocol.KILL, job_id=1, restart=0)
    assert decode(frame, allowed=protocol.HEAD_TO_NODE)["type"] == protocol.KILL
    with pytest.raises(ProtocolError, match="'kill'"):
        decode(frame, allowed=protocol.CLIENT_REQUESTS)
    with pytest.raises(ProtocolError, match="'register'"):
        decode(encode(protocol.REGISTER, **_valid_fields(SCHEMAS[protocol.REGISTER])),
               allowed=protocol.HEAD_TO_NODE)


@pytest.mark.parametrize("msg_type", sorted(t for t, s in SCHEMAS.items()
                                            if any(req for _, req in s.values())))
def test_each_missing_required_field_rejected(msg_type: str):
    schema = SCHEMAS[msg_type]
    for key, (_, required) in schema.items():
        if not required:
            continue
        fields = _valid_fields(schema)
        del fields[key]
        with pytest.raises(ProtocolError, match=f"{msg_type}: missing field '{key}'"):
            decode(encode(msg_type, **fields))


@pytest.mark.parametrize("msg_type,key,value,type_name", [
    (protocol.SHOW, "id", [1], "list"),  # a job id, or "123_7" for an array task
    (protocol.SHOW, "id", 1.0, "float"),
    (protocol.SHOW, "id", None, "NoneType"),
    (protocol.KILL, "job_id", True, "bool"),  # bool is an int in Python; must not pass as one
    (protocol.REPORT, "time", False, "bool"),  # nor as a number
    (protocol.REPORT, "exit_code", True, "bool"),
    (protocol.SUBMIT, "jobs", {"a": 1}, "dict"),
    (protocol.CANCEL, "user", 5, "int"),
    (protocol.QUEUE, "all", 1, "int"),  # an int is not a bool either
    (protocol.REGISTER, "node", b"n1", "bytes"),
    (protocol.HEARTBEAT, "telemetry", [], "list"),
    (protocol.REPLY, "ok", "yes", "str"),
])
def test_wrong_field_type_rejected(msg_type: str, key: str, value: Any, type_name: str):
    fields = {**_valid_fields(SCHEMAS[msg_type]), key: value}
    with pytest.raises(ProtocolError, match=f"{msg_type}: field '{key}' has type {type_name}"):
        decode(encode(msg_type, **fields))


def test_over_long_string_rejected():
    ok_fields = _valid_fields(SCHEMAS[protocol.HEARTBEAT])
    assert decode(encode(protocol.HEARTBEAT, **{**ok_fields, "node": "n" * MAX_STR}))
    with pytest.raises(ProtocolError, match="heartbeat: field 'node' is too long"):
        decode(encode(protocol.HEARTBEAT, **{**ok_fields, "node": "n" * (MAX_STR + 1)}))


def test_oversized_frame_rejected_before_decoding():
    # Valid msgpack, one byte over the limit: the size check must come first.
    frame = encode(protocol.PING)
    pad = b"x" * (MAX_MESSAGE_BYTES + 1 - len(frame) - 6)
    big = encode(protocol.PING, pad=pad)
    assert len(big) > MAX_MESSAGE_BYTES
    with pytest.raises(ProtocolError, match=f"over the {MAX_MESSAGE_BYTES} limit"):
        decode(big)


def test_frame_at_limit_is_accepted():
    # No one string may be over MAX_SCRIPT: sixteen of them come to the limit.
    def frame(last: int) -> bytes:
        return encode(protocol.PING, pad=["x" * MAX_SCRIPT] * 15 + ["y" * last])
    last = 100_000 + MAX_MESSAGE_BYTES - len(frame(100_000))
    assert len(frame(last)) == MAX_MESSAGE_BYTES
    assert decode(frame(last))["type"] == protocol.PING


# ---------------------------------------------------------------- job specs


def _spec(**over: Any) -> dict[str, Any]:
    return {"script": "#!/bin/sh\necho hi\n", "args": ["a", "b"], "env": {"A": "1"}, **over}


def test_check_spec_accepts_a_full_spec():
    spec = {key: _SAMPLE[types[0]] for key, (types, _) in SPEC_SCHEMA.items()}
    spec.update(args=["x"], env={"K": "V"})
    assert check_spec(spec) is spec
    assert check_spec(_spec()) == _spec()


def test_check_spec_script_may_be_long_but_bounded():
    assert check_spec(_spec(script="#" * MAX_SCRIPT))
    with pytest.raises(ProtocolError, match="'script' is too long"):
        check_spec(_spec(script="#" * (MAX_SCRIPT + 1)))
    with pytest.raises(ProtocolError, match="'name' is too long"):
        check_spec(_spec(name="n" * (MAX_STR + 1)))


@pytest.mark.parametrize("args", [[1], ["ok", None], [b"bytes"], [["nested"]]])
def test_check_spec_rejects_non_string_args(args: list[Any]):
    with pytest.raises(ProtocolError, match="args must be strings"):
        check_spec(_spec(args=args))


@pytest.mark.parametrize("env", [{"A": 1}, {"A": None}, {"A": b"x"}, {1: "x"}, {"A": ["x"]}])
def test_check_spec_rejects_non_string_env(env: dict[Any, Any]):
    with pytest.raises(ProtocolError, match="env must map strings to strings"):
        check_spec(_spec(env=env))


@pytest.mark.parametrize("spec", [None, [], "script", 1, [("script", "x")]])
def test_check_spec_rejects_non_dict(spec: Any):
    with pytest.raises(ProtocolError, match="job spec is not a map"):
        check_spec(spec)


def test_check_spec_rejects_missing_script_and_bad_types():
    with pytest.raises(ProtocolError, match="missing field 'script'"):
        check_spec({"args": []})
    with pytest.raises(ProtocolError, match="'gpus' has type bool"):
        check_spec(_spec(gpus=True))
    with pytest.raises(ProtocolError, match="'args' has type str"):
        check_spec(_spec(args="a b"))
    with pytest.raises(ProtocolError, match="'requeue' has type int"):
        check_spec(_spec(requeue=0))


def test_protocol_error_is_a_gq_error():
    with pytest.raises(GqError) as info:
        decode(b"\xc1")
    assert info.value.code == "protocol"


# ---------------------------------------------------------------- fuzzing

_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
            | st.floats(allow_nan=True) | st.text(max_size=20) | st.binary(max_size=20))
_objects = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=5),
    max_leaves=12)
_field_names = sorted({k for s in SCHEMAS.values() for k in s} | set(SPEC_SCHEMA))
#: Maps that look like messages, so decoding gets past the envelope and into the schema checks.
_messages = st.builds(
    lambda v, t, fields: {"v": v, "type": t, **fields},
    st.just(PROTOCOL_VERSION) | _scalars,
    st.sampled_from(sorted(SCHEMAS)) | st.text(max_size=8),
    st.dictionaries(st.sampled_from(_field_names), _objects, max_size=8))


def _decode_is_total(frame: bytes, allowed: frozenset[str] | None = None) -> None:
    try:
        msg = decode(frame, allowed)
    except ProtocolError as exc:
        assert str(exc)
        return
    assert isinstance(msg, dict)
    assert msg["type"] in SCHEMAS
    assert allowed is None or msg["type"] in allowed


_FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_FUZZ
@given(st.binary(max_size=200))
def test_decode_arbitrary_bytes(frame: bytes):
    _decode_is_total(frame)


@_FUZZ
@given(_objects | _messages)
def test_decode_arbitrary_msgpack_objects(obj: Any):
    _decode_is_total(_raw(obj))


@_FUZZ
@given(_messages, st.sets(st.sampled_from(sorted(SCHEMAS))).map(frozenset))
def test_decode_message_like_maps_with_allowed(obj: dict[str, Any], allowed: frozenset[str]):
    _decode_is_total(_raw(obj), allowed)


@_FUZZ
@given(_objects)
def test_check_spec_arbitrary_objects(obj: Any):
    try:
        assert check_spec(obj) is obj
    except ProtocolError:
        pass


@pytest.mark.parametrize("field,value,error", [
    ("gpus", 70_000, "'gpus' is 70000, outside 0..65535"), ("uid", -2, "'uid' is -2, outside"),
    ("gpus", True, "'gpus' has type bool"), ("hold", 1, "'hold' has type int"),
    ("name", "a\0b", "'name' contains a NUL character"), ("gpu_type", None, None),
    ("qos", 3, "'qos' has type int"), ("env", [], "'env' has type list"),
    ("begin_time", float("nan"), "'begin_time' is not a finite number"),
    ("begin_time", 1e300, "'begin_time' is 1e.300, outside"),
    ("gpus", 65_535, None), ("begin_time", 5, None), ("script", "#!\0", None)])
def test_check_spec_tests_each_kind_of_field(field: str, value: Any, error: str | None):
    """The common types take a shorter way through `check`; the verdicts are the same."""
    if error is None:
        assert check_spec(_spec(**{field: value}))[field] is value
    else:
        with pytest.raises(ProtocolError, match=error.replace("(", r"\(")):
            check_spec(_spec(**{field: value}))


def test_check_spec_env_names_and_values():
    assert check_spec(_spec(env={"BASH_FUNC_f%%": "() { :; }", "A": "", "N" * 1024: "v"}))
    for env in ({"": "x"}, {"A=B": "x"}, {"A\0": "x"}, {"N" * 1025: "v"}, {"A": "\0"},
                {"A": "v" * (MAX_STR * 8 + 1)}):
        with pytest.raises(ProtocolError, match="env has a bad name"):
            check_spec(_spec(env=env))


# ---------------------------------------------------------------- ranges, contents, bounds


def _cases() -> list[tuple[str, str, int]]:
    return [(kind, field, i) for kind in sorted(SCHEMAS) for field in sorted(SCHEMAS[kind])
            for i in range(len(bad_values(kind, field)))]


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_field_of_every_type_refuses_what_it_cannot_hold(kind: str):
    """Huge and negative ints, NaN and infinities, wrong containers, bad list items, deep
    nesting, over-long strings: each refused as a bad message naming the field, never a
    crash (before, an accounting request with since=2**63 reached SQLite)."""
    for field in sorted(SCHEMAS[kind]):
        for value in bad_values(kind, field):
            frame = _raw(message(kind, **{field: value}))
            with pytest.raises(ProtocolError) as info:
                decode(frame)
            text = str(info.value)
            # named, or a message-wide limit (msgpack's header limits, the container budget)
            assert field in text or "lists and maps" in text or "exceeds max_" in text, (
                field, clip(value), text)
            assert len(text) < 300, text


def test_the_valid_examples_pass_and_edge_values_too():
    for kind in SCHEMAS:
        assert decode(_raw(message(kind)))["type"] == kind
    edges = [(protocol.ACCOUNTING, "since", -62_135_596_800), (protocol.ACCOUNTING, "until",
             253_402_300_799.0), (protocol.SHOW, "id", 2**63 - 1), (protocol.SHOW, "id",
             "9223372036854775807_9999999"), (protocol.PING, "claim_uid", 2**32 - 1),
             (protocol.REPORT, "exit_code", -255), (protocol.QUEUE, "limit", protocol.MAX_LIST),
             (protocol.SUBMIT, "jobs", [{"script": "x"}] * protocol.MAX_SUBMIT_SPECS),
             (protocol.HEARTBEAT, "health", ["h" * protocol.MAX_HEALTH_LINE])]
    for kind, field, value in edges:
        assert decode(_raw(message(kind, **{field: value})))[field] == value


def test_an_unknown_field_is_kept_but_may_not_nest_deep():
    nested: Any = "leaf"
    for i in range(protocol.MAX_DEPTH):  # lists and maps, 8 deep
        nested = [nested] if i % 2 else {"k": nested}
    assert decode(_raw(message(protocol.PING, later=nested)))["later"] == nested
    with pytest.raises(ProtocolError, match="'later' nests deeper than 8"):
        decode(_raw(message(protocol.PING, later=[nested])))
    fields = {f"f{i}": i for i in range(protocol.MAX_FIELDS - len(message(protocol.PING)))}
    assert decode(_raw(message(protocol.PING, **fields)))
    with pytest.raises(ProtocolError, match="65 fields, over 64"):
        decode(_raw(message(protocol.PING, **fields, one_more=1)))
    # Walking such fields costs as much as what they hold: 10,000 items in all.
    assert decode(_raw(message(protocol.PING, a=[1] * 5000, b={"k": [2] * 4999})))
    with pytest.raises(ProtocolError, match="hold over 10000 items"):
        decode(_raw(message(protocol.PING, a=[1] * 5000, b={"k": [2] * 5000})))


def test_hostile_values_make_short_error_messages():
    for bad in ("t" * MAX_SCRIPT, DEEP, list(range(10_000)), {"a" * 5000: 1}):
        with pytest.raises(ProtocolError) as info:
            decode(_raw({"v": PROTOCOL_VERSION, "type": bad}))
        assert len(str(info.value)) < 200
        with pytest.raises(ProtocolError) as info:
            decode(_raw({"v": bad, "type": "ping"}))
        assert len(str(info.value)) < 200


def _nils_deep(size: int) -> bytes:
    """A map whose one field nests lists of 99,999 nils each, as deep as `size` bytes allow:
    the costliest frame to unpack that the list length limit lets through."""
    per = protocol.MAX_LIST - 1
    levels = (size - 16) // (per + 5)
    body = b"".join(b"\xdd" + (per + 1).to_bytes(4, "big") + b"\xc0" * per
                    for _ in range(levels))
    return b"\x83\xa1v\x01\xa4type\xa4ping\xa3pad" + body + b"\xc0"


def test_msgpack_limits_refuse_long_headers_and_a_flood_of_containers():
    assert decode(_raw(message(protocol.CANCEL, ids=[1] * protocol.MAX_LIST)))
    with pytest.raises(ProtocolError, match="exceeds max_array_len"):
        decode(_raw(message(protocol.CANCEL, ids=[1] * (protocol.MAX_LIST + 1))))
    with pytest.raises(ProtocolError, match="exceeds max_str_len"):
        decode(_raw(message(protocol.PING, pad="x" * (MAX_SCRIPT + 1))))
    with pytest.raises(ProtocolError, match="undecodable"):
        decode(_raw(message(protocol.PING, pad=msgpack.ExtType(1, b"x"))))
    # 16 MiB of empty maps, in lists short enough to pass: msgpack would build 16 million
    # dicts (seconds, a gigabyte); the budget stops it at MAX_CONTAINERS.
    per = protocol.MAX_LIST - 1
    chunk = b"\xdd" + per.to_bytes(4, "big") + b"\x80" * per
    n = (MAX_MESSAGE_BYTES - 64) // len(chunk)
    flood = b"\x84\xa1v\x01\xa4type\xa4ping\xa3rid\x01\xa3pad\xdd" + n.to_bytes(4, "big") + \
        chunk * n
    with pytest.raises(ProtocolError, match=f"over {defaults.MAX_CONTAINERS} lists and maps"):
        decode(flood)
    assert protocol.rid_of(flood) == 1
    with pytest.raises(ProtocolError, match=f"over {defaults.MAX_CONTAINERS} lists and maps"):
        protocol.checked(protocol.unpacking(flood).value())


@pytest.mark.parametrize("frame", [
    _raw(message(protocol.SUBMIT, jobs=[{"script": "#" * 1000, "cwd": "/"}] * 200)),
    _nils_deep(2 * 1024 * 1024), _raw(message(protocol.QUEUE, limit=0)), b"\x81\xa1v",
    _raw(message(protocol.PING)) + b"\x00", b"\x92\x01\x02", b"", b"\xc1"])
def test_unpacking_in_slices_gives_what_decode_gives(frame: bytes):
    slice_bytes = 64 * 1024
    unpacking = protocol.unpacking(frame)
    steps = 1
    while not unpacking.step(slice_bytes):
        steps += 1
    assert unpacking.fed <= steps * slice_bytes
    try:
        expected: Any = decode(frame, protocol.CLIENT_REQUESTS)
    except ProtocolError as exc:
        expected = str(exc)
    try:
        got: Any = protocol.checked(unpacking.value(), protocol.CLIENT_REQUESTS)
    except ProtocolError as exc:
        got = str(exc)
    if isinstance(expected, str):  # the same refusal (msgpack words some of them its way)
        assert isinstance(got, str) and got.split(":")[0] == expected.split(":")[0]
    else:
        assert got == expected
    if len(frame) > slice_bytes and isinstance(expected, dict):
        assert steps >= len(frame) // slice_bytes  # sliced: no step took all of it


def test_rid_of_reads_only_the_start_of_a_frame():
    assert protocol.rid_of(_raw({"v": 1, "type": "queue", "rid": 42, "states": [[]]})) == 42
    assert protocol.rid_of(_raw({"pad": "x" * 70_000, "rid": 42})) == 0  # past the first 64 KiB
    for junk in (b"", b"\xc1", _raw([1, 2]), _raw({"rid": -1}), _raw({"rid": "7"}),
                 _raw({"rid": 2**64 - 1}), b"\x83\xa3rid"):
        assert protocol.rid_of(junk) == 0
