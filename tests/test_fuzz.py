"""Hostile input against the decoder and a live gqd: hypothesis-generated malformed messages,
every field of every message type spoiled in each way it can be (huge ints, NaN, wrong
containers, bad items, deep nesting), and frames that cost the most to unpack, over ipc, TCP and
the node socket of a gqd with 30,000 jobs queued."""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gq import config as config_mod
from gq import defaults, keys, protocol
from gq.client import Client
from gq.errors import ProtocolError, UnreachableError, UsageError
from tests.conftest import LiveCluster, prepare, running, wait_for
from tests.messages import bad_values, hostile_frames, message

#: Messages per hypothesis example (sent together, as a burst), and examples: 12,000 in all.
BURST = 200
EXAMPLES = 60

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1),
                     st.floats(allow_nan=True), st.text(max_size=20), st.binary(max_size=20))
_any = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6)
#: Values of every kind a field may wrongly hold (cheaper to draw from than `_any`).
_ODD = [None, True, False, 0, -1, 2**63 - 1, -2**63, 1.5, math.nan, math.inf, -math.inf, "",
        "x", "\0" * 3, "y" * 5000 + "\0", b"", b"\xff", [], [1, "a"], [[None]], {}, {"k": [1]},
        list(range(protocol.MAX_LIST + 1))]
_TYPES = {int: 1, float: 1.5, str: "x", list: [], dict: {}, bool: True, type(None): None}
#: Requests with fields to spoil (ping and nodes have none: their v, type or rid is spoiled).
_KINDS = sorted(protocol.CLIENT_REQUESTS)


def _wrong(value: Any, types: tuple[type, ...]) -> bool:
    """Whether a field of `types` must refuse `value`."""
    if isinstance(value, bool):
        return bool not in types
    if isinstance(value, float) and not math.isfinite(value):
        return True
    if isinstance(value, str) and "\0" in value:
        return True
    if isinstance(value, list) and len(value) > protocol.MAX_LIST:
        return True
    return not isinstance(value, types)


def _valid_value(types: tuple[type, ...]) -> Any:
    return _TYPES[types[0]]


@st.composite
def _spoiled_request(draw: st.DrawFn) -> dict[str, Any]:
    """A client request that is right but for one thing."""
    kind = draw(st.sampled_from(_KINDS))
    schema = protocol.SCHEMAS[kind]
    msg: dict[str, Any] = {"v": protocol.PROTOCOL_VERSION, "type": kind, "rid": 1}
    msg.update({k: _valid_value(types) for k, (types, _) in schema.items()})
    how = draw(st.sampled_from(["field", "missing", "version", "type", "rid", "spec"]))
    if how == "field" and schema:
        key = draw(st.sampled_from(sorted(schema)))
        types = schema[key][0]
        msg[key] = draw(st.sampled_from([v for v in _ODD if _wrong(v, types)]))
    elif how == "missing" and any(req for _, req in schema.values()):
        msg.pop(draw(st.sampled_from(sorted(k for k, (_, r) in schema.items() if r))))
    elif how == "version":
        msg["v"] = draw(st.sampled_from([v for v in _ODD if v != protocol.PROTOCOL_VERSION]))
    elif how == "type":
        msg["type"] = draw(st.one_of(st.sampled_from(_ODD), st.sampled_from(
            sorted(protocol.SCHEMAS.keys() - protocol.CLIENT_REQUESTS))))
    elif how == "rid":
        msg["rid"] = draw(st.one_of(st.integers(-2**63, -1), st.text(max_size=5), st.none()))
    else:
        spec = {"script": "#!/bin/sh\ntrue\n", "cwd": "/tmp"}
        key = draw(st.sampled_from(sorted(protocol.SPEC_SCHEMA)))
        types = protocol.SPEC_SCHEMA[key][0]
        spec[key] = draw(st.sampled_from([v for v in _ODD if _wrong(v, types)] + (
            [{"A=B": "x"}, {"A": "\0"}] if key == "env" else [-2] if int in types else [])))
        msg = {"v": protocol.PROTOCOL_VERSION, "type": protocol.SUBMIT, "rid": 1, "jobs": [spec]}
    return msg


_frames = st.one_of(
    st.binary(max_size=64),                                    # not msgpack at all
    _any.map(lambda v: msgpack.packb(v, use_bin_type=True)),    # msgpack, but not a request
    _spoiled_request().map(lambda m: msgpack.packb(m, use_bin_type=True)),
)


@settings(max_examples=1000, deadline=None, database=None)
@given(_frames)
def test_the_decoder_raises_only_protocol_errors(frame: bytes) -> None:
    try:
        protocol.decode(frame, protocol.CLIENT_REQUESTS)
    except ProtocolError:
        pass


def _send_burst(sock: zmq.Socket, frames: list[bytes]) -> list[dict[str, Any]]:
    for frame in frames:
        sock.send(frame)
    replies: list[dict[str, Any]] = []
    while len(replies) < len(frames):
        assert sock.poll(30_000), f"gqd answered {len(replies)} of {len(frames)} messages"
        replies.append(msgpack.unpackb(sock.recv(), raw=False))
    return replies


def test_ten_thousand_malformed_messages_leave_gqd_serving(cluster: LiveCluster) -> None:
    pid = cluster.head_pid()
    ipc = next(ep for ep in cluster.config().head.client_endpoints if ep.startswith("ipc://"))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    sock.connect(ipc)
    sent = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_frames, min_size=BURST, max_size=BURST))
    def burst(frames: list[bytes]) -> None:
        replies = _send_burst(sock, frames)
        sent.append(len(frames))
        refused = [r for r in replies if r.get("ok") is False]
        # Every message that is not valid protocol got an error reply (the rest were harmless
        # requests that happened to be well-formed, e.g. a cancel of no jobs).
        malformed = sum(1 for f in frames if _malformed(f))
        assert len(refused) >= malformed and all(r["error"] for r in refused)

    try:
        burst()
        assert sum(sent) >= 10_000
        # Bigger than the limit: libzmq drops the connection before gqd ever sees it.
        huge = zmq.Context.instance().socket(zmq.DEALER)
        huge.linger = 0
        huge.connect(ipc)
        huge.send(b"\x00" * (defaults.MAX_MESSAGE_BYTES + 1))
        huge.close()
        # Still the same gqd, and it serves valid requests.
        assert _send_burst(sock, [protocol.encode(protocol.PING, rid=7)])[0]["ok"] is True
    finally:
        sock.close()
    assert cluster.head_pid() == pid
    job = cluster.submit("--wrap", "true")
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
    wait_for(lambda: cluster.gq("queue").returncode == 0, "gq queue to work")


def _malformed(frame: bytes) -> bool:
    try:
        msg = protocol.decode(frame, protocol.CLIENT_REQUESTS)
    except ProtocolError:
        return True
    return not isinstance(msg.get("rid"), int) or msg["rid"] < 0


@pytest.mark.parametrize("field,value", [
    ("park_s", float("nan")), ("park_s", float("inf")), ("id", -5), ("id", 0),
    ("ids", list(range(protocol.MAX_LIST + 1))), ("reason", "a\0b")])
def test_strict_fields_are_refused(field: str, value: Any) -> None:
    kind = {"park_s": "wait", "id": "show", "ids": "cancel", "reason": "drain"}[field]
    msg = {"v": protocol.PROTOCOL_VERSION, "type": kind, "rid": 1, "ids": [], "nodes": [],
           "reason": "r", "id": 1, field: value}
    with pytest.raises(ProtocolError):
        protocol.decode(msgpack.packb(msg), protocol.CLIENT_REQUESTS)


def test_job_spec_env_and_paths_are_checked() -> None:
    base = {"script": "#!/bin/sh\n", "cwd": "/tmp"}
    for bad in ({"env": {"A=B": "x"}}, {"env": {"A": "x\0y"}}, {"cwd": "/tmp\0/x"},
                {"output": "out\0"}, {"args": ["a\0"]}, {"uid": -2}, {"time_limit_s": -1}):
        with pytest.raises(ProtocolError):
            protocol.check_spec({**base, **bad})
    assert protocol.check_spec({**base, "env": {"BASH_FUNC_ml%%": "() { :; }"}})


# ---------------------------------------------------------------- every field, a big queue

#: Jobs queued (held: a pass has nothing to start) while the hostile requests arrive.
QUEUED = 30_000


def _raw(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def _spoiled(kinds: frozenset[str]) -> list[dict[str, Any]]:
    """Every message of `kinds` with one field spoiled, in each way bad_values knows."""
    return [message(kind, **{field: value}) for kind in sorted(kinds)
            for field in sorted(protocol.SCHEMAS[kind]) for value in bad_values(kind, field)]


def _dealer(endpoint: str, **options: Any) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.connect(endpoint)
    return sock


def _replies(sock: zmq.Socket, frames: list[bytes], burst: int = 100) -> list[dict[str, Any]]:
    """Send `frames` in bursts, collecting a reply to each."""
    out: list[dict[str, Any]] = []
    for at in range(0, len(frames), burst):
        out += _send_burst(sock, frames[at:at + burst])
    return out


def _counts(cluster: LiveCluster) -> dict[str, int]:
    log = cluster.log("gqd")
    return {"internal errors": log.count("internal error"), "reloads": log.count(
        "(a batch of"), "registrations": sum(log.count(f"node {name} registered")
                                             for name in ("node1", "node2")),
        "tracebacks": log.count("Traceback")}


def _node_socket(cluster: LiveCluster, name: str) -> zmq.Socket:
    """A peer on gqd's node socket with a key of its own (as a compromised node has)."""
    keys.keygen(cluster.layout.keys, name)
    own = keys.node_keys(cluster.layout.keys, name)
    return _dealer(cluster.config().node.head, identity=f"{name}/{os.urandom(8).hex()}".encode(),
                   curve_secretkey=own.secret, curve_publickey=own.public,
                   curve_serverkey=own.server)


def test_hostile_requests_and_node_messages_cost_gqd_nothing_with_30000_jobs_queued(
        tmp_path: Path) -> None:
    live = prepare(tmp_path)
    live.configure(lambda cfg: setattr(cfg.auth, "owner", ""))  # TCP callers may read
    with running(live) as cluster, cluster.client() as client:
        client.submit([cluster.spec("#!/bin/sh\ntrue\n", array=f"0-{QUEUED - 1}", hold=True)])
        pid, before = cluster.head_pid(), _counts(cluster)
        endpoints = cluster.config().head.client_endpoints
        ipc, tcp = (next(e for e in endpoints if e.startswith(p)) for p in ("ipc://", "tcp://"))
        requests = [_raw(m) for m in _spoiled(protocol.CLIENT_REQUESTS)]
        sent = 0
        for endpoint, limit in ((ipc, defaults.MAX_MESSAGE_BYTES),
                                (tcp, defaults.MAX_TCP_REQUEST_BYTES)):
            sock = _dealer(endpoint)
            try:
                replies = _replies(sock, requests)
                # Each a bad request naming what is wrong, none an internal error.
                assert all(r["ok"] is False and r["code"] == "protocol" for r in replies), [
                    r for r in replies if r.get("code") != "protocol"][:3]
                sent += len(replies)
                for what, frame, expect in hostile_frames(limit, rid=99):
                    if expect == "dropped":  # libzmq drops it with the connection, unread
                        sock.send(frame)
                        continue
                    [reply] = _send_burst(sock, [frame])
                    assert reply["rid"] == 99 and reply["ok"] is (expect == "ok"), what
                    sent += 1
            finally:
                sock.close()
        # The CLI's side of a dropped connection: a clear error at once, not a wait.
        cfg = cluster.config()
        cfg.client.endpoints = [tcp]
        with Client(cfg) as over_tcp:
            started = time.monotonic()
            with pytest.raises(UnreachableError, match="over TCP may be at most 1048576 bytes"):
                over_tcp.request(protocol.PING, pad=["x" * 700_000] * 2)
            assert time.monotonic() - started < 10
            assert over_tcp.ping()["proven"] is False  # and the next request goes through
        # A request in several frames is answered without its frames being read.
        with contextlib.closing(_dealer(ipc)) as sock:
            sock.send_multipart([b"x" * 1000, b"y" * 1000, protocol.encode(protocol.PING, rid=5)])
            assert sock.poll(30_000)
            assert "one frame, not 3" in msgpack.unpackb(sock.recv_multipart()[-1])["error"]
        # Node messages, from a peer with a valid key: dropped with a log line each.
        node_msgs = [_raw(m) for m in _spoiled(protocol.NODE_MESSAGES)]
        with contextlib.closing(_node_socket(cluster, "fuzznode")) as sock:
            for frame in node_msgs:
                sock.send(frame)
            wait_for(lambda: cluster.log("gqd").count("dropping message from node 'fuzznode'")
                     >= len(node_msgs), f"gqd to drop all {len(node_msgs)} node messages")
        assert sent > 1000 and len(node_msgs) > 100, (sent, len(node_msgs))
        # Still the same gqd, which lost no node, reloaded nothing and still has every job.
        assert cluster.head_pid() == pid
        assert _counts(cluster) == before
        assert all(n["state"] == "UP" for n in cluster.nodes())
        assert len(client.queue(fields=["id"])) == QUEUED
    assert _counts(cluster) == before


def test_the_client_refuses_a_request_over_the_message_limit_before_sending_it() -> None:
    cfg = config_mod.Config(path="none.toml")
    cfg.client.endpoints = ["tcp://127.0.0.1:9"]  # no head there: it is never reached
    spec = {"script": "#!/bin/sh\n" + "#" * (protocol.MAX_SCRIPT - 16), "cwd": "/"}
    with Client(cfg) as client:
        with pytest.raises(UsageError, match="over gq's 16777216-byte"):
            client.submit([spec] * 17)
        with pytest.raises(UsageError, match="at most 10000 jobs, not 10001"):
            client.submit([{"script": "#!/bin/sh\n", "cwd": "/"}] * 10_001)
