"""Who is calling: a ZAP handler that turns the kernel's SO_PEERCRED on ipc sockets into a uid.

libzmq passes the peer's `uid:gid:pid` (from SO_PEERCRED) as the ZAP request's address on ipc
connections; we answer with that uid as the connection's User-Id, which then rides on every
message. The uid never comes from the message itself. TCP callers have no such proof: they are
"claimed" identities until CURVE keys arrive (the security issue).
"""

from __future__ import annotations

import logging
import pwd
import threading
from dataclasses import dataclass

import zmq

log = logging.getLogger("gq.head.auth")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
#: The ZAP domain gqd's client sockets set, so every connection goes through the handler.
DOMAIN = b"gq"


@dataclass(frozen=True)
class Caller:
    uid: int
    user: str
    #: True when the kernel vouched for the uid (ipc); False for a claim made over TCP.
    proven: bool
    admin: bool = False


class ZapHandler:
    """Accepts every connection, tagging ipc ones with the peer's uid (a daemon thread)."""

    def __init__(self, ctx: zmq.Context):
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
                return  # context terminated: gqd is stopping
            version, request_id, _domain, address = frames[:4]
            self._sock.send_multipart([version, request_id, b"200", b"OK",
                                       peer_uid(address).encode(), b""])

    def close(self) -> None:
        self._sock.close(linger=0)


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


def caller_of(user_id: str, claimed_uid: object, claimed_user: object, admins: list[str]) -> Caller:
    """The caller: the kernel's uid when we have it, else what the message claims."""
    if user_id:
        uid = int(user_id)
        name = user_name(uid)
        proven = True
    else:
        uid = claimed_uid if isinstance(claimed_uid, int) else -1
        name = claimed_user if isinstance(claimed_user, str) and claimed_user else user_name(uid)
        proven = False
    return Caller(uid=uid, user=name, proven=proven, admin=name in admins or uid == 0 and proven)
