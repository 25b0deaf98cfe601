"""Who is calling: a ZAP handler that turns the kernel's SO_PEERCRED on ipc sockets into a uid.

libzmq passes the peer's `uid:gid:pid` (from SO_PEERCRED) as the ZAP request's address on ipc
connections; we answer with that uid as the connection's User-Id, which then rides on every
message. The uid never comes from the message itself. TCP callers have no such proof: they are
"claimed" identities, allowed to read only. gqnodes prove themselves with CURVE keys.

Forwarders (relays) prove themselves with CURVE keys too, on gqd's relay endpoint: a login host's
`gq relay` (key in key_dir/relays/, User-Id `relay:NAME`), gq api's (`api:NAME`), and gqnodes
forwarding their jobs' requests (their node key, `node:NAME`). A forwarded request carries
`as_uid`, the uid the forwarder learnt from its own kernel; only on such a connection does gqd
read it (`caller_of`), and a node is believed only for the owners of jobs it holds.
"""

from __future__ import annotations

import grp
import logging
import os
import pwd
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from gq.errors import PermissionDenied, ProtocolError
from gq.keys import API, LOGIN, allowed_nodes, allowed_relays

log = logging.getLogger("gq.head.auth")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: The ZAP domain gqd's client sockets set, so every connection goes through the handler.
DOMAIN = b"gq"
#: The ZAP domain of gqd's node socket (CURVE keys, checked against the allow-list).
NODE_DOMAIN = b"gq-nodes"
#: The ZAP domain of gqd's relay endpoint (CURVE keys of relays, and of nodes).
RELAY_DOMAIN = b"gq-relays"
#: User-Id prefixes of forwarders on the relay endpoint ("relay:NAME"): a login host's relay,
#: gq api's, a gqnode's.
VIA_RELAY, VIA_API, VIA_NODE = "relay", "api", "node"
_VIA_OF_KIND = {LOGIN: VIA_RELAY, API: VIA_API}
#: A refused peer's cause is logged at most once per this many seconds.
REFUSAL_LOG_S = 60.0


@dataclass(frozen=True)
class Caller:
    uid: int
    user: str
    #: True when the kernel vouched for the uid (ipc, or a trusted relay's); False for a claim
    #: made over TCP (or forwarded by a node that holds no job of the uid's).
    proven: bool
    admin: bool = False
    #: The forwarder the request came through ("relay login1", "node gpu3"); "" when direct.
    via: str = ""
    #: It acts through a read-only API token: nothing that changes the queue.
    read_only: bool = False


class ZapHandler:
    """Decides every connection (a daemon thread): clients by the kernel's uid, nodes by key.

    Client connections (DOMAIN) are accepted and tagged with the ipc peer's uid; with `owner_uid`
    set (a personal cluster) only that uid is admitted and TCP callers not at all. Node
    connections (NODE_DOMAIN) must present a CURVE key from the allow-list in `key_dir`; their
    User-Id is the node name that key is bound to, which gqd checks on every message.
    """

    def __init__(self, ctx: zmq.Context, owner_uid: int | None = None,
                 key_dir: Path | None = None):
        self.owner_uid = owner_uid
        self.key_dir = key_dir
        self._logged: dict[tuple[bytes, ...], float] = {}
        self._sock = ctx.socket(zmq.REP)
        self._sock.linger = 0
        self._sock.bind(ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._run, name="zap", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                frames = self._sock.recv_multipart()
            except zmq.ZMQError:
                # The context is terminating (gqd is stopping): the socket is closed here, by
                # its own thread, which is what lets ctx.term() return.
                self._sock.close(linger=0)
                return
            version, request_id = frames[:2]
            try:
                code, text, user_id = self.decide(frames)
            except Exception as exc:  # a bad request must not end the thread (and all logins)
                code, text, user_id = b"500", f"internal error: {exc}", ""
            self._sock.send_multipart([version, request_id, code, text.encode(),
                                       user_id.encode(), b""])

    def decide(self, frames: list[bytes]) -> tuple[bytes, str, str]:
        """(status code, status text, User-Id) for a ZAP request."""
        domain, address, _identity, mechanism = frames[2:6]
        if domain == NODE_DOMAIN:
            return self._node(mechanism, frames[6:])
        if domain == RELAY_DOMAIN:
            return self._relay(mechanism, frames[6:])
        uid = peer_uid(address)
        if self.owner_uid is not None and uid != str(self.owner_uid):
            self._refusal((b"owner", uid.encode()), "refused a client of uid %s: only the "
                          "owner (uid %d) may use this cluster", uid or "unknown (TCP)",
                          self.owner_uid)
            return b"400", "only the cluster's owner may connect", ""
        return b"200", "OK", uid

    def _node(self, mechanism: bytes, credentials: list[bytes]) -> tuple[bytes, str, str]:
        if mechanism != b"CURVE" or not credentials or self.key_dir is None:
            return b"400", "nodes must use CURVE", ""
        key = z85.encode(credentials[0])
        name = allowed_nodes(self.key_dir).get(key)
        if name is None:
            self._refusal((b"key", key), "refused a node with an unknown CURVE key %s: not in %s",
                          key.decode(), self.key_dir / "nodes")
            return b"400", "unknown node key", ""
        return b"200", "OK", name

    def _relay(self, mechanism: bytes, credentials: list[bytes]) -> tuple[bytes, str, str]:
        """A relay by its key in relays/ (`relay:NAME`, `api:NAME` by its kind), or a node
        forwarding its jobs' requests by its key in nodes/ (`node:NAME`)."""
        if mechanism != b"CURVE" or not credentials or self.key_dir is None:
            return b"400", "relays must use CURVE", ""
        key = z85.encode(credentials[0])
        relay = allowed_relays(self.key_dir).get(key)
        if relay is not None:
            return b"200", "OK", f"{_VIA_OF_KIND[relay[1]]}:{relay[0]}"
        node = allowed_nodes(self.key_dir).get(key)
        if node is not None:
            return b"200", "OK", f"{VIA_NODE}:{node}"
        self._refusal((b"relay", key), "refused a relay with an unknown CURVE key %s: not in %s "
                      "(gq admin keygen --relay NAME)", key.decode(), self.key_dir / "relays")
        return b"400", "unknown relay key", ""

    def _refusal(self, what: tuple[bytes, ...], fmt: str, *args: object) -> None:
        """Log a refusal, once a minute per cause (a refused peer reconnects every second)."""
        now = time.monotonic()
        if len(self._logged) > 1000:  # many distinct causes: an attack; keep memory bounded
            self._logged.clear()
        if now - self._logged.get(what, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:
            self._logged[what] = now
            log.warning(fmt, *args)

    def close(self) -> None:
        """Nothing to do before the context's term(): the handler's thread closes its socket
        when term() interrupts its recv. Closing it from another thread while that thread is
        blocked in recv on it is not safe in libzmq (gqd hung in ctx.term() after SIGTERM, about
        one stop in five with a few hundred jobs)."""


def user_id_of(frame: zmq.Frame) -> str:
    """What the ZAP handler vouched for on the frame's connection ("" for nothing)."""
    try:
        return str(frame.get("User-Id") or "")
    except (zmq.ZMQError, KeyError):
        return ""


def peer_uid(address: bytes) -> str:
    """`uid` from an ipc ZAP address `host:uid:gid:pid`; empty for TCP addresses."""
    parts = address.decode(errors="replace").split(":")
    if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
        return parts[1]
    return ""


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def caller_of(user_id: str, msg: dict[str, object], admins: list[str],
              node_holds: Callable[[str, int], bool] = lambda node, uid: False,
              token_of: Callable[[object, str], Caller] | None = None) -> Caller:
    """The caller: the kernel's uid when we have it (ipc: ours; a relay's: its `as_uid`), else
    what the message claims. `node_holds(node, uid)`: whether a job of uid's holds an allocation
    on node, the only uids a node may speak for."""
    forwarder, _, name = user_id.partition(":")
    if name and forwarder == VIA_API and token_of is not None and "as_token" in msg:
        # gq api acts only through a user's token (gq/head/tokens.py), never a bare uid.
        return token_of(msg.get("as_token"), f"{forwarder} {name}")
    if name:
        return _forwarded(forwarder, name, msg.get("as_uid"), admins, node_holds)
    claimed_uid, claimed_user = msg.get("claim_uid"), msg.get("claim_user")
    if user_id:
        uid = int(user_id)
        name = user_name(uid)
        proven = True
    else:
        uid = claimed_uid if isinstance(claimed_uid, int) else -1
        name = claimed_user if isinstance(claimed_user, str) and claimed_user else user_name(uid)
        proven = False
    admin = name in admins or (proven and (uid == 0 or _in_admin_group(name, uid, admins)))
    return Caller(uid=uid, user=name, proven=proven, admin=admin)


def _forwarded(forwarder: str, name: str, as_uid: object, admins: list[str],
               node_holds: Callable[[str, int], bool]) -> Caller:
    """The caller of a request a relay or a node forwarded, with the uid it proved."""
    via = f"{forwarder} {name}"
    if forwarder == VIA_API:
        # gq api acts through users' tokens only (as_token, above): a bare uid from it is
        # refused, so a compromised API host cannot impersonate anyone.
        raise PermissionDenied(f"permission denied: {via} is an api relay, which may act only "
                               "through a user's token, not for a bare uid")
    if type(as_uid) is not int or not 0 <= as_uid < 2**32:
        raise ProtocolError(f"a request forwarded by {via} has no as_uid (the uid it proved)")
    user = user_name(as_uid)
    if forwarder == VIA_NODE:
        # A node speaks for the owners of the jobs it holds, and as no more than a plain user:
        # root on a node cannot act as an admin, nor as anyone without a job there.
        return Caller(uid=as_uid, user=user, proven=node_holds(name, as_uid), via=via)
    return Caller(uid=as_uid, user=user, proven=True, admin=is_admin(user, as_uid, admins),
                  via=via)


def is_admin(user: str, uid: int, admins: list[str]) -> bool:
    """Whether a proven caller is an admin: root, named in [auth] admins or in a %GROUP there."""
    return user in admins or uid == 0 or _in_admin_group(user, uid, admins)


def _in_admin_group(name: str, uid: int, admins: list[str]) -> bool:
    """Whether the user is in a group named `%GROUP` (sudoers' way) among the admins."""
    groups = [a[1:] for a in admins if a.startswith("%")]
    if not groups:
        return False
    try:
        mine = set(os.getgrouplist(name, pwd.getpwuid(uid).pw_gid))
    except KeyError:
        return False
    for group in groups:
        try:
            if grp.getgrnam(group).gr_gid in mine:
                return True
        except KeyError:
            continue
    return False
