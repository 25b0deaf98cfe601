"""The `events` request: job and node events (gq/events.py) after a sequence number, parked
until there are some.

A request is answered at once when committed events match it, else parked, like `wait`, and
answered in the loop turn that commits the first event that matches (gqd's loop calls
`after_commit` once the turn's transaction is on disk): an event is never sent before it is
durable, and a consumer learns of it within the turn that made it.

Who sees what: a user sees node events and their own jobs' events; admins see every job's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gq import defaults, events, protocol, requests
from gq.errors import GoneError, PermissionDenied, ProtocolError
from gq.head.auth import Caller
from gq.store import Store


@dataclass(frozen=True)
class Filter:
    """Which events a request wants and may see (None: any)."""

    uid: int | None = None
    user: str | None = None
    job: int | None = None
    array: int | None = None
    kinds: frozenset[str] | None = None

    def sql(self) -> dict[str, Any]:
        return {"uid": self.uid, "user": self.user, "job": self.job, "array": self.array,
                "kinds": self.kinds}

    def matches(self, event: dict[str, Any]) -> bool:
        return events.matches(event, **self.sql())


@dataclass
class Parked:
    client: Any
    rid: int
    #: Every event up to here was looked at for it.
    since: int
    filter: Filter
    limit: int
    #: On the steady clock (Head.steady).
    deadline: float


class Feed:
    def __init__(self, store: Store, steady: Callable[[float], float]):
        self.store = store
        self.steady = steady
        self.parked: list[Parked] = []
        #: The last seq known to be committed: no reply tells of one past it.
        self.committed = store.event_bounds()[1]
        #: When events are next pruned (steady clock).
        self.prune_at = 0.0

    def request(self, msg: requests.Events, caller: Caller, client: Any, now: float
                ) -> dict[str, Any] | None:
        """Reply data for an `events` request, or None when it is parked."""
        wanted = _filter(msg, caller)
        limit = msg.limit or defaults.EVENTS_PAGE
        if limit > defaults.MAX_EVENTS_PAGE:
            raise ProtocolError(f"events: limit {limit} is over {defaults.MAX_EVENTS_PAGE}")
        first, last = self.store.event_bounds()
        last = min(last, self.committed)
        since = msg.since
        if since is not None and since < 0:  # the field's range is a time's (history's since)
            raise ProtocolError(f"events: since is a sequence number, 0 or more, not {since}")
        if since is None:  # from now on (or, with `oldest`, from the oldest kept)
            since = first - 1 if msg.oldest else last
        elif since < first - 1:
            raise GoneError(f"events after {since} are no longer kept: the oldest is {first} "
                            f"(kept {defaults.EVENTS_KEEP_S / 86400:g} days by default, "
                            "[head] events_keep_s); ask from there")
        elif since > last:
            raise GoneError(f"event {since} is past the last one, {last}: was gqd's database "
                            "replaced? Start again without since")
        found, until = self._read(since, last, wanted, limit)
        park_s = min(float(msg.park_s or 0.0), defaults.MAX_PARK_S)
        if found or park_s <= 0 or until < last:
            return self._reply(found, until, first)
        self.parked.append(Parked(client, msg.rid, until, wanted, limit,
                                  self.steady(now) + park_s))
        return None

    def _read(self, since: int, last: int, wanted: Filter, limit: int
              ) -> tuple[list[dict[str, Any]], int]:
        """The events after `since` that match, at most `limit`, looking at no more than
        MAX_EVENTS_SCAN; and the seq up to which all were looked at."""
        until = min(last, since + defaults.MAX_EVENTS_SCAN)
        found = self.store.events_since(since, until, limit=limit, **wanted.sql())
        if len(found) == limit:
            until = found[-1]["seq"]
        return found, until

    def _reply(self, found: list[dict[str, Any]], until: int, first: int | None = None
               ) -> dict[str, Any]:
        """`events`, `next` (ask for those after it next), `first` (the oldest kept) and
        `last` (the newest committed)."""
        if first is None:
            first = self.store.event_bounds()[0]
        return {"events": found, "next": until, "first": first, "last": self.committed}

    def after_commit(self, now: float) -> list[tuple[Any, bytes]]:
        """After a turn's transaction committed: the answers to parked requests that its events
        match, or whose time is up."""
        first, last = self.store.event_bounds()
        fresh: list[dict[str, Any]] = []
        if last > self.committed and self.parked:
            fresh = self.store.events_since(self.committed, last, limit=defaults.MAX_EVENTS_SCAN)
            last = fresh[-1]["seq"] if len(fresh) == defaults.MAX_EVENTS_SCAN else last
        self.committed = last
        if not self.parked:
            return []
        pack = protocol.packer()
        packed: dict[int, bytes] = {}  # each event packed once for all who get it
        steady, out, keep = self.steady(now), [], []
        for p in self.parked:
            mine = [e for e in fresh if e["seq"] > p.since and p.filter.matches(e)][:p.limit]
            if mine or steady >= p.deadline:
                until = mine[-1]["seq"] if len(mine) == p.limit else last
                parts = [packed.get(e["seq"]) or packed.setdefault(e["seq"], pack(e))
                         for e in mine]
                out.append((p.client, protocol.ok(p.rid, **self._reply(
                    protocol.PackedItems(mine, parts), until, first))))
            else:
                p.since = last
                keep.append(p)
        self.parked = keep
        return out

    def prune(self, now: float, keep_s: float, keep_rows: int) -> None:
        """Drop events past their retention, at most every EVENTS_PRUNE_S (inside the turn's
        transaction)."""
        steady = self.steady(now)
        if steady >= self.prune_at:
            self.prune_at = steady + defaults.EVENTS_PRUNE_S
            self.store.prune_events(now - keep_s, keep_rows)


def _filter(msg: requests.Events, caller: Caller) -> Filter:
    """The request's filters, narrowed to what the caller may see."""
    user = msg.user
    if user is not None and user != caller.user and not caller.admin:
        raise PermissionDenied(f"permission denied: only admins see other users' events "
                               f"({caller.user} asked for {user}'s)")
    kinds = None
    if msg.kinds is not None:
        if not all(k in events.KINDS for k in msg.kinds):
            raise ProtocolError(f"events: kinds must be among {', '.join(events.KINDS)}")
        kinds = frozenset(msg.kinds)
    return Filter(uid=None if caller.admin else caller.uid, user=user, job=msg.job,
                  array=msg.array, kinds=kinds)
