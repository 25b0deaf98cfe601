"""gqd: the sockets and the single event loop around `Head` (receive, persist, plan, send)."""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq

from gq import config as config_mod
from gq import defaults, protocol, service
from gq.errors import GqError, ProtocolError, StoreError
from gq.head.auth import DOMAIN, ZapHandler, caller_of
from gq.head.core import Head
from gq.pidfile import acquire
from gq.store import Store

log = logging.getLogger("gq.head")


@dataclass
class ClientRequest:
    sock: zmq.Socket
    envelope: list[bytes]
    payload: bytes
    user_id: str


class HeadServer:
    def __init__(self, cfg: config_mod.Config, store: Store):
        self.cfg = cfg
        self.store = store
        self.head = Head(cfg, store, time.time())
        #: No scheduling pass before this time (set after a failed commit).
        self.schedule_after = 0.0
        self.ctx = zmq.Context()
        self.zap = ZapHandler(self.ctx)  # must run before any bind, so no connection skips it
        self.clients = [self._bind_client(ep) for ep in cfg.head.client_endpoints]
        self.nodes = self.ctx.socket(zmq.ROUTER)
        self.nodes.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone node raises, not drops
        self.nodes.setsockopt(zmq.ROUTER_HANDOVER, 1)   # a restarted gqnode takes over its name
        self.nodes.linger = 0
        self.nodes.bind(cfg.head.node_endpoint)
        self.signals = service.Signals()
        self.poller = zmq.Poller()
        for sock in (*self.clients, self.nodes):
            self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.signals.wake_r, zmq.POLLIN)

    def _bind_client(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.zap_domain = DOMAIN
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.linger = 1000
        sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        if endpoint.startswith("ipc://"):
            path = Path(endpoint[len("ipc://"):])
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)  # stale from a crash; we hold the pid lock
        sock.bind(endpoint)
        if endpoint.startswith("ipc://"):
            # Anyone may connect; who they are comes from the kernel (SO_PEERCRED), and the
            # directory's mode decides who can reach the socket at all.
            os.chmod(endpoint[len("ipc://"):], 0o666)
        log.info("serving clients on %s", endpoint)
        return sock

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        log.info("gqd ready: %d live jobs, nodes on %s", len(self.head.jobs),
                 self.cfg.head.node_endpoint)
        service.notify("READY=1")
        while True:
            due = self.head.dirty and time.time() >= self.schedule_after
            timeout_ms = 0 if due else int(defaults.LOOP_TICK_S * 1000)
            events = dict(self.poller.poll(timeout_ms))
            if self.signals.wake_r.fileno() in events or self.signals.wake_r in events:
                self.signals.drain()
            if self.signals.stop_requests >= 2:
                log.warning("second stop signal: stopping now")
                return 1
            if self.signals.reload:
                self._reload()
            requests = [r for s in self.clients if s in events for r in self._recv_clients(s)]
            node_msgs = self._recv_nodes() if self.nodes in events else []
            self._iteration(requests, node_msgs, time.time())
            if self.signals.stop_requests:
                log.info("stop signal: answered what had arrived; gqd stops, jobs keep running")
                service.notify("STOPPING=1")
                return 0

    def _recv_clients(self, sock: zmq.Socket) -> list[ClientRequest]:
        out = []
        for _ in range(defaults.MAX_BATCH):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                user_id = frames[-1].get("User-Id") or ""
            except (zmq.ZMQError, KeyError):
                user_id = ""
            out.append(ClientRequest(sock, [f.bytes for f in frames[:-1]], frames[-1].bytes,
                                     user_id))
        return out

    def _recv_nodes(self) -> list[tuple[str, bytes]]:
        out = []
        for _ in range(defaults.MAX_BATCH):
            try:
                frames = self.nodes.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            if len(frames) != 2:
                log.warning("dropping node message of %d frames", len(frames))
                continue
            out.append((frames[0].decode(errors="replace"), frames[1]))
        return out

    def _iteration(self, requests: list[ClientRequest], node_msgs: list[tuple[str, bytes]],
                   now: float) -> None:
        """Handle everything that arrived in one transaction (group commit), then send."""
        replies: list[tuple[ClientRequest, bytes, bool]] = []
        try:
            with self.store.tx():
                for req in requests:
                    reply = self._client(req, now)
                    if reply is not None:
                        replies.append(reply)
                for name, payload in node_msgs:
                    self._node(name, payload, now)
                self.head.tick(now)
                if self.head.dirty and now >= self.schedule_after:
                    self.head.schedule(now)
        except StoreError as exc:
            log.error("%s (a batch of %d requests and %d node messages)", exc, len(requests),
                      len(node_msgs))
            self.head.load(now)
            self.schedule_after = now + defaults.STORE_RETRY_S
            self.head.deferred.clear()
            replies = [(r, protocol.error(_rid_of(r.payload), exc.code, str(exc)), False)
                       if accepted else (r, data, accepted) for r, data, accepted in replies]
        for req, data, _ in replies:
            self._send_client(req.sock, req.envelope, data)
        for (sock, envelope), data in self.head.deferred:
            self._send_client(sock, envelope, data)
        self.head.deferred.clear()
        for name, data in self.head.outbox_nodes:
            self._send_node(name, data)
        self.head.outbox_nodes.clear()

    def _client(self, req: ClientRequest, now: float) -> tuple[ClientRequest, bytes, bool] | None:
        """(request, reply, accepted) — or None when the reply is deferred."""
        rid = _rid_of(req.payload)
        try:
            msg = protocol.decode(req.payload, protocol.CLIENT_REQUESTS)
            if not isinstance(msg.get("rid"), int):
                raise ProtocolError("request has no integer rid")
            caller = caller_of(req.user_id, msg.get("claim_uid"), msg.get("claim_user"),
                               self.cfg.auth.admins)
            data = self._isolated(msg, caller, (req.sock, req.envelope), now)
        except GqError as exc:
            if isinstance(exc, ProtocolError):
                log.warning("bad client request: %s", exc)
            return req, protocol.error(rid, exc.code, str(exc)), False
        return None if data is None else (req, protocol.ok(rid, **data), True)

    def _isolated(self, msg: dict[str, Any], caller: Any, client: Any, now: float) -> Any:
        """Run one request in a savepoint: a bug in it cannot leave half its changes behind."""
        conn = self.store.conn
        conn.execute("SAVEPOINT request")
        try:
            data = self.head.handle_client(msg, caller, client, now)
        except GqError:
            conn.execute("RELEASE request")  # handlers check before they change anything
            raise
        except Exception as exc:
            log.exception("internal error handling %s", msg.get("type"))
            conn.execute("ROLLBACK TO request")
            conn.execute("RELEASE request")
            self.head.load(now)
            raise GqError(f"internal error in gqd: {type(exc).__name__}: {exc}") from None
        conn.execute("RELEASE request")
        return data

    def _node(self, name: str, payload: bytes, now: float) -> None:
        try:
            msg = protocol.decode(payload, protocol.NODE_MESSAGES)
            self.head.handle_node(name, msg, now)
        except GqError as exc:
            log.warning("dropping message from node %r: %s", name, exc)

    def _send_client(self, sock: zmq.Socket, envelope: list[bytes], data: bytes) -> None:
        try:
            sock.send_multipart([*envelope, data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # the client went away; its request was still handled
            log.debug("reply not delivered: %s", exc)

    def _send_node(self, name: str, data: bytes) -> None:
        try:
            self.nodes.send_multipart([name.encode(), data], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            # Not connected now: launches are resent until confirmed; the rest is re-derived
            # when the node registers again.
            log.info("node %s unreachable: %s", name, exc)

    def _reload(self) -> None:
        self.signals.reload = False
        try:
            cfg = config_mod.load(self.cfg.path or None)
        except GqError as exc:
            log.error("SIGHUP: keeping the old configuration: %s", exc)
            return
        # Addresses and the state directory need a restart; everything else applies now.
        cfg.head, cfg.node, cfg.client = self.cfg.head, self.cfg.node, self.cfg.client
        self.cfg = cfg
        self.head.configure(cfg)
        log.info("SIGHUP: configuration reloaded from %s", self.cfg.path or "defaults")

    def close(self) -> None:
        self.zap.close()
        for sock in (*self.clients, self.nodes):
            sock.close()
        self.ctx.term()


def _rid_of(payload: bytes) -> int:
    """The request id of a possibly malformed request, so even an error reply can be matched."""
    try:
        rid = msgpack.unpackb(payload, raw=False).get("rid")
        return rid if isinstance(rid, int) and not isinstance(rid, bool) else 0
    except Exception:
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = service.parser("gqd", "gq head daemon")
    args = parser.parse_args(argv)
    service.setup_logging(args.log_level)
    try:
        cfg = config_mod.load(args.config)
        state_dir = Path(cfg.head.state_dir)
        lock = acquire(state_dir / "gqd.pid")
        store = Store(state_dir / defaults.DB_FILE)
        server = HeadServer(cfg, store)
    except (GqError, OSError, zmq.ZMQError) as exc:
        log.error("gqd cannot start: %s", exc)
        return 1
    try:
        return server.run()
    finally:
        server.close()
        store.close()
        os.close(lock)


if __name__ == "__main__":
    sys.exit(main())
