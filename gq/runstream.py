"""The byte stream of an interactive job (`gq run`, `gq alloc`) between its caller and the job.

The caller listens on a TCP port of its own host, at an address the nodes can reach (the one it
would use towards gqd's node endpoint, or $GQ_RUN_ADDR), and submits the job with that endpoint
and a one-time secret in the job's environment ($GQ_RUN_ENDPOINT, $GQ_RUN_SECRET): it reaches
gqd over the uid-authenticated client socket (or a login host's CURVE relay), the node over
CURVE, and then only the job's own processes (the environment is never shown to other users,
docs/SECURITY.md). The job's agent (gq/runagent.py) connects back, as Slurm's slurmstepd does
to srun. Both sides prove that they hold the secret (HMAC over fresh nonces from each side),
then every frame carries a MAC under a key derived from the secret and both nonces, with a
sequence number a direction: a peer without the secret can neither join nor inject. Frames
are not encrypted (as Slurm's srun I/O is not).

A frame: type (1 byte), payload length (4), payload, MAC (16). A leaf: stdlib only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import select
import socket
import struct
import time

#: Environment names of the endpoint and the secret the caller gives the job.
ENDPOINT_ENV, SECRET_ENV = "GQ_RUN_ENDPOINT", "GQ_RUN_SECRET"
#: Frame types. Caller -> agent: stdin, its end, window size, a signal, quit. Agent -> caller:
#: stdout, stderr, the exit status, the job's environment (gq alloc). Both: heartbeat.
STDIN, STDIN_EOF, WINSIZE, SIGNAL, QUIT = b"i", b"e", b"w", b"s", b"q"
STDOUT, STDERR, EXIT, ENV = b"o", b"r", b"x", b"v"
HEARTBEAT = b"h"
#: Seconds between heartbeats, and of silence after which the peer is taken for gone.
HEARTBEAT_S, LOST_S = 2.0, 20.0
#: Seconds a peer has to complete the handshake.
HANDSHAKE_S = 10.0
MAX_FRAME = 1 << 20
_MAGIC = b"GQRUN1"
_NONCE = 16
_MAC = 16


class StreamError(Exception):
    """The peer failed to authenticate, sent a bad frame, or is gone."""


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = b""
    while len(out) < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            raise StreamError("the peer did not answer in time")
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise StreamError("the peer closed the connection")
        out += chunk
    return out


def _proof(secret: bytes, who: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(secret, who + a + b, hashlib.sha256).digest()


class Stream:
    """One authenticated connection; `send` frames, `feed` what the socket has, `frames`."""

    def __init__(self, sock: socket.socket, key: bytes, caller: bool):
        self.sock, self.key = sock, key
        self.out_dir, self.in_dir = (b"C", b"A") if caller else (b"A", b"C")
        self.out_seq = self.in_seq = 0
        self.buf = b""
        self.last_heard = self.last_sent = time.monotonic()

    @classmethod
    def accept(cls, sock: socket.socket, secret: str) -> Stream:
        """The caller's side of the handshake on an accepted connection."""
        deadline = time.monotonic() + HANDSHAKE_S
        sock.setblocking(True)
        hello = _recv_exact(sock, len(_MAGIC) + _NONCE, deadline)
        if not hello.startswith(_MAGIC):
            raise StreamError("not a gq run agent")
        agent_nonce, nonce = hello[len(_MAGIC):], os.urandom(_NONCE)
        key = secret.encode()
        sock.sendall(nonce + _proof(key, b"caller", agent_nonce, nonce))
        if not hmac.compare_digest(_recv_exact(sock, 32, deadline),
                                   _proof(key, b"agent", agent_nonce, nonce)):
            raise StreamError("the agent does not hold the job's secret")
        return cls(sock, _proof(key, b"key", agent_nonce, nonce), caller=True)

    @classmethod
    def connect(cls, sock: socket.socket, secret: str) -> Stream:
        """The agent's side of the handshake on a connected socket."""
        deadline = time.monotonic() + HANDSHAKE_S
        nonce, key = os.urandom(_NONCE), secret.encode()
        sock.sendall(_MAGIC + nonce)
        reply = _recv_exact(sock, _NONCE + 32, deadline)
        caller_nonce = reply[:_NONCE]
        if not hmac.compare_digest(reply[_NONCE:], _proof(key, b"caller", nonce, caller_nonce)):
            raise StreamError("the caller does not hold the job's secret")
        sock.sendall(_proof(key, b"agent", nonce, caller_nonce))
        return cls(sock, _proof(key, b"key", nonce, caller_nonce), caller=False)

    def _mac(self, direction: bytes, seq: int, head: bytes, payload: bytes) -> bytes:
        return hmac.new(self.key, direction + struct.pack(">Q", seq) + head + payload,
                        hashlib.sha256).digest()[:_MAC]

    def send(self, kind: bytes, payload: bytes = b"") -> None:
        for start in range(0, max(len(payload), 1), MAX_FRAME):
            part = payload[start:start + MAX_FRAME]
            head = kind + struct.pack(">I", len(part))
            mac = self._mac(self.out_dir, self.out_seq, head, part)
            self.out_seq += 1
            self.sock.sendall(head + part + mac)
        self.last_sent = time.monotonic()

    def heartbeat(self) -> None:
        """A heartbeat when nothing was sent for HEARTBEAT_S; StreamError when nothing was
        heard for LOST_S."""
        now = time.monotonic()
        if now - self.last_sent >= HEARTBEAT_S:
            self.send(HEARTBEAT)
        if now - self.last_heard > LOST_S:
            raise StreamError(f"nothing heard from the peer for {LOST_S:.0f} s")

    def feed(self) -> list[tuple[bytes, bytes]]:
        """Read what the socket has (it is readable) and return the whole frames so far;
        StreamError when the peer closed it or a frame is bad."""
        try:
            chunk = self.sock.recv(1 << 16)
        except OSError as exc:
            raise StreamError(f"the connection failed: {exc}") from None
        if not chunk:
            raise StreamError("the peer closed the connection")
        self.buf += chunk
        self.last_heard = time.monotonic()
        frames = []
        while len(self.buf) >= 5:
            (size,) = struct.unpack(">I", self.buf[1:5])
            if size > MAX_FRAME:
                raise StreamError("a frame over the size limit")
            if len(self.buf) < 5 + size + _MAC:
                break
            head, payload = self.buf[:5], self.buf[5:5 + size]
            mac = self.buf[5 + size:5 + size + _MAC]
            if not hmac.compare_digest(mac, self._mac(self.in_dir, self.in_seq, head, payload)):
                raise StreamError("a frame failed its authentication")
            self.in_seq += 1
            self.buf = self.buf[5 + size + _MAC:]
            if head[:1] != HEARTBEAT:
                frames.append((head[:1], payload))
        return frames

    def finish(self, kind: bytes, payload: bytes) -> None:
        """Send a last frame and close once the peer has (reading what it still sends), so
        that unread data does not make the kernel reset the connection before the peer has
        read that frame."""
        try:
            self.send(kind, payload)
            self.sock.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + HANDSHAKE_S
            while time.monotonic() < deadline:
                if select.select([self.sock], [], [], deadline - time.monotonic())[0] \
                        and not self.sock.recv(1 << 16):
                    break
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def winsize(rows: int, cols: int) -> bytes:
    return struct.pack(">HH", rows, cols)


def parse_endpoint(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)
