"""Submits worked in slices (gq/head/submits.py), driven turn by turn on a real store: a big
one is invisible until its last turn commits, then whole; a failed turn drops all of it."""

from __future__ import annotations

import time

import pytest

from gq.config import Config
from gq.errors import StoreError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.model import JobSpec
from gq.store import Store

ANN = Caller(uid=1000, user="ann", proven=True)
T0 = 1_000_000.0


def _spec(**kw: object) -> dict:
    return JobSpec(script="#!/bin/sh\ntrue\n", uid=1000, gid=1000, cwd="/tmp", gpus=1,
                   hold=True, **kw).to_dict()


def _head(tmp_path) -> Head:  # noqa: ANN001
    return Head(Config(path=""), Store(tmp_path / "gq.db"), T0)


def _turn(head: Head, fail: bool = False) -> list[tuple[object, bytes]]:
    """One loop turn with time for a step or so of submit work, as gqd's loop runs it."""
    head.submits.deadline = time.perf_counter() + 0.0005
    try:
        with head.tx():  # a failed one takes memory back with the store, as in gqd
            head.submits.work()
            if fail:
                raise StoreError("disk full (test)")
    except StoreError as exc:
        return head.submits.aborted(exc)[0]
    return head.submits.committed()[0]


def _submit(head: Head, jobs: list[dict], late: bool = True) -> dict | None:
    """A submit request; `late`: in a turn with no time left for more than its first step."""
    head.submits.deadline = time.perf_counter() if late else None
    with head.tx():
        return head.handle_client({"type": "submit", "rid": 7, "jobs": jobs}, ANN, "client", T0)


def _stored(head: Head) -> list[int]:
    return [r[0] for r in head.store.conn.execute("SELECT id FROM jobs ORDER BY id")]


def test_a_big_submit_is_seen_only_whole_after_its_last_turn(tmp_path) -> None:  # noqa: ANN001
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="one")] * 300 + [_spec(name="arr", array="0-999")]) is None
    turns = 0
    while True:
        replies = _turn(head)
        turns += 1
        if replies:
            break
        if head.jobs:  # being indexed: only once all of it was committed
            assert len(head.store.live_jobs()) == 1300
        else:  # staged: no reader sees any of it
            assert head.store.live_jobs() == [] and head.store.history(0, T0 + 1) == []
        assert turns < 10_000
    assert turns > 3, "the submit was not worked in slices"
    [(client, data)] = replies
    assert client == "client" and b"ids" in data
    assert sorted(head.jobs) == _stored(head) == list(range(1, 1301))
    assert head.jobs[301].array_job_id == 301 and head.jobs[1300].array_index == 999
    assert head.jobs[1].reason == "JobHeldUser"
    assert not head.submits.busy
    # Reopened, the store keeps it all.
    assert len(Store(tmp_path / "gq.db").live_jobs()) == 1300


@pytest.mark.parametrize("failing_turn", [1, 3, 6])
def test_a_failed_turn_drops_all_of_an_uncommitted_submit(tmp_path, failing_turn: int  # noqa: ANN001
                                                          ) -> None:
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="one")] * 300 + [_spec(name="arr", array="0-999")]) is None
    for _ in range(failing_turn):
        assert _turn(head) == []
    [(client, data)] = _turn(head, fail=True)
    assert b"disk full (test)" in data
    assert not head.jobs and _stored(head) == [] and not head.submits.busy
    # The next submit is whole, with ids past the dropped ones.
    reply = _submit(head, [_spec(name="next")], late=False)
    assert reply is not None and not head.submits.busy
    assert list(head.jobs) == reply["ids"] and _stored(head) == reply["ids"]


def test_a_crash_mid_submit_leaves_none_of_it(tmp_path) -> None:  # noqa: ANN001
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="arr", array="0-4999")]) is None
    for _ in range(4):
        _turn(head)
    assert _stored(head), "no staged rows committed yet"
    head.store.conn.close()  # gqd dies here; the next one opens the store
    again = _head(tmp_path)
    assert not again.jobs and _stored(again) == []


def test_submits_queue_behind_one_in_the_works(tmp_path) -> None:  # noqa: ANN001
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="big", array="0-2999")]) is None
    assert _submit(head, [_spec(name="small")]) is None  # waits its turn
    answered = []
    for _ in range(10_000):
        answered += _turn(head)
        if len(answered) == 2:
            break
    assert [c for c, _ in answered] == ["client", "client"]
    assert sorted(head.jobs) == list(range(1, 3002))
    assert head.jobs[3001].spec.name == "small"


def test_a_failed_turn_keeps_a_committed_submit_and_takes_it_in_whole(tmp_path  # noqa: ANN001
                                                                      ) -> None:
    """Its staging committed, a submit's jobs are kept; a turn taking them into memory that
    fails to commit takes those back, and the next turns take them in again: whole, with no
    reload (the Job objects memory holds are the submit's own)."""
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="arr", array="0-2999")]) is None
    while not head.jobs:
        assert _turn(head) == []
    sub = head.submits.queue[0]
    assert sub.durable and 0 < sub.admitted < 3000
    admitted, ids = sub.admitted, list(head.jobs)
    assert _turn(head, fail=True) == []  # not answered yet: it is not done
    assert sub.admitted == admitted and list(head.jobs) == ids
    replies: list = []
    while not replies:
        replies = _turn(head)
    assert b"ids" in replies[0][1]
    assert list(head.jobs) == _stored(head) == list(range(1, 3001))
    assert all(head.jobs[i] is job for i, job in zip(range(1, 3001), sub.made))
    assert len(head.table.queued) == 3000 and len(head.index.ready()) == 0  # all held


def test_a_bug_in_a_submit_fails_it_alone(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """An unexpected exception while a submit stages its rows fails that submit (its rows
    taken back, the turn goes on and commits); the next submit is whole."""
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="arr", array="0-2999")]) is None
    _turn(head)
    calls = 0
    real = head.store.add_staged

    def broken(rows: list) -> None:
        nonlocal calls
        calls += 1
        real(rows)
        if calls == 2:
            raise RuntimeError("a bug (test)")
    monkeypatch.setattr(head.store, "add_staged", broken)
    replies: list = []
    while not replies:
        replies = _turn(head)
    assert b"internal error in gqd: RuntimeError: a bug (test)" in replies[0][1]
    assert not head.jobs and _stored(head) == [] and not head.submits.busy
    monkeypatch.setattr(head.store, "add_staged", real)
    reply = _submit(head, [_spec(name="next")], late=False)
    assert reply is not None and list(head.jobs) == reply["ids"] == _stored(head)


def test_a_job_still_entering_memory_is_not_changed_behind_its_back(tmp_path  # noqa: ANN001
                                                                     ) -> None:
    """A cancel of a job whose submit committed but is still being taken into memory is
    refused (try again): cancelling the store's copy would leave memory running the job."""
    head = _head(tmp_path)
    assert _submit(head, [_spec(name="arr", array="0-2999")]) is None
    while not head.jobs:
        _turn(head)
    last = 3000
    assert last not in head.jobs and head.store.get_job(last) is not None
    with head.tx():
        reply = head.handle_client({"type": "cancel", "rid": 8, "ids": [last]}, ANN, None, T0)
    assert reply["errors"] == {str(last): "job 1_2999 is still being submitted; try again"}
    while head.submits.busy:
        _turn(head)
    assert head.jobs[last].state.value == head.store.get_job(last).state.value == "PENDING"
