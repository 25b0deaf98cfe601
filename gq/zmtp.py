"""A minimal ZMTP 3.1 DEALER (rfc.zeromq.org 37/ZMTP, NULL mechanism) over ipc:// and tcp://.

The CLI's one request and reply do not need libzmq: importing pyzmq costs a `gq submit` more
than its request does (`python -X importtime`). gqd's ROUTER socket cannot tell this peer from a
libzmq DEALER: the ZAP handler still learns an ipc caller's uid from the kernel (SO_PEERCRED).

Only what a DEALER talking to one ROUTER needs: the greeting, READY both ways, ERROR, PING/PONG
and message frames. Nothing here knows gq's protocol; errors are gq's own (gq/errors.py).
"""

from __future__ import annotations

# The C module: socket.py's enum conversions and selectors cost a `gq submit` more than the
# connection does, and this uses only what _socket has.
import _socket as socket
import time

from gq.defaults import MAX_MESSAGE_BYTES
from gq.errors import ProtocolError, UnreachableError

#: Signature, version 3.1, mechanism NULL, as-server 0, filler: 64 bytes (spec: "greeting").
GREETING = b"\xff" + bytes(8) + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\0") + bytes(32)
#: Frame flags (spec: "framing").
MORE, LONG, COMMAND = 1, 2, 4
#: How often a refused connection is tried again within the connect timeout (libzmq's default
#: reconnect interval): a gqd that is rebinding its socket is waited for, as pyzmq did.
RETRY_S = 0.1


class Closed(Exception):
    """The peer closed the connection (the caller decides what that means)."""


def command(name: bytes, body: bytes = b"") -> bytes:
    """A command frame: flags, size, the name's length and the name, then its data."""
    data = bytes([len(name)]) + name + body
    return _frame_header(COMMAND, len(data)) + data


def properties(**props: bytes) -> bytes:
    """READY's metadata: each name short-prefixed, each value with a 4-byte length."""
    return b"".join(bytes([len(k)]) + k.encode() + len(v).to_bytes(4, "big") + v
                    for k, v in props.items())


def _frame_header(flags: int, size: int) -> bytes:
    if size > 255:
        return bytes([flags | LONG]) + size.to_bytes(8, "big")
    return bytes([flags, size])


class Dealer:
    """One connection to a ROUTER at `endpoint`; `connect` within `connect_timeout_s`, or
    UnreachableError with `unreachable` (the caller's message for "no head there")."""

    def __init__(self, endpoint: str, connect_timeout_s: float, unreachable: str):
        self.endpoint = endpoint
        self._unreachable = unreachable
        deadline = time.monotonic() + connect_timeout_s
        self._sock = self._connect(deadline)
        try:
            self._handshake(deadline)
        except BaseException:
            self.close()
            raise

    def _connect(self, deadline: float) -> socket.socket:
        address: str | tuple[str, int]
        if self.endpoint.startswith("ipc://"):
            family, address = socket.AF_UNIX, self.endpoint[len("ipc://"):]
        elif self.endpoint.startswith("tcp://"):
            host, _, port = self.endpoint[len("tcp://"):].rpartition(":")
            if not host or not port.isdigit():
                raise UnreachableError(f"bad endpoint {self.endpoint!r}: expected "
                                       "tcp://HOST:PORT or ipc://PATH")
            family, address = socket.AF_INET6 if ":" in host else socket.AF_INET, (
                host.strip("[]"), int(port))
        else:
            raise UnreachableError(f"bad endpoint {self.endpoint!r}: expected tcp://HOST:PORT "
                                   "or ipc://PATH")
        while True:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                sock.connect(address)
                if family != socket.AF_UNIX:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                return sock
            except OSError:  # refused, no such socket, unresolvable, timed out: try until due
                sock.close()
            if time.monotonic() + RETRY_S >= deadline:
                raise UnreachableError(self._unreachable)
            time.sleep(RETRY_S)

    def _handshake(self, deadline: float) -> None:
        """Greetings, then READY both ways. gqd asks its ZAP handler before it answers READY:
        a refused caller gets ERROR or a closed connection, as unreachable as no head at all."""
        try:
            self._send(GREETING + command(b"READY", properties(**{"Socket-Type": b"DEALER"})),
                       deadline - time.monotonic())
            greeting = self._exact(64, deadline)
            if greeting[0] != 0xFF or greeting[9] != 0x7F:
                raise self._malformed("its greeting is not ZMTP's")
            if greeting[10] < 3 or bytes(greeting[12:32]).rstrip(b"\0") != b"NULL":
                raise self._malformed(f"it speaks ZMTP {greeting[10]} with mechanism "
                                      f"{bytes(greeting[12:32]).rstrip(bytes(1))!r}, not 3 NULL")
            flags, body = self._frame(deadline)
            if not flags & COMMAND:
                raise self._malformed("a message came before its READY")
            name, data = self._command(body)
            if name == b"ERROR":
                raise UnreachableError(self._unreachable)
            if name != b"READY":
                raise self._malformed(f"{name!r} came instead of READY")
            if self._socket_type(data) != b"ROUTER":
                raise self._malformed("it is not a ROUTER socket")
        except (Closed, TimeoutError, OSError):
            raise UnreachableError(self._unreachable) from None

    def _socket_type(self, data: bytes | bytearray) -> bytes | None:
        """Socket-Type from READY's metadata (names are case-insensitive)."""
        at = 0
        while at < len(data):
            size = data[at]
            name = data[at + 1:at + 1 + size]
            at += 1 + size
            if len(name) != size or at + 4 > len(data):
                raise self._malformed("its READY metadata is cut short")
            length = int.from_bytes(data[at:at + 4], "big")
            value = data[at + 4:at + 4 + length]
            if at + 4 + length > len(data):
                raise self._malformed("its READY metadata is cut short")
            at += 4 + length
            if name.lower() == b"socket-type":
                return bytes(value)
        return None

    def send(self, payload: bytes, timeout_s: float) -> None:
        """One single-frame message; TimeoutError when the peer takes none of it in time."""
        self._send(_frame_header(0, len(payload)) + payload, timeout_s)

    def peer_closed(self) -> bool:
        """Whether the peer has closed the connection (a restarted gqd): a new one is needed.
        Bytes still unread (a late reply) do not count."""
        self._sock.settimeout(0)  # a timeout would wait for data first
        try:
            return self._sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def recv(self, timeout_s: float) -> bytes | bytearray | None:
        """The first frame of the next message, or None when none came in `timeout_s` (then
        the connection is out of step: close it). Closed when the peer went away."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                flags, body = self._frame(deadline)
                if flags & COMMAND:
                    self._on_command(body)
                    continue
                first = body
                while flags & MORE:  # gqd sends one frame; later ones are no message of ours
                    flags, body = self._frame(deadline)
                return first
        except TimeoutError:
            return None

    def _on_command(self, body: bytearray) -> None:
        name, data = self._command(body)
        if name == b"PING":  # TTL (2 bytes), then a context to echo in PONG
            self._send(command(b"PONG", bytes(data[2:])), 1.0)
        elif name == b"ERROR":
            reason = bytes(data[1:1 + data[0]]).decode(errors="replace") if data else ""
            raise ProtocolError(f"the gq head at {self.endpoint} closed the connection: "
                                f"{reason or 'no reason given'}")
        # Any other command (SUBSCRIBE is not sent to a DEALER) means nothing here.

    def _command(self, body: bytearray) -> tuple[bytes, bytearray]:
        if not body or body[0] + 1 > len(body):
            raise self._malformed("a command frame has no name")
        return bytes(body[1:1 + body[0]]), body[1 + body[0]:]

    def _frame(self, deadline: float) -> tuple[int, bytearray]:
        """(flags, body) of the next frame; a size over gq's message limit is refused before
        anything is allocated for it."""
        flags = self._exact(1, deadline)[0]
        if flags & ~(MORE | LONG | COMMAND):
            raise self._malformed(f"frame flags {flags:#04x}")
        size_bytes = self._exact(8 if flags & LONG else 1, deadline)
        size = int.from_bytes(size_bytes, "big")
        if size > MAX_MESSAGE_BYTES:
            self.close()
            raise ProtocolError(f"message of {size} bytes is over the {MAX_MESSAGE_BYTES} limit")
        return flags, self._exact(size, deadline)

    def _exact(self, n: int, deadline: float) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
            try:
                k = self._sock.recv_into(view[got:])
            except ConnectionError:
                raise Closed from None
            if k == 0:
                raise Closed
            got += k
        return buf

    def _send(self, data: bytes, timeout_s: float) -> None:
        self._sock.settimeout(max(timeout_s, 0.001))
        try:
            self._sock.sendall(data)
        except (ConnectionError, BrokenPipeError):
            raise Closed from None

    def _malformed(self, what: str) -> ProtocolError:
        self.close()
        return ProtocolError(f"the peer at {self.endpoint} is not a gq head speaking ZMTP 3: "
                             f"{what}")

    def close(self) -> None:
        self._sock.close()
