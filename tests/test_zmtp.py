"""gq's own ZMTP client (gq/zmtp.py), which `gq.client.Client` speaks: against real gqd, and
against fake servers that misbehave on purpose (each must end in a clear error, never a hang)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest

from gq import client as client_mod
from gq import config as config_mod
from gq import defaults, protocol, zmtp
from gq.client import Client
from gq.errors import ProtocolError, UnreachableError
from tests.conftest import LiveCluster

#: The fakes' connect timeout: short, as each "no head" case waits it out.
CONNECT_S = 1.0


# ---------------------------------------------------------------- against real gqd


def test_a_listing_of_two_pages_comes_whole_over_ipc(cluster: LiveCluster) -> None:
    """A full page (5,000 jobs, megabytes in one long frame) and the next one are read whole."""
    first = cluster.submit("--hold", "--array", f"0-{defaults.PAGE_JOBS}", "--wrap", "true")
    with cluster.client() as c:
        jobs = c.queue(fields=["id", "job_id", "state"])
        assert c.ping()["proven"] is True  # the same connection goes on serving
    assert len(jobs) == defaults.PAGE_JOBS + 1
    assert [j["job_id"] for j in jobs] == [f"{first}_{i}" for i in range(defaults.PAGE_JOBS + 1)]
    assert {j["state"] for j in jobs} == {"PENDING"}


# ---------------------------------------------------------------- fake servers


def _client(endpoint: str, timeout_s: float = 5.0) -> Client:
    cfg = config_mod.Config(path="fake.toml")
    cfg.client.endpoints = [endpoint]
    return Client(cfg, timeout_s=timeout_s)


@pytest.fixture(autouse=True)
def _short_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_mod, "CONNECT_TIMEOUT_S", CONNECT_S)


@contextlib.contextmanager
def fake_server(tmp_path: Path, serve: Callable[[socket.socket], None]) -> Iterator[str]:
    """An ipc endpoint whose every connection `serve` handles in a thread, then closes."""
    path = str(tmp_path / "fake.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    listener.settimeout(0.1)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(10)
                with contextlib.suppress(OSError):
                    serve(conn)
                    # Hold the connection until the client is done with it (reads EOF).
                    while conn.recv(65536):
                        pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"ipc://{path}"
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def _exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        assert chunk, "the client hung up"
        data += chunk
    return data


def _frame(conn: socket.socket) -> tuple[int, bytes]:
    flags = _exact(conn, 1)[0]
    size = int.from_bytes(_exact(conn, 8 if flags & zmtp.LONG else 1), "big")
    return flags, _exact(conn, size)


def _handshake(conn: socket.socket) -> None:
    """A ROUTER's side: greetings, then READY both ways."""
    assert _exact(conn, 64)[:10] == b"\xff" + bytes(8) + b"\x7f"
    conn.sendall(zmtp.GREETING)
    flags, body = _frame(conn)
    assert flags & zmtp.COMMAND and body.startswith(b"\x05READY")
    assert b"\x0bSocket-Type\x00\x00\x00\x06DEALER" in body
    conn.sendall(zmtp.command(b"READY", zmtp.properties(**{"Socket-Type": b"ROUTER"})))


def _request_rid(conn: socket.socket) -> int:
    flags, body = _frame(conn)
    assert flags == 0 or flags == zmtp.LONG
    return int(msgpack.unpackb(body)["rid"])


def _message(payload: bytes) -> bytes:
    return zmtp._frame_header(0, len(payload)) + payload


def test_a_ping_from_the_server_is_answered_and_the_reply_still_read(tmp_path: Path) -> None:
    pongs: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        _handshake(conn)
        rid = _request_rid(conn)
        conn.sendall(zmtp.command(b"PING", b"\x00\x0aabc"))
        pongs.append(_frame(conn)[1])
        # A late reply to some earlier request comes first: it is skipped, not taken.
        conn.sendall(_message(protocol.ok(rid + 1000, pong="late")))
        conn.sendall(_message(protocol.ok(rid, version=1, user="x", uid=1, proven=False)))

    with fake_server(tmp_path, serve) as endpoint, _client(endpoint) as c:
        assert c.ping()["user"] == "x"
    assert pongs == [b"\x04PONGabc"]


def test_one_connection_serves_request_after_request(tmp_path: Path) -> None:
    connections = []

    def serve(conn: socket.socket) -> None:
        connections.append(conn)
        _handshake(conn)
        for _ in range(3):
            conn.sendall(_message(protocol.ok(_request_rid(conn), n=len(connections))))

    with fake_server(tmp_path, serve) as endpoint, _client(endpoint) as c:
        assert [c.request("ping")["n"] for _ in range(3)] == [1, 1, 1]


def test_the_next_request_reconnects_when_the_server_closed(tmp_path: Path) -> None:
    connections = []

    def serve(conn: socket.socket) -> None:
        connections.append(conn)
        _handshake(conn)
        conn.sendall(_message(protocol.ok(_request_rid(conn), n=len(connections))))
        conn.shutdown(socket.SHUT_WR)  # as a gqd that stops does

    with fake_server(tmp_path, serve) as endpoint, _client(endpoint) as c:
        assert c.request("ping")["n"] == 1
        deadline = time.monotonic() + 10
        while c._conn is not None and not c._conn.peer_closed() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert c.request("ping")["n"] == 2


def test_a_refusal_in_the_handshake_is_unreachable_at_once(tmp_path: Path) -> None:
    """As gqd answers a caller its ZAP handler refuses: ERROR instead of READY."""
    def serve(conn: socket.socket) -> None:
        _exact(conn, 64)
        conn.sendall(zmtp.GREETING)
        _frame(conn)
        conn.sendall(zmtp.command(b"ERROR", b"\x03400"))

    with fake_server(tmp_path, serve) as endpoint, _client(endpoint) as c:
        started = time.monotonic()
        with pytest.raises(UnreachableError, match="cannot connect to the gq head at ipc://"):
            c.ping()
        assert time.monotonic() - started < CONNECT_S


@pytest.mark.parametrize("garbage, message", [
    (b"HTTP/1.1 400 Bad Request\r\n" + bytes(64), "its greeting is not ZMTP's"),
    (b"\xff" + bytes(8) + b"\x7f\x03\x01" + b"CURVE".ljust(20, b"\0") + bytes(32), "CURVE"),
])
def test_a_server_that_is_not_a_zmtp_null_peer_is_a_protocol_error(
        tmp_path: Path, garbage: bytes, message: str) -> None:
    with fake_server(tmp_path, lambda conn: conn.sendall(garbage)) as endpoint, \
            _client(endpoint) as c, pytest.raises(ProtocolError, match=message):
        c.ping()


@pytest.mark.parametrize("frame, message", [
    (b"\x80\x01x", "frame flags 0x80"),
    (b"\x02" + (defaults.MAX_MESSAGE_BYTES + 1).to_bytes(8, "big"), "over the 16777216 limit"),
    (b"\x02" + (2**63).to_bytes(8, "big"), "over the 16777216 limit"),
    (b"\x04\x00", "command frame has no name"),
    (b"\x00\x03abc", "undecodable message"),
])
def test_a_malformed_frame_after_the_handshake_is_a_clear_error(
        tmp_path: Path, frame: bytes, message: str) -> None:
    def serve(conn: socket.socket) -> None:
        _handshake(conn)
        _request_rid(conn)
        conn.sendall(frame)

    with fake_server(tmp_path, serve) as endpoint, _client(endpoint) as c, \
            pytest.raises(ProtocolError, match=message):
        c.ping()


def test_a_server_that_never_greets_is_unreachable_within_the_connect_timeout(
        tmp_path: Path) -> None:
    with fake_server(tmp_path, lambda conn: None) as endpoint, _client(endpoint) as c:
        started = time.monotonic()
        with pytest.raises(UnreachableError, match="cannot connect"):
            c.ping()
        assert time.monotonic() - started < CONNECT_S + 1


def test_a_server_that_never_answers_times_out_as_before(tmp_path: Path) -> None:
    with fake_server(tmp_path, _handshake) as endpoint, _client(endpoint, 0.3) as c, \
            pytest.raises(UnreachableError, match="did not answer within 0.3s"):
        c.ping()


@pytest.mark.parametrize("family", ["ipc", "tcp"])
def test_a_head_that_is_not_listening_is_unreachable_within_the_connect_timeout(
        tmp_path: Path, family: str) -> None:
    """A socket left by a dead gqd (ipc), or a port nobody listens on (tcp)."""
    if family == "ipc":
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stale.bind(str(tmp_path / "stale.sock"))
        endpoint = f"ipc://{tmp_path / 'stale.sock'}"
    else:
        stale = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        stale.bind(("127.0.0.1", 0))  # held, never listened on: connecting is refused
        endpoint = f"tcp://127.0.0.1:{stale.getsockname()[1]}"
    with stale, _client(endpoint) as c:
        started = time.monotonic()
        with pytest.raises(UnreachableError, match=f"cannot connect to the gq head at {endpoint}"):
            c.ping()
        assert time.monotonic() - started < CONNECT_S + 1
