"""A failed request, node message or batch costs itself alone: its savepoint (or the batch)
rolls back in the store, the job table's journal takes memory back to what it was, and nothing
is reloaded (issue 13). A real Head on a real store file, driven through gqd's own request and
node-message paths (HeadServer._isolated, _node); a transition made to raise midway."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from gq import protocol
from gq.config import Config
from gq.errors import GqError, StoreError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.head.daemon import HeadServer
from gq.head.jobs import JobTable
from gq.head.orders import Order
from gq.messages import Ack
from gq.messages import read as read_message
from gq.model import JobSpec, JobState
from gq.store import Store
from tests.headmemory import memory, store_rows

ANN = Caller(uid=1000, user="ann", proven=True)
T0 = 1_000_000.0
NODES = ("n0", "n1")


@pytest.fixture
def head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Head:
    """Two nodes of 2 GPUs, four jobs running and four queued behind them, all committed; from
    here on a reload of memory fails the test."""
    head = Head(Config(path=""), Store(tmp_path / "gq.db"), T0)
    with head.tx():
        for name in NODES:
            head.handle_node(name, read_message({"type": protocol.REGISTER, "node": name, "cpus": 8,
                                    "mem": 1 << 34, "running": [],
                                    "gpus": [{"index": i, "type": "fake", "memory": 1 << 34}
                                             for i in range(2)]}), T0)
        spec = JobSpec(script="#!/bin/sh\ntrue\n", cwd="/tmp", gpus=1).to_dict()
        head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [spec] * 8}, ANN, None,
                           T0)
        head.schedule(T0)
    head.take_orders()
    assert [j.state for j in head.jobs.values()].count(JobState.RUNNING) == 4

    def no_reload(*args: object) -> None:
        raise AssertionError("memory was reloaded")
    monkeypatch.setattr(JobTable, "load", no_reload)
    return head


def _request(head: Head, msg: dict) -> None:
    """A request as gqd's loop handles it, in the batch's transaction."""
    server = types.SimpleNamespace(head=head)
    with head.tx():
        with pytest.raises(GqError, match="internal error in gqd: RuntimeError: midway"):
            HeadServer._isolated(server, {"rid": 7, **msg}, ANN, None, T0 + 1)  # type: ignore[arg-type]


def _fail_on(monkeypatch: pytest.MonkeyPatch, name: str, call: int) -> None:
    """JobTable.`name` raises at its `call`-th call, after doing its work: a transition that
    failed midway, with its changes half made."""
    real, calls = getattr(JobTable, name), []

    def failing(self: JobTable, *args: object, **kw: object) -> object:
        out = real(self, *args, **kw)
        calls.append(1)
        if len(calls) == call:
            raise RuntimeError("midway")
        return out
    monkeypatch.setattr(JobTable, name, failing)


def test_a_request_failing_midway_leaves_memory_and_store_as_they_were(
        head: Head, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel of four jobs (two running, two pending) whose third end raises: the two ended
    before it come back in memory (fields, index, counts, launches, in their places) and in
    the store; the request answers an internal error; nothing is reloaded."""
    before, rows = memory(head), store_rows(head)
    ids = [1, 5, 2, 6]
    _fail_on(monkeypatch, "end", 3)
    _request(head, {"type": protocol.CANCEL, "ids": ids})
    assert memory(head) == before
    assert store_rows(head) == rows
    assert head.outbox == []  # the kills of the jobs ended before it are not sent


def test_a_failed_request_costs_that_request_only(head: Head,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes made by the requests before it in the batch stay, and commit with it."""
    with head.tx():
        head.handle_client({"type": protocol.HOLD, "rid": 1, "ids": [7]}, ANN, None, T0)
        before, rows = memory(head), store_rows(head)
        _fail_on(monkeypatch, "hold", 1)
        server = types.SimpleNamespace(head=head)
        with pytest.raises(GqError, match="internal error"):
            HeadServer._isolated(server, {"type": protocol.HOLD, "rid": 2, "ids": [8]},  # type: ignore[arg-type]
                                 ANN, None, T0)
        assert memory(head) == before and store_rows(head) == rows
    assert head.jobs[7].hold == "user" and head.store.get_job(7).hold == "user"
    assert head.jobs[8].hold == "" and head.store.get_job(8).hold == ""


def test_a_node_message_failing_midway_is_taken_back_and_not_acked(
        head: Head, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's end whose release raises: the job is running again as before, and the report is
    not acked, so the node sends it again; the retry then ends the job."""
    job = head.jobs[1]
    node = next(iter(job.alloc))
    report = protocol.encode(protocol.REPORT, node=node, seq=9, job_id=1, restart=0,
                             event=protocol.FINISHED, state="COMPLETED", exit_code=0, time=T0)
    before, rows = memory(head), store_rows(head)
    _fail_on(monkeypatch, "release", 1)
    server = types.SimpleNamespace(head=head)
    with head.tx():
        HeadServer._node(server, node, report, T0 + 1)  # type: ignore[arg-type]
    assert memory(head) == before and store_rows(head) == rows
    assert not any(isinstance(o.msg, Ack) for o in head.outbox)
    monkeypatch.undo()
    with head.tx():
        HeadServer._node(server, node, report, T0 + 2)  # type: ignore[arg-type]
    assert head.store.get_job(1).state == JobState.COMPLETED and 1 not in head.jobs
    assert Order(node, Ack(9)) in head.outbox


def test_a_batch_failing_to_commit_takes_memory_back_to_the_last_commit(
        head: Head) -> None:
    """Cancels, job ends, a pass and a node's registration, then the commit fails (a full
    disk): memory is back at the last commit, the nodes registered before stay registered."""
    before, rows = memory(head), store_rows(head)
    node = next(iter(head.jobs[2].alloc))
    with pytest.raises(StoreError):
        with head.tx():
            head.handle_client({"type": protocol.CANCEL, "rid": 1, "ids": [1, 5]}, ANN, None, T0)
            head.handle_node(node, read_message({"type": protocol.REPORT, "node": node, "seq": 1,
                                    "job_id": 2, "restart": 0, "event": protocol.FINISHED,
                                    "state": "FAILED", "exit_code": 3, "time": T0}), T0)
            head.handle_node("n9", read_message({"type": protocol.REGISTER, "node": "n9", "cpus": 8,
                                    "mem": 1 << 34, "running": [], "gpus": []}), T0)
            head.schedule(T0 + 1)
            raise StoreError("disk full (test)")
    assert memory(head) == before and store_rows(head) == rows
    assert head.registry.registered == set(NODES)


def test_rows_read_in_a_rolled_back_batch_are_not_remembered(tmp_path: Path) -> None:
    """The store's cache of array specs forgets what a rollback took back: the ids it held
    are the next submit's, with another spec."""
    head = Head(Config(path=""), Store(tmp_path / "gq.db"), T0)
    first = JobSpec(script="#!/bin/sh\necho first\n", cwd="/tmp", gpus=0, array="0-2")
    with pytest.raises(StoreError):
        with head.tx():
            head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [first.to_dict()]},
                               ANN, None, T0)
            assert "first" in head.store.array_task(1, 2).spec.script  # read, and cached
            raise StoreError("disk full (test)")
    second = JobSpec(script="#!/bin/sh\necho second\n", cwd="/tmp", gpus=0, array="0-2")
    with head.tx():
        head.handle_client({"type": protocol.SUBMIT, "rid": 2, "jobs": [second.to_dict()]},
                           ANN, None, T0)
    assert "second" in head.store.array_task(1, 2).spec.script


def test_a_transaction_sqlite_rolled_back_fails_whole(tmp_path: Path) -> None:
    """SQLite may roll a whole transaction back on an error (a full disk, an I/O error): the
    savepoint sees it, what follows is not committed statement by statement, and the commit
    fails, so the batch is taken back whole in memory too."""
    head = Head(Config(path=""), Store(tmp_path / "gq.db"), T0)
    spec = JobSpec(script="#!/bin/sh\ntrue\n", cwd="/tmp", gpus=0).to_dict()
    with pytest.raises(StoreError, match="rolled the transaction back"):
        with head.tx():
            head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [spec]}, ANN, None, T0)
            with pytest.raises(RuntimeError):
                with head.isolated("request"):
                    head.store.conn.execute("ROLLBACK")  # as SQLite does on SQLITE_FULL
                    raise RuntimeError("disk full")
            head.handle_client({"type": protocol.SUBMIT, "rid": 2, "jobs": [spec]}, ANN, None, T0)
    assert head.store.live_jobs() == [] and head.jobs == {}


def test_a_wait_answered_in_a_failed_batch_waits_again(head: Head) -> None:
    """`gq wait` on a job whose end is taken back: not answered with the end that did not
    happen, and still parked, so the real end answers it."""
    with head.tx():
        assert head.handle_client({"type": protocol.WAIT, "rid": 5, "ids": [1]}, ANN, "waiter",
                                  T0) is None
    node = next(iter(head.jobs[1].alloc))
    end = {"type": protocol.REPORT, "node": node, "seq": 1, "job_id": 1, "restart": 0,
           "event": protocol.FINISHED, "state": "COMPLETED", "exit_code": 0, "time": T0}
    with pytest.raises(StoreError):
        with head.tx():
            head.handle_node(node, read_message(end), T0 + 1)
            head.tick(T0 + 1)
            assert [c for c, _ in head.deferred] == ["waiter"]
            raise StoreError("disk full (test)")
    head.deferred.clear()  # as gqd's loop does after a failed batch
    assert [p.ids for p in head.listings.parked] == [[1]]
    with head.tx():
        head.handle_node(node, read_message(end), T0 + 2)
        head.tick(T0 + 2)
    [(client, reply)] = head.deferred
    assert client == "waiter" and protocol.decode(reply)["done"] is True
