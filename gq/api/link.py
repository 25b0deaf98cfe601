"""gq api's connection to gqd: a few CURVE DEALER sockets to gqd's relay endpoint, as an `api`
relay (its key in gqd's key_dir/relays/, kind api), carrying every HTTP request's gq request.

Many HTTP requests share them: each gq request has a request id (rid) of its own, unique in this
process, and its reply is matched back to its caller by that rid, whichever socket it went out
on. gqd acts only through the token each request carries (`as_token`), never for this process
itself. A request whose socket loses gqd (a restart) fails at once as unreachable, rather than
waiting out its timeout; the sockets reconnect by themselves.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gq import defaults, keys, protocol
from gq.errors import ERRORS_BY_CODE, GqError, ProtocolError, UnreachableError

log = logging.getLogger("gq.api")

_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


#: The client routing frame gqd's relay endpoint wants before each request (a relay's names the
#: client it forwards for; here the rid does that) and sends back before each reply.
_ROUTE = b"api"


class _Socket:
    """One DEALER to gqd and the requests waiting on it."""

    def __init__(self, ctx: zmq.asyncio.Context, head: str, curve: keys.CurveKeys):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        self.sock.sndhwm = self.sock.rcvhwm = defaults.RELAY_QUEUE
        self.sock.curve_secretkey = curve.secret
        self.sock.curve_publickey = curve.public
        self.sock.curve_serverkey = curve.server
        self.monitor = self.sock.get_monitor_socket(_WATCHED)
        self.sock.connect(head)
        self.connected = False
        #: rid -> the future its reply resolves.
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

    def fail_all(self, exc: GqError) -> None:
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(exc)
        self.waiting.clear()

    def close(self) -> None:
        self.monitor.close(linger=0)
        self.sock.close(linger=0)


class HeadLink:
    """gq api's requests to gqd. Create it inside the running event loop (`start`)."""

    def __init__(self, head: str, curve: keys.CurveKeys, sockets: int = 2,
                 timeout_s: float = defaults.CLIENT_TIMEOUT_S):
        self.head, self.curve, self.timeout_s = head, curve, timeout_s
        self.count = max(1, sockets)
        self._rids = itertools.count(int.from_bytes(os.urandom(3), "big"))
        self._turn = itertools.cycle(range(self.count))
        self._sockets: list[_Socket] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.ctx = zmq.asyncio.Context()
        for _ in range(self.count):
            sock = _Socket(self.ctx, self.head, self.curve)
            self._sockets.append(sock)
            self._tasks += [asyncio.create_task(self._replies(sock)),
                            asyncio.create_task(self._watch(sock))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for sock in self._sockets:
            sock.fail_all(UnreachableError("gq api is stopping"))
            sock.close()
        self.ctx.term()

    @property
    def connected(self) -> bool:
        return any(s.connected for s in self._sockets)

    @property
    def in_flight(self) -> int:
        return sum(len(s.waiting) for s in self._sockets)

    async def request(self, token: str, msg_type: str, timeout_s: float | None = None,
                      **fields: Any) -> dict[str, Any]:
        """gqd's reply data to one request made with `token`, or its error as GqError kin."""
        sock = self._pick()
        rid = next(self._rids)
        payload = protocol.encode(msg_type, rid=rid, **{protocol.AS_TOKEN: token}, **fields)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        sock.waiting[rid] = future
        try:
            await sock.sock.send_multipart([_ROUTE, payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            sock.waiting.pop(rid, None)
            raise UnreachableError(f"gq api has {defaults.RELAY_QUEUE} requests waiting for "
                                   "gqd: try again") from None
        try:
            reply = await asyncio.wait_for(future, timeout_s or self.timeout_s)
        except asyncio.TimeoutError:
            raise UnreachableError(f"gqd at {self.head} did not answer within "
                                   f"{timeout_s or self.timeout_s:g}s") from None
        finally:
            sock.waiting.pop(rid, None)
        if not reply["ok"]:
            cls = ERRORS_BY_CODE.get(reply.get("code", ""), GqError)
            raise cls(str(reply.get("error", "request refused")))
        return {k: v for k, v in reply.items() if k not in ("v", "type", "rid", "ok")}

    def _pick(self) -> _Socket:
        """A connected socket, in turn; UnreachableError when none is."""
        for _ in range(self.count):
            sock = self._sockets[next(self._turn)]
            if sock.connected:
                return sock
        raise UnreachableError(f"gq api is not connected to gqd at {self.head} (is gqd up, "
                               "its relay_endpoint this address, and this api's key in its "
                               "key_dir/relays/ with kind api?)")

    async def _replies(self, sock: _Socket) -> None:
        while True:
            frames = await sock.sock.recv_multipart()
            frame = frames[-1]
            try:
                reply = protocol.decode(frame, frozenset({protocol.REPLY}))
            except ProtocolError as exc:
                log.warning("dropping a reply from gqd: %s", exc)
                continue
            future = sock.waiting.pop(reply["rid"], None)
            if future is not None and not future.done():
                future.set_result(reply)

    async def _watch(self, sock: _Socket) -> None:
        while True:
            event = parse_monitor_message(await sock.monitor.recv_multipart())
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                if not self.connected:
                    log.info("gq api connected to gqd at %s", self.head)
                sock.connected = True
            elif kind == zmq.EVENT_DISCONNECTED:
                was = self.connected
                sock.connected = False
                # Its requests went with the connection: their callers hear so now.
                sock.fail_all(UnreachableError(f"gq api lost its connection to gqd at "
                                               f"{self.head}; try again"))
                if was and not self.connected:
                    log.warning("gq api lost its connection to gqd at %s", self.head)
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                log.error("gqd at %s refused gq api's key: is its public key in gqd's "
                          "key_dir/relays/ (gq admin keygen --relay NAME --kind api)?", self.head)
            else:
                log.warning("gq api: handshake with gqd at %s failed (is it gqd's "
                            "relay_endpoint, and gqd.key its key?)", self.head)
