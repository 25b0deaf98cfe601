"""The typed messages between gqd and gqnode (gq/messages.py): each declared once, its schema,
encoding and decoding derived from the declaration and agreeing with the wire as it was."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gq import messages, protocol
from gq.errors import ProtocolError
from gq.model import Gpu, JobSpec
from tests.messages import EXAMPLES, bad_values, message

TYPED = sorted(messages.TYPES)


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


@pytest.mark.parametrize("kind", TYPED)
def test_every_example_decodes_to_its_type_and_encodes_back_to_the_same_fields(kind: str):
    msg = protocol.decode_message(_raw(message(kind)), frozenset({kind}))
    assert type(msg) is messages.TYPES[kind] and msg.TYPE == kind
    again = protocol.decode(protocol.encode_message(msg))
    # The same fields as the example, but for what only an older peer sent (a launch's whole
    # job record, of which the typed launch keeps the array task).
    example = EXAMPLES[kind]
    if kind == protocol.LAUNCH:
        # and the run's spec, with its declared defaults filled in
        assert again["spec"].items() >= example["spec"].items()
        example = {**example, "job": {}, "spec": again["spec"]}
    assert {k: v for k, v in again.items() if k not in ("v", "type")} == example
    assert protocol.decode_message(protocol.encode_message(msg), frozenset({kind})) == msg


@pytest.mark.parametrize("kind", TYPED)
def test_a_typed_message_refuses_what_its_map_refuses_with_the_same_words(kind: str):
    for field in sorted(protocol.SCHEMAS[kind]):
        for value in bad_values(kind, field):
            frame = _raw(message(kind, **{field: value}))
            with pytest.raises(ProtocolError) as as_map:
                protocol.decode(frame)
            with pytest.raises(ProtocolError) as typed:
                protocol.decode_message(frame, frozenset({kind}))
            assert str(typed.value) == str(as_map.value)


@pytest.mark.parametrize("kind", TYPED)
def test_what_a_peer_leaves_out_takes_the_declared_default(kind: str):
    """An older peer's message with only the required fields (an older gqd's kill named no
    batch_only, an older gqnode's register no features) reads with the defaults."""
    cls = messages.TYPES[kind]
    required = {k: v for k, v in EXAMPLES[kind].items() if cls.SCHEMA[k][1]}
    msg = protocol.decode_message(protocol.encode(kind, **required), frozenset({kind}))
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in required:
            default = f.default if f.default_factory is dataclasses.MISSING \
                else f.default_factory()
            assert getattr(msg, f.name) == default, f.name


def test_schemas_come_from_the_declarations():
    assert protocol.SCHEMAS[protocol.REPORT]["exit_code"] == ((int, type(None)), False)
    assert protocol.SCHEMAS[protocol.REPORT]["time"] == ((int, float), True)
    assert protocol.SCHEMAS[protocol.REGISTER]["gpus"] == ((list,), True)
    assert messages.GPU_SCHEMA == {"index": ((int,), True), "type": ((str,), True),
                                   "memory": ((int,), True), "uuid": ((str,), False),
                                   "name": ((str,), False)}
    assert set(protocol.RULES[protocol.LAUNCH]) == {"spec", "gpus", "nodelist", "job"}


def test_fields_are_typed_and_frozen():
    reg = protocol.decode_message(_raw(message(protocol.REGISTER)), protocol.NODE_MESSAGES)
    assert isinstance(reg, messages.Register)
    assert reg.gpus == (Gpu(0, "a100", 80 << 30, "GPU-1", "NVIDIA A100"),)
    assert reg.running == ((1, 0), (2, 3)) and reg.features == ("ib", "nvlink")
    with pytest.raises(AttributeError):
        reg.node = "other"  # type: ignore[misc]
    started = messages.Report.from_wire({"node": "n", "seq": 1, "job_id": 2, "restart": 0,
                                         "event": protocol.STARTED, "time": 1.0})
    assert started.state is None and started.exit_code is None
    # Optional fields holding None are left off the wire (absent reads as None).
    assert "state" not in started.wire()


def test_the_launch_carries_the_array_task_and_reads_an_older_gqds_whole_record():
    launch = messages.Launch(1, 0, messages.RunSpec("x"), (0,), 0, ("n1",), 0, "/o", "/e",
                             messages.ArrayTask(7, 3))
    assert protocol.decode(protocol.encode_message(launch))["job"] == {
        "array_job_id": 7, "array_index": 3}
    record = {"id": 1, "state": "RUNNING", "alloc": {"n1": [0]}, "array_job_id": 7,
              "array_index": 3, "spec": {"script": "x"}}
    old = _raw(message(protocol.LAUNCH, job=record))
    assert protocol.decode_message(old, protocol.HEAD_TO_NODE).job == messages.ArrayTask(7, 3)
    with pytest.raises(ProtocolError, match="launch: job: field 'array_index' is -1"):
        protocol.decode_message(_raw(message(protocol.LAUNCH, job={"array_index": -1})),
                                protocol.HEAD_TO_NODE)


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return tuple(value) if isinstance(value, list) else value
    return f.default


def test_the_run_spec_is_the_part_of_a_job_spec_the_node_reads():
    """RunSpec's fields are JobSpec's (name, type, default; a list a tuple on this side)."""
    job = {f.name: f for f in dataclasses.fields(JobSpec)}
    hints, job_hints = typing.get_type_hints(messages.RunSpec), typing.get_type_hints(JobSpec)
    for f in dataclasses.fields(messages.RunSpec):
        assert f.name in job, f.name
        want = tuple[str, ...] if job_hints[f.name] == list[str] else job_hints[f.name]
        assert hints[f.name] == want, f.name
        assert _default(f) == _default(job[f.name]), f.name
    spec = JobSpec(script="#!/bin/sh\n", args=["a"], env={"X": "1"}, uid=5, gid=6, cwd="/w",
                   ntasks=2, dependency="afterok:1", mail_user="u", comment="c")
    run = messages.RunSpec.of(spec)
    assert run == messages.RunSpec.of(spec.to_dict())
    assert (run.args, run.env, run.ntasks) == (("a",), {"X": "1"}, 2)
    launch = messages.Launch(1, 0, run, (0,), 0, ("n1",), 0, "/o", "/e", messages.ArrayTask())
    wire = protocol.decode(protocol.encode_message(launch))["spec"]
    # Only the run's part travels; what an older gqnode reads by key is there.
    assert not {"dependency", "mail_user", "comment", "nodes", "time_limit_s"} & set(wire)
    assert {"script", "uid", "gid", "cwd", "name", "args", "env"} <= set(wire)
    assert {k: v for k, v in spec.to_dict().items() if k in wire} == wire
    # An older gqd sends the whole spec, None fields and all: read as the run's part.
    old = _raw(message(protocol.LAUNCH, spec=spec.to_dict()))
    assert protocol.decode_message(old, protocol.HEAD_TO_NODE).spec == run
    for bad, words in (({"args": [1]}, "'args' must be strings"),
                       ({"env": {"A=B": "x"}}, "'env' must map variable names"),
                       ({"uid": "0"}, "field 'uid'"), ({}, "missing field 'script'")):
        body = {**({"script": "x"} if bad else {}), **bad}
        with pytest.raises(ProtocolError, match=f"launch: spec: .*{words}"):
            protocol.decode_message(_raw(message(protocol.LAUNCH, spec=body)),
                                    protocol.HEAD_TO_NODE)


def test_a_client_request_is_no_typed_message():
    with pytest.raises(ProtocolError, match="not a message between gqd and gqnode"):
        protocol.decode_message(protocol.encode(protocol.PING), protocol.CLIENT_REQUESTS)
    with pytest.raises(ProtocolError, match="unknown message type 'launch'"):
        protocol.decode_message(_raw(message(protocol.LAUNCH)), protocol.NODE_MESSAGES)


_values = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=8),
                    st.lists(st.one_of(st.integers(-9, 2**63), st.text(max_size=3),
                                       st.lists(st.integers(-1, 9), max_size=3)), max_size=3),
                    st.dictionaries(st.text(max_size=4), st.one_of(
                        st.integers(-9, 9), st.floats(allow_nan=True),
                        st.dictionaries(st.text(max_size=3), st.integers(-9, 9), max_size=2)),
                        max_size=2))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(TYPED), st.dictionaries(
    st.sampled_from(sorted({f for k in TYPED for f in protocol.SCHEMAS[k]} | {"x"})), _values,
    max_size=4), st.sets(st.sampled_from(TYPED)))
def test_a_typed_message_decodes_as_its_checked_map_reads(
        kind: str, changes: dict[str, Any], drop: set[str]):
    """decode_message checks and reads in one pass: the same message, or the same refusal,
    as checking the map (decode) and then reading it."""
    msg = message(kind, **changes)
    for name in drop:  # a required field missing, now and then
        msg.pop(next(iter(sorted(protocol.SCHEMAS[name]) or ["x"])), None)
    frame = _raw(msg)
    try:
        expected: Any = messages.read(protocol.decode(frame))
    except ProtocolError as exc:
        expected = str(exc)
    try:
        got: Any = protocol.decode_message(frame, messages.NODE_MESSAGES | messages.HEAD_TO_NODE)
    except ProtocolError as exc:
        got = str(exc)
    assert got == expected


def test_gqd_gqnode_and_the_shepherd_exchange_only_typed_messages():
    """The maps' encode and decode are for client requests and replies alone: every message
    between gqd and gqnode goes through encode_message and from_node / from_head."""
    import re
    from pathlib import Path
    root = Path(protocol.__file__).parent
    for path in sorted(root.rglob("*.py")):
        for line in path.read_text().split("\n"):
            if re.search(r"protocol\.(encode|decode|checked)\(", line):
                where = f"{path.relative_to(root.parent)}: {line.strip()}"
                assert path.parent.name != "node", where
                assert "CLIENT_REQUESTS" in line or "REPLY" in line or \
                    path.name in ("client.py", "link.py"), where
    # Nor do they read a message's fields as a map's.
    for name in ("node/daemon.py", "node/shepherd.py", "node/slurmenv.py", "head/orders.py",
                 "head/jobs.py", "node/steps.py", "node/stepshepherd.py"):
        text = (root / name).read_text()
        assert not re.search(r"\b(msg|launch)(\[\"|\.get\(\")", text), name
