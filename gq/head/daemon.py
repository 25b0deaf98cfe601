"""gqd: the sockets and the single event loop around `Head` (receive, persist, plan, send)."""

from __future__ import annotations

import logging
import math
import os
import pwd
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from gq import config as config_mod
from gq import defaults, keys, protocol, service, unpack
from gq.errors import (ConfigError, ExitStatus, GqError, PermissionDenied, ProtocolError,
                       RefusedError, StoreError, start_status)
from gq.fsutil import make_dirs, private_dir
from gq.head.auth import DOMAIN, NODE_DOMAIN, RELAY_DOMAIN, ZapHandler, caller_of
from gq.head.auth import user_id_of as _user_id
from gq.protocol import rid_of as _rid_of
from gq.head import metrics
from gq.head.core import CHANGING_REQUESTS, Head
from gq.head.passguard import PassGuard, with_faults
from gq.head.submits import SLICE_S as SUBMIT_SLICE_S
from gq.pidfile import acquire
from gq.store import Store

log = logging.getLogger("gq.head")


@dataclass
class ClientRequest:
    sock: zmq.Socket
    envelope: list[bytes]
    payload: bytes | memoryview
    user_id: str
    #: A large payload, unpacked a slice a turn before the request is handled.
    unpacking: unpack.Unpacking | None = None

    def message(self) -> dict[str, Any]:
        """The request, checked; ProtocolError if it is not a valid one."""
        if self.unpacking is None:
            return protocol.decode(self.payload, protocol.CLIENT_REQUESTS)
        return protocol.checked(self.unpacking.value(), protocol.CLIENT_REQUESTS)


class HeadServer:
    def __init__(self, cfg: config_mod.Config, store: Store):
        self.cfg = cfg
        self.store = store
        self.head = Head(cfg, store, time.time())
        #: A pass that raises is taken back, counted and tried again later (passguard.py).
        self.guard = PassGuard()
        self.pass_fn = with_faults(self.head.schedule)
        # Issue 13 (monotonic clocks): schedule_after and pass_after are time.monotonic(), so a
        # step of the wall clock cannot hold back passes for the hour it stepped.
        #: No scheduling pass before this time (set after a failed commit).
        self.schedule_after = 0.0
        #: No pass for node events (job ends) before this time, the spacing after the last pass;
        #: a client's change (submit, cancel, hold...) gets a pass in the turn that answers it.
        self.pass_after = 0.0
        #: A request handled in the batch changed the queue.
        self.client_changed = False
        self.ctx = zmq.Context()
        key_dir = Path(cfg.auth.key_dir) if cfg.auth.curve else None
        curve = keys.head_keys(key_dir) if key_dir else None  # a missing key stops gqd here
        # Must run before any bind, so no connection skips it.
        self.owner_uid = _owner_uid(cfg.auth.owner)
        self.zap = ZapHandler(self.ctx, self.owner_uid, key_dir)
        #: Large client frames being unpacked a slice a turn, oldest first, and their bytes.
        self.large: deque[ClientRequest] = deque()
        self.large_bytes = 0
        self.clients = [self._bind_client(ep) for ep in cfg.head.client_endpoints]
        #: The relay endpoint's socket, whose requests carry the client's routing id too.
        self.relays: zmq.Socket | None = None
        if cfg.head.relay_endpoint and curve is not None:
            # Relays' requests are client requests in all but who vouches for the caller.
            self.relays = self._bind_relays(cfg.head.relay_endpoint, curve)
            self.clients.append(self.relays)
        elif cfg.head.relay_endpoint:
            log.warning("[auth] curve = false: relays are known only by their keys, so %s is "
                        "not served (no login host can submit)", cfg.head.relay_endpoint)
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
        self.metrics.publish(metrics.sample(
            self.head.index, self.head.nodes.values(), self.cfg.qos,
            metrics.pending_demand(self.head.last_pending, self.head.jobs)))
        cost = time.monotonic() - start
        self.publish_at = start + max(metrics.PUBLISH_S, cost / metrics.MAX_LOAD)

    def _bind_nodes(self, endpoint: str, curve: keys.CurveKeys | None) -> zmq.Socket:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone node raises, not drops
        # A node reconnecting after a partition takes over its (secret, random) routing id.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.linger = 0
        sock.maxmsgsize = defaults.MAX_NODE_MESSAGE_BYTES
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
        # libzmq drops a larger frame, and its connection, before gqd sees any of it. TCP
        # callers may only read (unless trusted): no request of theirs needs more.
        sock.maxmsgsize = defaults.MAX_TCP_REQUEST_BYTES if endpoint.startswith("tcp://") \
            and not self.cfg.auth.trust_tcp else defaults.MAX_MESSAGE_BYTES
        if endpoint.startswith("ipc://"):
            path = Path(endpoint[len("ipc://"):])
            make_dirs(path.parent)  # 0755 under gqd's umask: who may connect is ZAP's call
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
            timeout_ms = 0 if due or self.large else math.ceil(tick * 1000)
            asked = time.monotonic()
            events = dict(self.poller.poll(timeout_ms))
            woke = time.monotonic()
            if self.signals.wake_r.fileno() in events or self.signals.wake_r in events:
                self.signals.drain()
            if self.signals.stop_requests >= 2:
                log.warning("second stop signal: stopping now")
                return int(ExitStatus.STOPPED_AT_ONCE)
            if self.signals.reload:
                self._reload()
            requests = [r for s in self.clients if s in events for r in self._recv_clients(s)]
            requests += self._unpack_large()
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
        """The requests that arrived on `sock`, as many as this turn takes: MAX_BATCH, of
        frames up to RECV_BYTES_PER_TURN in all. A large frame joins those unpacked a slice a
        turn (_unpack_large) instead."""
        out: list[ClientRequest] = []
        budget = defaults.RECV_BYTES_PER_TURN
        for _ in range(defaults.MAX_BATCH):
            if budget <= 0:
                break
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            req = self._request(sock, frames)
            if req is None:
                continue
            if len(req.payload) <= defaults.DECODE_SLICE_BYTES:
                budget -= len(req.payload)
                out.append(req)
            elif self.large_bytes + len(req.payload) > defaults.MAX_DECODING_BYTES:
                self._send_client(sock, req.envelope, protocol.error(
                    protocol.rid_of(req.payload), RefusedError.code,
                    f"gqd is busy reading {self.large_bytes} bytes of other large requests; "
                    "try again in a moment"))
            else:
                req.unpacking = protocol.unpacking(req.payload)
                self.large.append(req)
                self.large_bytes += len(req.payload)
        return out

    def _request(self, sock: zmq.Socket, frames: list[zmq.Frame]) -> ClientRequest | None:
        """A request from a DEALER ([routing id, payload]) or a REQ ([routing id, b"",
        payload]) peer, or through a relay ([relay's routing id, client's, payload]); any other
        shape is answered with an error, its frames unread."""
        envelope = frames[:-1]
        if sock is self.relays:
            bad = len(frames) != 3 or not len(frames[1])
        else:
            bad = len(frames) > 3 or len(frames) == 3 and len(frames[1]) > 0
        if bad or any(len(f) > 255 for f in envelope):
            self._send_client(sock, [frames[0].bytes[:255]], protocol.error(
                0, ProtocolError.code, f"a request is one frame, not {len(frames) - 1}"))
            return None
        last = frames[-1]
        # A large frame is read where libzmq put it, not copied (16 MiB take milliseconds).
        payload = last.bytes if len(last) <= defaults.DECODE_SLICE_BYTES else last.buffer
        return ClientRequest(sock, [f.bytes for f in envelope], payload, _user_id(last))

    def _unpack_large(self) -> list[ClientRequest]:
        """Unpack the large frames, oldest first, for up to DECODE_SLICE_S: the requests that
        are whole now. The others' requests wait for one slice of them, not for all."""
        done = []
        deadline = time.perf_counter() + defaults.DECODE_SLICE_S
        while self.large and time.perf_counter() < deadline:
            req = self.large[0]
            assert req.unpacking is not None
            if req.unpacking.step(defaults.DECODE_SLICE_BYTES):
                self.large.popleft()
                self.large_bytes -= len(req.payload)
                done.append(req)
        return done

    def _recv_nodes(self) -> list[tuple[str, bytes]]:
        """Node messages, as many as this turn takes (MAX_BATCH, of frames up to
        RECV_BYTES_PER_TURN in all)."""
        out = []
        budget = defaults.RECV_BYTES_PER_TURN
        for _ in range(defaults.MAX_BATCH):
            if budget <= 0:
                break
            try:
                frames = self.nodes.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            if len(frames) != 2:
                log.warning("dropping node message of %d frames", len(frames))
                continue
            budget -= len(frames[1])
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
        """Handle everything that arrived in one transaction (group commit) and answer it at
        commit; then, if one is due, a pass in a transaction of its own. A reply waits for what
        it asked to be durable, never for a pass (issue 17): on a long queue a pass costs
        hundreds of milliseconds. The next request is read only after the pass, so a caller's
        next call still sees what the pass made of its change."""
        self._handle(requests, node_msgs, now)
        steady = time.monotonic()
        if self.head.dirty and steady >= self.schedule_after and (
                self.client_changed or steady >= self.pass_after):
            self._schedule(now)

    def _handle(self, requests: list[ClientRequest], node_msgs: list[tuple[str, bytes]],
                now: float) -> None:
        replies: list[tuple[ClientRequest, bytes, bool]] = []
        self.client_changed = False
        submits = self.head.submits
        # Submits get at most this much of the turn; then the sockets are read again.
        submits.deadline = time.perf_counter() + SUBMIT_SLICE_S
        try:
            with self.head.tx():
                for req in requests:
                    reply = self._client(req, now)
                    if reply is not None:
                        replies.append(reply)
                for name, payload in node_msgs:
                    self._node(name, payload, now)
                if submits.work():
                    self.client_changed = True  # its jobs are seen by a pass before the next read
                self.head.tick(now)
        except StoreError as exc:
            # Memory went back to the last commit with the store (Head.tx); nodes stay
            # registered, and the reports not acked come again.
            log.error("%s (a batch of %d requests and %d node messages)", exc, len(requests),
                      len(node_msgs))
            self._store_failed()
            answers, submitted = submits.aborted(exc)
            replies = [(r, protocol.error(_rid_of(r.payload), exc.code, str(exc)), False)
                       if accepted else (r, data, accepted) for r, data, accepted in replies]
        else:
            answers, submitted = submits.committed()
        self.head.deferred.extend(answers)
        if self.metrics is not None and submitted:
            self.metrics.submitted.inc(submitted)
        self._send(replies, now)

    def _schedule(self, now: float) -> None:
        """One pass in its own transaction; its starts go to the nodes once committed."""
        try:
            with self.head.tx():
                started = time.perf_counter()
                self.pass_fn(now)
                took = time.perf_counter() - started
        except StoreError as exc:
            log.error("%s (a scheduling pass)", exc)
            self._store_failed()
        except Exception as exc:
            # A bug in the pass: taken back whole by its transaction; gqd goes on answering.
            self.head.reset_pass_caches()
            self._store_failed(self.guard.failed(exc))
            if self.metrics is not None:
                self.metrics.pass_failures.inc()
        else:
            self.guard.succeeded()
            if self.metrics is not None:
                self.metrics.pass_seconds.observe(took)
            # A pass costs O(queue): the next waits PASS_SPACING times as long, so a burst of
            # job ends is one pass, not one each (on a small queue, no wait).
            self.pass_after = time.monotonic() + took * defaults.PASS_SPACING
        self._send([], now)

    def _store_failed(self, wait: float = defaults.STORE_RETRY_S) -> None:
        self.schedule_after = time.monotonic() + wait
        self.head.deferred.clear()

    def _send(self, replies: list[tuple[ClientRequest, bytes, bool]], now: float) -> None:
        """After a commit (or its failure): replies, deferred answers, orders, mail."""
        # Parked `events` requests learn of the events this turn made durable (none if it failed).
        self.head.deferred.extend(self.head.feed.after_commit(now))
        for req, data, _ in replies:
            self._send_client(req.sock, req.envelope, data)
        for (sock, envelope), data in self.head.deferred:
            self._send_client(sock, envelope, data)
        self.head.deferred.clear()
        for order in self.head.take_orders():
            self._send_node(order.node, order.encode())
        self.head.table.mailer.send()
        self.head.power.send()

    def _client(self, req: ClientRequest, now: float) -> tuple[ClientRequest, bytes, bool] | None:
        """(request, reply, accepted) — or None when the reply is deferred."""
        rid = None  # read from the payload again only for an error: a submit's is big
        try:
            msg = req.message()
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
        """Run one request in a savepoint: a bug in it costs that request alone (its changes
        are taken back, in the store and in memory), never a reload."""
        try:
            with self.head.isolated("request"):
                return self.head.handle_client(msg, caller, client, now)
        except GqError:
            raise
        except Exception as exc:
            log.exception("internal error handling %s", msg.get("type"))
            raise GqError(f"internal error in gqd: {type(exc).__name__}: {exc}") from None

    def _node(self, name: str, payload: bytes, now: float) -> None:
        try:
            msg = protocol.from_node(payload)
            with self.head.isolated("node"):
                self.head.handle_node(name, msg, now)
        except GqError as exc:
            log.warning("dropping message from node %r: %s", name, exc)
        except Exception:
            # Taken back whole (not acked: a report comes again); gqd goes on.
            log.exception("internal error handling a message from node %r", name)

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


def _owner_uid(owner: str) -> int | None:
    if not owner:
        return None
    try:
        return pwd.getpwnam(owner).pw_uid
    except KeyError:
        if owner.isdigit():
            return int(owner)
        raise ConfigError(f"[auth] owner: no such user {owner!r}") from None


def main(argv: list[str] | None = None) -> int:
    parser = service.parser("gqd", "gq head daemon")
    args = parser.parse_args(argv)
    service.setup_logging(args.log_level)
    # Everything gqd creates is its own: the database holds every job's script and environment.
    os.umask(0o077)
    try:
        cfg = config_mod.load(args.config)
        state_dir = Path(cfg.head.state_dir)
        private_dir(state_dir, _state_dir_mode(cfg))
        lock = acquire(state_dir / "gqd.pid")
        store = Store(state_dir / defaults.DB_FILE)
        server = HeadServer(cfg, store)
    except (GqError, OSError, zmq.ZMQError) as exc:
        # A refused database (StoreRefused: nothing was written to it) has a status of its own,
        # which the unit's RestartPreventExitStatus lists.
        log.error("gqd cannot start: %s", exc)
        return start_status(exc)
    try:
        return server.run()
    finally:
        server.close()
        store.close()
        os.close(lock)


def _state_dir_mode(cfg: config_mod.Config) -> int:
    """0700; 0711 where gqnode's state directory is inside gqd's (the default paths, on a host
    that is also a node): its jobs execute their scripts, as their owners, from run directories
    down there, which needs search permission on every directory above. Others still cannot
    list it, and every file in it is 0600."""
    node_dir = Path(cfg.node.state_dir.replace("{name}", "x")).absolute()
    return 0o711 if Path(cfg.head.state_dir).absolute() in node_dir.parents else 0o700


if __name__ == "__main__":
    sys.exit(main())
