"""Job and node events (gq/events.py, gq/head/feed.py) and API tokens (gq/head/tokens.py), on a
real store driven turn by turn as gqd's loop drives it: an event exists exactly when its change
is committed, a parked `events` request is answered in the turn that commits a match, a user
sees only their own jobs', and a token acts as its user until it is revoked or expires."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

from gq import protocol
from gq.config import Config
from gq.errors import (GoneError, PermissionDenied, ProtocolError, StoreError, Unauthenticated,
                       UsageError)
from gq.head.auth import Caller
from gq.head.core import Head
from gq.model import JobSpec, Node, NodeState
from gq.store import Store

ANN = Caller(uid=1000, user="ann", proven=True)
BOB = Caller(uid=1001, user="bob", proven=True)
ROOT = Caller(uid=0, user="root", proven=True, admin=True)
T0 = 1_000_000.0


def _spec(user: Caller = ANN, **kw: Any) -> dict[str, Any]:
    return JobSpec(script="#!/bin/sh\ntrue\n", uid=user.uid, gid=user.uid, cwd="/tmp", gpus=1,
                   **kw).to_dict()


def _head(tmp_path: Path) -> Head:
    return Head(Config(path=""), Store(tmp_path / "gq.db"), T0, steady=lambda now: now)


def _turn(head: Head, msg: dict[str, Any], caller: Caller = ANN, now: float = T0,
          fail: bool = False) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """One request in one loop turn as gqd runs it: its direct reply (which gqd would not send
    if the turn `fail`s), and the answers to parked `events` requests sent after the commit."""
    head.submits.deadline = None
    reply = None
    try:
        with head.tx():
            reply = head.handle_client({"rid": 1, **msg}, caller, "client", now)
            head.tick(now)
            if fail:
                raise StoreError("disk full (test)")
    except StoreError:
        pass  # memory went back with the store (Head.tx)
    answers = head.feed.after_commit(now)
    return reply, [msgpack.unpackb(data, raw=False) for _, data in answers]


def _events(head: Head, caller: Caller = ANN, **fields: Any) -> dict[str, Any]:
    reply, _ = _turn(head, {"type": "events", "since": 0, **fields}, caller)
    assert reply is not None
    return reply


def test_submits_and_state_changes_are_events_in_order_with_durable_sequence_numbers(
        tmp_path: Path) -> None:
    head = _head(tmp_path)
    ids = _turn(head, {"type": "submit", "jobs": [_spec(), _spec(array="0-2")]})[0]["ids"]
    _turn(head, {"type": "hold", "ids": [ids[0]]})
    _turn(head, {"type": "cancel", "ids": [ids[1]]})
    got = _events(head)["events"]
    assert [(e["id"], e["state"], e["hold"]) for e in got] == [
        (1, "PENDING", ""), (2, "PENDING", ""), (3, "PENDING", ""), (4, "PENDING", ""),
        (1, "PENDING", "user"), (2, "CANCELLED", ""), (3, "CANCELLED", ""),
        (4, "CANCELLED", "")]
    assert [e["seq"] for e in got] == list(range(1, 9))
    assert [e["job_id"] for e in got[1:4]] == ["2_0", "2_1", "2_2"]
    assert got[0]["user"] == "ann" and got[0]["time"] == T0
    # A reason rewritten by a pass (the job stays PENDING) is no event.
    head.schedule(T0)
    assert _events(head)["next"] == 8
    head.store.close()
    again = Head(Config(path=""), Store(tmp_path / "gq.db"), T0, steady=lambda now: now)
    _turn(again, {"type": "release", "ids": [ids[0]]})
    after = _events(again, since=8)["events"]
    assert [(e["seq"], e["id"], e["hold"]) for e in after] == [(9, 1, "")], \
        "sequence numbers go on after a restart"


def test_a_failed_commit_leaves_no_event_and_its_sequence_number_is_not_skipped(
        tmp_path: Path) -> None:
    head = _head(tmp_path)
    _turn(head, {"type": "submit", "jobs": [_spec()]}, fail=True)
    assert _events(head)["events"] == []
    _turn(head, {"type": "submit", "jobs": [_spec()]})
    assert [e["seq"] for e in _events(head)["events"]] == [1]


def test_a_parked_request_is_answered_in_the_turn_that_commits_a_match(tmp_path: Path) -> None:
    head = _head(tmp_path)
    (first,) = _turn(head, {"type": "submit", "jobs": [_spec()]})[0]["ids"]
    park = {"type": "events", "since": 1, "park_s": 30.0}
    assert _turn(head, {**park, "job": first}) == (None, [])
    assert _turn(head, park, BOB) == (None, [])
    # Bob's job: ann's parked request (job filter) and bob's both see the commit, only bob's
    # matches.
    reply, answers = _turn(head, {"type": "submit", "jobs": [_spec(BOB)]}, BOB)
    assert reply == {"ids": [2]}
    assert [(a["rid"], [e["id"] for e in a["events"]], a["next"]) for a in answers] == [
        (1, [2], 2)]
    _, answers = _turn(head, {"type": "cancel", "ids": [first]})
    assert [[(e["id"], e["state"]) for e in a["events"]] for a in answers] == [
        [(1, "CANCELLED")]]
    assert head.feed.parked == []
    # Time up: answered with no events and the cursor past all that was looked at.
    assert _turn(head, {**park, "since": 3, "park_s": 5.0}) == (None, [])
    _, answers = _turn(head, {"type": "ping"}, now=T0 + 6)
    assert [(a["events"], a["next"], a["last"]) for a in answers] == [([], 3, 3)]


def test_users_see_their_own_jobs_events_and_every_nodes(tmp_path: Path) -> None:
    head = _head(tmp_path)
    _turn(head, {"type": "submit", "jobs": [_spec()]})
    _turn(head, {"type": "submit", "jobs": [_spec(BOB)]}, BOB)
    with head.tx():
        head.store.save_node(Node(name="n1", state=NodeState.UP, cpus=1, mem=1))
        head.store.save_node(Node(name="n1", state=NodeState.UP, cpus=2, mem=1))  # no change
        head.store.save_node(Node(name="n1", state=NodeState.DRAIN, reason="fix", cpus=2,
                                  mem=1))
    head.feed.after_commit(T0)
    assert [(e["kind"], e.get("id"), e.get("node")) for e in _events(head)["events"]] == [
        ("job", 1, None), ("node", None, "n1"), ("node", None, "n1")]
    assert [e.get("id") for e in _events(head, ROOT, kinds=["job"])["events"]] == [1, 2]
    assert [e["reason"] for e in _events(head, ROOT, kinds=["node"])["events"]] == ["", "fix"]
    assert [e["id"] for e in _events(head, ROOT, user="bob")["events"]] == [2]
    with pytest.raises(PermissionDenied, match="only admins see other users' events"):
        _events(head, user="bob")


def test_pruned_events_are_refused_saying_where_the_stream_starts(tmp_path: Path) -> None:
    head = _head(tmp_path)
    _turn(head, {"type": "submit", "jobs": [_spec(array="0-9")]})
    head.cfg.head.events_keep_rows = 4
    _turn(head, {"type": "ping"}, now=T0 + 100)  # the turn's tick prunes
    reply = _events(head, since=6)
    assert (reply["first"], reply["last"], [e["seq"] for e in reply["events"]]) == (
        7, 10, [7, 8, 9, 10])
    with pytest.raises(GoneError, match="the oldest is 7"):
        _events(head, since=5)
    with pytest.raises(GoneError, match="past the last one"):
        _events(head, since=11)
    with pytest.raises(ProtocolError, match="a sequence number"):
        _events(head, since=-1)
    assert [e["seq"] for e in _events(head, since=None, oldest=True)["events"]] == [7, 8, 9, 10]
    assert _events(head, since=None)["events"] == [] and _events(head, since=None)["next"] == 10


def test_paging_by_limit_and_the_scan_bound(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    head = _head(tmp_path)
    _turn(head, {"type": "submit", "jobs": [_spec(array="0-9")]})
    page = _events(head, limit=3)
    assert ([e["seq"] for e in page["events"]], page["next"]) == ([1, 2, 3], 3)
    monkeypatch.setattr("gq.defaults.MAX_EVENTS_SCAN", 4)
    # Nothing of bob's among the first four looked at: answered at once, to go on from 4.
    page = _events(head, ROOT, user="bob", park_s=30.0)
    assert (page["events"], page["next"]) == ([], 4)


def _create(head: Head, caller: Caller = ANN, **fields: Any) -> dict[str, Any]:
    reply, _ = _turn(head, {"type": "token_create", **fields}, caller)
    assert reply is not None
    return reply


def test_a_token_acts_as_its_user_until_revoked_or_expired(tmp_path: Path) -> None:
    head = _head(tmp_path)
    made = _create(head, name="ci", expires_s=3600.0)
    token = made["token"]
    assert token.startswith("gq_") and len(token) > 40
    assert (made["user"], made["name"], made["read_only"]) == ("ann", "ci", False)
    stored = head.store.conn.execute("SELECT hash FROM tokens").fetchall()
    assert token not in str(stored), "only the token's hash is stored"
    caller = head.token_caller(token, "api api1", T0)
    assert (caller.uid, caller.user, caller.proven, caller.via) == (1000, "ann", True, "api api1")
    assert _turn(head, {"type": "submit", "jobs": [_spec()]}, caller)[0] == {"ids": [1]}
    with pytest.raises(Unauthenticated, match="expired"):
        head.token_caller(token, "api api1", T0 + 3600)
    with pytest.raises(Unauthenticated, match="unknown or was revoked"):
        head.token_caller(token[:-1] + "x", "api api1", T0)
    # Tokens survive a restart (loaded from the store); a revoke works on the next request.
    head.store.close()
    head = Head(Config(path=""), Store(tmp_path / "gq.db"), T0, steady=lambda now: now)
    assert head.token_caller(token, "api api1", T0).user == "ann"
    listed, _ = _turn(head, {"type": "token_list"})
    assert [(t["id"], t["name"]) for t in listed["tokens"]] == [(made["id"], "ci")]
    assert _turn(head, {"type": "token_revoke", "ids": [made["id"]]}, BOB)[0]["errors"] == {
        str(made["id"]): f"permission denied: token {made['id']} belongs to ann"}
    assert _turn(head, {"type": "token_revoke", "ids": [made["id"]]})[0]["done"] == [made["id"]]
    with pytest.raises(Unauthenticated):
        head.token_caller(token, "api api1", T0)


def test_read_only_tokens_and_who_may_make_tokens(tmp_path: Path) -> None:
    head = _head(tmp_path)
    reader = head.token_caller(_create(head, read_only=True)["token"], "api api1", T0)
    assert reader.read_only
    with pytest.raises(PermissionDenied, match="not read-only"):
        _turn(head, {"type": "submit", "jobs": [_spec()]}, reader)
    assert _turn(head, {"type": "queue"}, reader)[0] == {"jobs": []}
    for who in (reader, Caller(uid=1000, user="ann", proven=False)):
        with pytest.raises(PermissionDenied, match="vouches for"):
            _create(head, who)
    with pytest.raises(PermissionDenied, match="only admins"):
        _create(head, user="root")
    assert _create(head, ROOT, user="root")["uid"] == 0
    with pytest.raises(UsageError, match="--expires"):
        _create(head, expires_s=0.0)
    # A token made in a turn that failed to commit never worked.
    reply, _ = _turn(head, {"type": "token_create"}, fail=True)
    assert reply is not None and len(head.tokens.by_digest) == 2
    with pytest.raises(Unauthenticated):
        head.token_caller(reply["token"], "api api1", T0)


def test_events_and_token_requests_are_in_the_protocol() -> None:
    for kind in (protocol.EVENTS, protocol.TOKEN_CREATE, protocol.TOKEN_LIST,
                 protocol.TOKEN_REVOKE):
        frame = protocol.encode(kind, rid=1, **({"ids": []} if kind == "token_revoke" else {}))
        assert protocol.decode(frame, protocol.CLIENT_REQUESTS)["type"] == kind
    with pytest.raises(ProtocolError, match="since"):
        protocol.decode(protocol.encode(protocol.EVENTS, rid=1, since="5"))
    with pytest.raises(ProtocolError, match="kinds"):
        protocol.decode(protocol.encode(protocol.EVENTS, rid=1, kinds=[1]))
