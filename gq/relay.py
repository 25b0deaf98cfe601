"""`gq relay`: the login host's door to gqd. Users' requests in on a local ipc socket, out to gqd
over CurveZMQ, each with the uid the kernel gave (SO_PEERCRED); gqd's replies back.

    user's gq ──ipc──> ROUTER [ZAP: SO_PEERCRED uid]   DEALER ──CURVE──> gqd relay_endpoint
                       (this host)  as_uid := uid ────>  (this host's key)   [ZAP: relays/, nodes/]

The front socket's ZAP handler is gqd's own (gq/head/auth.py): it turns the ipc peer's
SO_PEERCRED into the connection's User-Id. Every request's `as_uid` is replaced by that uid (a
client's own `as_uid` is dropped), and the request goes to gqd with the client's routing id in
front (a ROUTER/DEALER envelope), so gqd's reply, however late (a parked `wait`), comes back to
the same client. Nothing is kept here: a relay that restarts loses only the requests it had not
had answered (their clients see the connection close, as with a restarted gqd); an answered
request was committed by gqd before it answered.

gqnode serves the same `Forwarder` on a socket in its state directory for the jobs on its host,
with its node key (gq/node/main.py); gqd believes a node only for the owners of jobs it holds.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import msgpack
import zmq
from zmq.utils.monitor import parse_monitor_message

from gq import config as config_mod
from gq import defaults, keys, protocol, service
from gq.errors import (ConfigError, GqError, PermissionDenied, ProtocolError,
                       UnreachableError, start_status)
from gq.head.auth import DOMAIN, ZapHandler, user_id_of
from gq.pidfile import acquire

log = logging.getLogger("gq.relay")

#: The monitor events that tell whether the connection to gqd works.
_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
            | zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class Forwarder:
    """The local socket at `local` (ipc, 0666), forwarded to gqd's relay endpoint `head` with
    `curve` (this host's key). Its own ZAP handler runs on `ctx`, which must have no other.

    The loop that owns it polls `sockets()` and hands the events to `serve`."""

    def __init__(self, ctx: zmq.Context, local: str, head: str, curve: keys.CurveKeys,
                 what: str = "relay"):
        if not local.startswith("ipc://"):
            raise ConfigError(f"the relay's socket {local!r} must be ipc://PATH: only there does "
                              "the kernel say who the caller is")
        self.endpoint, self.head, self.what = local, head, what
        #: Whether the CURVE handshake with gqd succeeded and the connection still stands.
        self.connected = False
        self.zap = ZapHandler(ctx)  # before the bind, so no connection skips it
        self.front = ctx.socket(zmq.ROUTER)
        self.back = ctx.socket(zmq.DEALER)
        try:
            self._bind_front(local)
            self._connect_back(head, curve)
            self.monitor = self.back.get_monitor_socket(_WATCHED)
        except BaseException:
            self.close()
            raise

    def _bind_front(self, local: str) -> None:
        sock = self.front
        sock.zap_domain = DOMAIN
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.linger = 0
        sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        # Bounded queues: past these, libzmq stops reading from a flooding client (its own
        # connection backs up), and replies to a client that reads none are dropped.
        sock.rcvhwm = sock.sndhwm = defaults.RELAY_QUEUE
        path = Path(local[len("ipc://"):])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)  # stale from a crash; we hold the pid lock
        sock.bind(local)
        # Anyone may connect: who they are comes from the kernel (SO_PEERCRED).
        os.chmod(path, 0o666)

    def _connect_back(self, head: str, curve: keys.CurveKeys) -> None:
        sock = self.back
        sock.linger = 0  # unanswered requests die with us: their clients see the close
        sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        sock.rcvhwm = sock.sndhwm = defaults.RELAY_QUEUE
        sock.curve_secretkey = curve.secret
        sock.curve_publickey = curve.public
        sock.curve_serverkey = curve.server
        sock.connect(head)

    def sockets(self) -> list[zmq.Socket]:
        return [self.front, self.back, self.monitor]

    def serve(self, events: dict[Any, int]) -> None:
        """Handle what the poll found: connection news, gqd's replies, then new requests."""
        if self.monitor in events:
            self._watch()
        if self.back in events:
            self._replies()
        if self.front in events:
            self._requests()

    def _watch(self) -> None:
        while True:
            try:
                event = parse_monitor_message(self.monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.connected = True
                log.info("%s connected to gqd at %s", self.what, self.head)
            elif kind == zmq.EVENT_DISCONNECTED:
                if self.connected:
                    log.warning("%s lost its connection to gqd at %s", self.what, self.head)
                self.connected = False
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                log.error("gqd at %s refused this %s's key: is its public key in gqd's "
                          "key_dir/relays/ (gq admin keygen --relay NAME)?", self.head, self.what)
            else:
                log.warning("%s: handshake with gqd at %s failed (is [relay] head gqd's "
                            "relay_endpoint, and gqd.key its key?)", self.what, self.head)

    def _replies(self) -> None:
        for _ in range(defaults.MAX_BATCH):
            try:
                frames = self.back.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2:  # [client's routing id, reply]
                self._send_front(frames[0], frames[1])

    def _requests(self) -> None:
        for _ in range(defaults.MAX_BATCH):
            try:
                frames = self.front.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if len(frames) != 2:  # a DEALER sends single-frame requests
                continue
            route, payload = frames[0].bytes, frames[1]
            try:
                self._forward(route, payload.bytes, user_id_of(payload))
            except GqError as exc:
                self._send_front(route, protocol.error(protocol.rid_of(payload.bytes), exc.code,
                                                       str(exc)))

    def _forward(self, route: bytes, payload: bytes, uid: str) -> None:
        """The request to gqd, with the caller's proven uid as its `as_uid`."""
        if not uid.isdigit():  # the front is ipc only; no uid means no proof
            raise PermissionDenied("permission denied: the relay serves only local callers, "
                                   "whose uid the kernel gives")
        # Only well-formed requests go on (gqd checks them again, and their contents).
        msg = protocol.decode(payload, protocol.CLIENT_REQUESTS)
        if not self.connected:
            raise UnreachableError(f"this host's {self.what} is not connected to gqd at "
                                   f"{self.head} (see its log)")
        # Whatever the client put there is replaced: only the kernel's uid goes on.
        msg[protocol.AS_UID] = int(uid)
        data = msgpack.packb(msg, use_bin_type=True)
        if len(data) > defaults.MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message of {len(data)} bytes is over the "
                                f"{defaults.MAX_MESSAGE_BYTES} limit")
        try:
            self.back.send_multipart([route, data], zmq.NOBLOCK)
        except zmq.Again:
            raise UnreachableError(f"this host's {self.what} has {defaults.RELAY_QUEUE} requests "
                                   "waiting for gqd: try again") from None

    def _send_front(self, route: bytes, data: bytes) -> None:
        try:
            self.front.send_multipart([route, data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client went away; gqd handled its request anyway
            log.debug("reply not delivered: %s", exc)

    def close(self) -> None:
        for sock in (getattr(self, "monitor", None), self.back, self.front):
            if sock is not None:
                sock.close(linger=0)
        self.zap.close()
        Path(self.endpoint[len("ipc://"):]).unlink(missing_ok=True)


def serve(cfg: config_mod.Config, name: str) -> int:
    """Run `gq relay` until a stop signal."""
    if not cfg.relay.head:
        raise ConfigError(f"{cfg.path or '<defaults>'}: [relay] head must name gqd's relay "
                          "endpoint, e.g. tcp://head:6820")
    curve = keys.node_keys(Path(cfg.auth.key_dir), name)  # a missing key stops us here
    socket_path = Path(cfg.relay.socket.removeprefix("ipc://"))
    lock = acquire(socket_path.with_name(socket_path.name + ".pid"))
    ctx = zmq.Context()
    try:
        forwarder = Forwarder(ctx, cfg.relay.socket, cfg.relay.head, curve, f"relay {name}")
        try:
            return _loop(forwarder)
        finally:
            forwarder.close()
    finally:
        ctx.term()
        os.close(lock)


def _loop(forwarder: Forwarder) -> int:
    signals = service.Signals()
    poller = zmq.Poller()
    for sock in forwarder.sockets():
        poller.register(sock, zmq.POLLIN)
    poller.register(signals.wake_r, zmq.POLLIN)
    log.info("%s serving %s for gqd at %s", forwarder.what, forwarder.endpoint, forwarder.head)
    service.notify("READY=1")
    while True:
        events = dict(poller.poll(int(defaults.LOOP_TICK_S * 1000)))
        signals.drain()
        if signals.stop_requests:
            log.info("stop signal: the relay stops (unanswered requests are dropped; their "
                     "clients see the connection close)")
            service.notify("STOPPING=1")
            return 0
        forwarder.serve(events)


def main(argv: list[str] | None = None) -> int:
    parser = service.parser("gq relay", "gq's login-host relay: this host's users' requests to "
                            "gqd, each with the uid the kernel gives")
    parser.add_argument("--name", default=None,
                        help="this relay's key name (default: [relay] name, else the host name)")
    args = parser.parse_args(argv)
    service.setup_logging(args.log_level)
    try:
        cfg = config_mod.load(args.config)
        name = keys.check_name(args.name or cfg.relay.name or socket.gethostname().split(".")[0])
        return serve(cfg, name)
    except (GqError, OSError, zmq.ZMQError) as exc:
        log.error("gq relay cannot start: %s", exc)
        return start_status(exc)


if __name__ == "__main__":
    sys.exit(main())
