"""Users' API tokens: made, listed and revoked over a proven path, resolved for gq api.

A token is `gq_` and 43 random URL-safe characters (256 bits), shown once, at `gq token create`.
gqd keeps only its sha256 (the store's `tokens` table) with the uid it acts as, a name, its
expiry and whether it is read-only, and holds every token in memory: gq api sends the token with
each request it forwards (`as_token`, over CURVE), and gqd looks it up here, so a revoke or an
expiry takes effect on the very next request.

Only a caller the kernel (or a trusted relay) vouched for may make a token: the ipc socket, a
login host's relay, a node's relay for its jobs' owners. Never through gq api itself (a token
cannot make tokens) nor over plain TCP, where the uid is only claimed.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any

from gq import defaults, requests
from gq.errors import (GqError, NotFoundError, PermissionDenied, RefusedError, Unauthenticated,
                       UsageError)
from gq.head.auth import VIA_API, Caller
from gq.model import Job
from gq.store import Store

#: What every token starts with (so a leaked one is easy to find in logs and repositories).
PREFIX = "gq_"


@dataclass
class Token:
    id: int
    digest: str
    uid: int
    user: str
    name: str
    created: float
    expires: float | None
    read_only: bool
    #: When it was last used since gqd started (not stored: a write per API request is not
    #: worth it); None: not since.
    last_used: float | None = None

    def record(self) -> dict[str, Any]:
        """As `gq token list --json` shows it (never the token itself, which gqd has not)."""
        return {"id": self.id, "name": self.name, "user": self.user, "uid": self.uid,
                "created": self.created, "expires": self.expires, "read_only": self.read_only,
                "last_used": self.last_used}


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Tokens:
    """Every token, by digest; written through to the store inside the caller's transaction."""

    def __init__(self, store: Store):
        self.store = store
        self.load()

    def load(self) -> None:
        """(Re)read them from the store: at start, and when gqd's memory is rebuilt after a
        failed commit (which may have taken a token made or revoked in it back)."""
        self.by_digest = {row[1]: Token(row[0], row[1], row[2], row[3], row[4], row[5], row[6],
                                        bool(row[7])) for row in self.store.load_tokens()}

    def create(self, caller: Caller, msg: requests.TokenCreate, now: float) -> dict[str, Any]:
        """A new token of the caller's (an admin may make one for `user`): its one showing."""
        if not caller.proven or caller.via.startswith("api "):
            raise PermissionDenied(
                "permission denied: a token can be made only by a user the kernel vouches for "
                "(gqd's ipc socket, a login host's relay, a job's node); not over TCP or gq api")
        uid, user = caller.uid, caller.user
        if msg.user is not None and msg.user != caller.user:
            if not caller.admin:
                raise PermissionDenied("permission denied: only admins make tokens for others")
            uid, user = _uid_of(msg.user), msg.user
        expires_s = defaults.TOKEN_EXPIRES_S if msg.expires_s is None else msg.expires_s
        if not 0 < expires_s <= defaults.MAX_TOKEN_EXPIRES_S:
            raise UsageError(f"bad --expires {expires_s:g}s: expected more than 0 and at most "
                             f"{defaults.MAX_TOKEN_EXPIRES_S // 86400} days")
        name = (msg.name or "").strip()[:defaults.MAX_TOKEN_NAME] or "token"
        if sum(t.uid == uid for t in self.by_digest.values()) >= defaults.MAX_TOKENS_PER_USER:
            raise RefusedError(f"{user} has {defaults.MAX_TOKENS_PER_USER} tokens already: "
                               "revoke some (gq token list, gq token revoke ID)")
        token = PREFIX + secrets.token_urlsafe(32)
        found = Token(0, digest(token), uid, user, name, now, now + expires_s,
                      msg.read_only)
        found.id = self.store.add_token(found.digest, uid, user, name, now, found.expires,
                                        found.read_only)
        self.by_digest[found.digest] = found
        return {"token": token, **found.record()}

    def listing(self, caller: Caller, everyone: bool) -> list[dict[str, Any]]:
        if everyone and not caller.admin:
            raise PermissionDenied("permission denied: only admins list everyone's tokens")
        return [t.record() for t in sorted(self.by_digest.values(), key=lambda t: t.id)
                if everyone or t.uid == caller.uid]

    def revoke(self, caller: Caller, ids: Sequence[Any]) -> dict[str, Any]:
        by_id = {t.id: t for t in self.by_digest.values()}
        done, errors = [], {}
        for raw in ids:
            token = by_id.get(raw) if isinstance(raw, int) else None
            if token is None:
                errors[str(raw)] = f"token {raw} does not exist"
            elif token.uid != caller.uid and not caller.admin:
                errors[str(raw)] = f"permission denied: token {raw} belongs to {token.user}"
            else:
                done.append(token)
        self.store.delete_tokens(t.id for t in done)
        for token in done:
            del self.by_digest[token.digest]
        return {"done": [t.id for t in done], "errors": errors}

    def resolve(self, token: object, now: float) -> Token:
        """The live token `token` is, or Unauthenticated (unknown, revoked, expired)."""
        if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > 200:
            raise Unauthenticated("unauthenticated: no valid token")
        found = self.by_digest.get(digest(token))
        if found is None:
            raise Unauthenticated("unauthenticated: the token is unknown or was revoked")
        if found.expires is not None and now >= found.expires:
            raise Unauthenticated(f"unauthenticated: token {found.id} ({found.name}) has "
                                  "expired; make a new one with gq token create")
        found.last_used = now
        return found


class Refusals(dict):
    """Job reference -> why an action on it was refused (the reply's `errors`), with each
    refusal's error code (`codes`: the reply's `error_codes`, from which gq api takes its
    HTTP status)."""

    def __init__(self) -> None:
        super().__init__()
        self.codes: dict[str, str] = {}

    def refuse(self, key: str, exc: GqError) -> None:
        self[key] = str(exc)
        self.codes[key] = exc.code


def private(caller: Caller) -> bool:
    """Whether the caller sees only their own jobs: one acting through gq api with a token of
    a user who is not an admin (as everyone's events are). The CLI's reading stays open."""
    return caller.via.startswith(VIA_API + " ") and not caller.admin


def readable(job: Job, caller: Caller) -> Job:
    """`job`, or PermissionDenied for a private caller who does not own it."""
    if private(caller) and job.spec.uid != caller.uid:
        raise PermissionDenied(f"permission denied: job {job.ref} belongs to {job.spec.user}")
    return job


def listed_user(user: str | None, caller: Caller) -> str | None:
    """Whose jobs a listing shows: a private caller's own (asking for another's is refused)."""
    if not private(caller):
        return user
    if user not in (None, caller.user):
        raise PermissionDenied(f"permission denied: only admins list other users' jobs "
                               f"through gq api ({caller.user} asked for {user}'s)")
    return caller.user


def _uid_of(user: str) -> int:
    import pwd
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise NotFoundError(f"no such user {user!r}") from None
