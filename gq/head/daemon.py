"""gqd: the sockets and the single event loop around `Head` (receive, persist, plan, send)."""

from __future__ import annotations

import logging
import math
import os
import pwd
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import zmq

from gq import config as config_mod
from gq import defaults, keys, protocol, service
from gq.errors import (ConfigError, ExitStatus, GqError, PermissionDenied, ProtocolError,
                       StoreError)
from gq.head.auth import DOMAIN, NODE_DOMAIN, RELAY_DOMAIN, ZapHandler, caller_of
from gq.head import metrics
from gq.head.core import CHANGING_REQUESTS, Head
from gq.head.submits import SLICE_S as SUBMIT_SLICE_S
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
        # Issue 13 (monotonic clocks): schedule_after and pass_after are time.monotonic(), so a
        # step of the wall clock cannot hold back passes for the hour it stepped.
        #: No scheduling pass before this time (set after a failed commit).
        self.schedule_after = 0.0
        #: No pass for node events (job ends) before this time, the spacing after the last pass;
        #: a client's change (submit, cancel, hold...) is seen by a pass before it is answered.
        self.pass_after = 0.0
        #: A request handled in the batch changed the queue.
        self.client_changed = False
        self.ctx = zmq.Context()
        key_dir = Path(cfg.auth.key_dir) if cfg.auth.curve else None
        curve = keys.head_keys(key_dir) if key_dir else None  # a missing key stops gqd here
        # Must run before any bind, so no connection skips it.
        self.owner_uid = _owner_uid(cfg.auth.owner)
        self.zap = ZapHandler(self.ctx, self.owner_uid, key_dir)
        self.clients = [self._bind_client(ep) for ep in cfg.head.client_endpoints]
        if cfg.head.relay_endpoint and curve is None:
            log.warning("[auth] curve = false: relays are known only by their keys, so %s is "
                        "not served (no login host can submit)", cfg.head.relay_endpoint)
        elif cfg.head.relay_endpoint:
            # Relays' requests are client requests in all but who vouches for the caller.
            self.clients.append(self._bind_relays(cfg.head.relay_endpoint, curve))
        self.nodes = self._bind_nodes(cfg.head.node_endpoint, curve)
        #: Node name -> routing id of the connection it last sent from (under its own key).
        self.node_routes: dict[str, bytes] = {}
        #: Names some node with another's key claimed (logged once each).
        self.impostors: set[str] = set()
        self.signals = service.Signals()
        self.poller = zmq.Poller()
        for sock in (*self.clients, self.nodes):
            self.poller.register(sock, zmq.POLLIN)
        self.poller.register(self.signals.wake_r, zmq.POLLIN)
        self.metrics = self._serve_metrics()
        #: When the loop next publishes a metrics sample (time.monotonic()).
        self.publish_at = 0.0

    def _serve_metrics(self) -> metrics.Metrics | None:
        """The Prometheus endpoint, if [head] metrics_addr names one; its address goes to the
        state directory, where `gq up` finds it."""
        addr = metrics.parse_addr(self.cfg.head.metrics_addr,
                                  f"{self.cfg.path or '<defaults>'}: [head] metrics_addr")
        path = Path(self.cfg.head.state_dir) / metrics.ADDR_FILE
        path.unlink(missing_ok=True)
        if addr is None:
            return None
        server = metrics.Metrics(*addr)
        path.write_text(server.address + "\n")
        return server

    def _publish(self) -> None:
        """Hand the metrics thread a fresh sample, at most every metrics.PUBLISH_S (less often
        when sampling a large queue would take more than metrics.MAX_LOAD of the loop)."""
        start = time.monotonic()
        if self.metrics is None or start < self.publish_at:
            return
        self.metrics.publish(metrics.sample(self.head.index, self.head.nodes.values(),
                                            self.cfg.qos))
        cost = time.monotonic() - start
        self.publish_at = start + max(metrics.PUBLISH_S, cost / metrics.MAX_LOAD)

    def _bind_nodes(self, endpoint: str, curve: keys.CurveKeys | None) -> zmq.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone node raises, not drops
        # A node reconnecting after a partition takes over its (secret, random) routing id.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.linger = 0
        sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        if curve is not None:
            # Encrypted, and each node proves its name with its key (the ZAP handler checks
            # the allow-list), so no one can take over a node's name or read its launches.
            sock.curve_server = True
            sock.curve_secretkey = curve.secret
            sock.curve_publickey = curve.public
            sock.zap_domain = NODE_DOMAIN
            sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        else:
            log.warning("[auth] curve = false: node traffic is plain text and any peer that "
                        "reaches %s may act as a node", endpoint)
        sock.bind(endpoint)
        return sock

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

    def _bind_relays(self, endpoint: str, curve: keys.CurveKeys) -> zmq.Socket:
        """The relay endpoint: login hosts' `gq relay`, gq api and gqnodes forward requests
        here over CURVE, each with the uid it proved (`as_uid`); the ZAP handler admits only
        keys in key_dir/relays/ and key_dir/nodes/ (gq/head/auth.py)."""
        sock = self.ctx.socket(zmq.ROUTER)
        sock.linger = 1000
        sock.maxmsgsize = defaults.MAX_MESSAGE_BYTES
        sock.curve_server = True
        sock.curve_secretkey = curve.secret
        sock.curve_publickey = curve.public
        sock.zap_domain = RELAY_DOMAIN
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        sock.bind(endpoint)
        log.info("serving relays on %s", endpoint)
        return sock

    # ------------------------------------------------------------ the loop

    def run(self) -> int:
        log.info("gqd ready: %d live jobs, nodes on %s", len(self.head.jobs),
                 self.cfg.head.node_endpoint)
        service.notify("READY=1")
        while True:
            pass_at = max(self.schedule_after, self.pass_after)
            # A submit in the works goes on at once, in the turn's slice after the messages.
            due = self.head.dirty and time.monotonic() >= pass_at or self.head.submits.busy
            tick = defaults.LOOP_TICK_S
            if self.head.wake_at is not None:  # a --begin time: wake for it, not a tick late
                tick = min(tick, max(0.0, self.head.wake_at - time.time()))
            if self.head.dirty and not due:  # the pass waits out its spacing: wake for it
                tick = min(tick, max(0.0, pass_at - time.monotonic()))
            timeout_ms = 0 if due else math.ceil(tick * 1000)
            asked = time.monotonic()
            events = dict(self.poller.poll(timeout_ms))
            woke = time.monotonic()
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
            self._publish()
            if self.metrics is not None:
                self.metrics.loop_turn(asked, timeout_ms / 1000, woke, time.monotonic())
            if self.signals.stop_requests and not self.head.submits.busy:
                # Submits in the works are finished first (seconds at most), so they are
                # answered rather than dropped.
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
            out.append(ClientRequest(sock, [f.bytes for f in frames[:-1]], frames[-1].bytes,
                                     _user_id(frames[-1])))
        return out

    def _recv_nodes(self) -> list[tuple[str, bytes]]:
        out = []
        for _ in range(defaults.MAX_BATCH):
            try:
                frames = self.nodes.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(frames) != 2:
                log.warning("dropping node message of %d frames", len(frames))
                continue
            route = frames[0].bytes
            name = route.split(b"/")[0].decode(errors="replace")
            if self.cfg.auth.curve and _user_id(frames[1]) != name:
                # Its key is bound to another name: a node posing as another is not heard.
                self._refused_node(name, _user_id(frames[1]))
                continue
            # Replies go to the connection the name was last proven on; a node's routing id
            # (NAME/random) cannot be guessed, so no other peer can take its messages over.
            self.node_routes[name] = route
            out.append((name, frames[1].bytes))
        return out

    def _refused_node(self, name: str, owner: str) -> None:
        if name not in self.impostors:
            self.impostors.add(name)
            log.warning("dropping messages from a node calling itself %r: its key belongs to "
                        "node %r", name, owner)

    def _iteration(self, requests: list[ClientRequest], node_msgs: list[tuple[str, bytes]],
                   now: float) -> None:
        """Handle everything that arrived in one transaction (group commit), then send."""
        replies: list[tuple[ClientRequest, bytes, bool]] = []
        self.client_changed = False
        submits = self.head.submits
        # Submits get at most this much of the turn; then the sockets are read again.
        submits.deadline = time.perf_counter() + SUBMIT_SLICE_S
        try:
            with self.store.tx():
                for req in requests:
                    reply = self._client(req, now)
                    if reply is not None:
                        replies.append(reply)
                for name, payload in node_msgs:
                    self._node(name, payload, now)
                if submits.work():
                    self.client_changed = True  # its jobs are seen by a pass before the answer
                self.head.tick(now)
                steady = time.monotonic()
                if self.head.dirty and steady >= self.schedule_after and (
                        self.client_changed or steady >= self.pass_after):
                    started = time.perf_counter()
                    self.head.schedule(now)
                    took = time.perf_counter() - started
                    if self.metrics is not None:
                        self.metrics.pass_seconds.observe(took)
                    # A pass costs O(queue): the next waits PASS_SPACING times as long, so a
                    # burst of job ends is one pass, not one each (on a small queue, no wait).
                    self.pass_after = time.monotonic() + took * defaults.PASS_SPACING
        except StoreError as exc:
            log.error("%s (a batch of %d requests and %d node messages)", exc, len(requests),
                      len(node_msgs))
            self.head.load(now)
            self.schedule_after = time.monotonic() + defaults.STORE_RETRY_S
            self.head.deferred.clear()
            answers, submitted = submits.aborted(exc)
            replies = [(r, protocol.error(_rid_of(r.payload), exc.code, str(exc)), False)
                       if accepted else (r, data, accepted) for r, data, accepted in replies]
        else:
            answers, submitted = submits.committed()
        self.head.deferred.extend(answers)
        # Parked `events` requests learn of the events this turn made durable (none if it failed).
        self.head.deferred.extend(self.head.feed.after_commit(now))
        if self.metrics is not None and submitted:
            self.metrics.submitted.inc(submitted)
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
        rid = None  # read from the payload again only for an error: a submit's is big
        try:
            msg = protocol.decode(req.payload, protocol.CLIENT_REQUESTS)
            rid_field = msg.get("rid")
            if not isinstance(rid_field, int) or isinstance(rid_field, bool) or rid_field < 0:
                raise ProtocolError("request has no integer rid (0 or more)")
            rid = rid_field
            caller = caller_of(req.user_id, msg, self.cfg.auth.admins, self.head.node_holds,
                               lambda token, via: self.head.token_caller(token, via, now))
            if caller.via:
                self._forwarded(msg["type"], caller)
            data = self._isolated(msg, caller, (req.sock, req.envelope), now)
            # A submit still in the works (data None) changes nothing yet: no pass for it now.
            self.client_changed |= msg["type"] in CHANGING_REQUESTS and data is not None
        except GqError as exc:
            if isinstance(exc, ProtocolError):
                log.warning("bad client request: %s", exc)
            return req, protocol.error(_rid_of(req.payload) if rid is None else rid, exc.code,
                                       str(exc)), False
        return None if data is None else (req, protocol.ok(rid, **data), True)

    def _forwarded(self, kind: str, caller: Any) -> None:
        """A forwarded request: only for the owner of a personal cluster; changes logged with
        the forwarder that vouched for the caller."""
        if self.owner_uid is not None and caller.uid != self.owner_uid:
            raise PermissionDenied(f"permission denied: only the cluster's owner (uid "
                                   f"{self.owner_uid}) may use it")
        if kind in CHANGING_REQUESTS:
            log.info("%s by %s (uid %d) via %s%s", kind, caller.user, caller.uid, caller.via,
                     "" if caller.proven else " (not vouched for: the node holds no job of theirs)")

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
            self.nodes.send_multipart([self.node_routes.get(name, name.encode()), data],
                                      zmq.NOBLOCK)
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
        # Addresses, the state directory and the sockets' security need a restart; everything
        # else applies now.
        cfg.head, cfg.node, cfg.client = self.cfg.head, self.cfg.node, self.cfg.client
        old = self.cfg.auth
        cfg.auth.curve, cfg.auth.key_dir, cfg.auth.owner = old.curve, old.key_dir, old.owner
        self.cfg = cfg
        self.head.configure(cfg)
        log.info("SIGHUP: configuration reloaded from %s", self.cfg.path or "defaults")

    def close(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            (Path(self.cfg.head.state_dir) / metrics.ADDR_FILE).unlink(missing_ok=True)
        self.zap.close()
        for sock in (*self.clients, self.nodes):
            sock.close()
        self.ctx.term()


def _user_id(frame: zmq.Frame) -> str:
    """What the ZAP handler vouched for on the frame's connection ("" for nothing)."""
    try:
        return frame.get("User-Id") or ""
    except (zmq.ZMQError, KeyError):
        return ""


def _owner_uid(owner: str) -> int | None:
    if not owner:
        return None
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        if owner.isdigit():
            return int(owner)
        raise ConfigError(f"[auth] owner: no such user {owner!r}") from None


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
        return int(ExitStatus.START_FAILED)
    try:
        return server.run()
    finally:
        server.close()
        store.close()
        os.close(lock)


if __name__ == "__main__":
    sys.exit(main())
