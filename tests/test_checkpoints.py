"""Checkpoints in gqd without daemons: the CHECKPOINT request and the heartbeat's markers (only
the running run's, only inside it, only from its owner or its nodes), the scheduler's victims
by them, the store's table (a database from before it upgrades) and `gq report`'s waste."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gq import ckptstore, protocol
from gq.cli.accounting import summarize
from gq.cli.checkpoint import run_of
from gq.config import from_dict
from gq.errors import NotFoundError, PermissionDenied, RefusedError, UsageError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.messages import read as read_message
from gq.store import MIGRATIONS, SCHEMA_VERSION, Store
from tests import headkit

NOW = 1_000_000.0
OWNER = Caller(uid=1000, user="ann", proven=True)
OTHER = Caller(uid=1001, user="bob", proven=True)
ADMIN = Caller(uid=0, user="root", proven=True, admin=True)
CFG = {"scheduler": {"preempt_exempt_s": 0},
       "qos": {"normal": {"priority": 10}, "pro": {"priority": 100, "preempts": ["free"]},
               "free": {"priority": 1}}}


def _register(head: Head, name: str, gpus: int) -> None:
    with head.store.tx():
        head.handle_node(name, read_message({
            "type": protocol.REGISTER, "node": name, "cpus": 8, "mem": 1 << 34, "running": [],
            "gpus": [{"index": i, "type": "fake", "memory": 1 << 34} for i in range(gpus)]}), NOW)


def _head() -> Head:
    head = Head(from_dict(CFG, "test.toml"), Store(":memory:"), NOW)
    _register(head, "n0", 2)
    return head


def _submit(head: Head, now: float, qos: str = "free", gpus: int = 1) -> int:
    return headkit.submit(head, now, OWNER, gpus=gpus, qos=qos, time_limit_s=7200)


_pass = headkit.schedule


def _checkpoint(head: Head, job_id: int, restart: int, caller: Caller, now: float) -> dict:
    with head.store.tx():
        return head.handle_client({"type": protocol.CHECKPOINT, "rid": 2, "job_id": job_id,
                                   "restart": restart}, caller, None, now)


def _beat(head: Head, node: str, marks: list[dict], now: float) -> None:
    with head.store.tx():
        head.handle_node(node, read_message({"type": protocol.HEARTBEAT, "node": node,
                                             "checkpoints": marks}), now)


def test_checkpoint_request_is_the_owners_for_the_running_run_only():
    head = _head()
    job = _submit(head, NOW)
    _pass(head, NOW)
    assert head.jobs[job].state.value == "RUNNING"
    reply = _checkpoint(head, job, 0, OWNER, NOW + 100)
    assert reply["recorded"] and reply["job_id"] == job
    assert head.jobs[job].checkpoint_time == NOW + 100
    assert ckptstore.latest(head.store.conn, [job]) == {job: NOW + 100}
    assert head.jobs[job].to_json()["last_checkpoint"] is not None
    with pytest.raises(PermissionDenied, match="belongs to ann"):
        _checkpoint(head, job, 0, OTHER, NOW + 200)
    with pytest.raises(RefusedError, match="run 3 is not running"):
        _checkpoint(head, job, 3, OWNER, NOW + 200)  # a run gqd has moved on from
    with pytest.raises(NotFoundError):
        _checkpoint(head, 999, 0, OWNER, NOW + 200)
    assert _checkpoint(head, job, 0, ADMIN, NOW + 300)["recorded"]
    assert head.jobs[job].checkpoint_time == NOW + 300
    # A caller the kernel did not vouch for (a TCP claim) changes nothing.
    with pytest.raises(PermissionDenied, match="proven identity"):
        _checkpoint(head, job, 0, Caller(uid=1000, user="ann", proven=False), NOW + 400)
    assert head.jobs[job].checkpoint_time == NOW + 300


def test_heartbeat_markers_count_inside_the_run_from_its_own_nodes():
    head = _head()
    _register(head, "n1", 2)
    job = _submit(head, NOW, gpus=2)
    _pass(head, NOW)
    [node] = head.jobs[job].alloc
    other = "n1" if node == "n0" else "n0"
    _beat(head, node, [{"job_id": job, "restart": 0, "time": NOW - 50}], NOW + 10)
    assert head.jobs[job].checkpoint_time is None  # an earlier run's marker, left in its dir
    _beat(head, other, [{"job_id": job, "restart": 0, "time": NOW + 20}], NOW + 30)
    assert head.jobs[job].checkpoint_time is None  # a node speaks only for its own jobs
    _beat(head, node, [{"job_id": job, "restart": 1, "time": NOW + 20}], NOW + 30)
    assert head.jobs[job].checkpoint_time is None  # not the run gqd knows
    _beat(head, node, [{"job_id": job, "restart": 0, "time": NOW + 20}], NOW + 30)
    assert head.jobs[job].checkpoint_time == NOW + 20
    # The same marker again, and an older one, change nothing; one ahead of gqd's clock counts
    # as now.
    _beat(head, node, [{"job_id": job, "restart": 0, "time": NOW + 15}], NOW + 40)
    assert head.jobs[job].checkpoint_time == NOW + 20
    _beat(head, node, [{"job_id": job, "restart": 0, "time": NOW + 9999}], NOW + 50)
    assert head.jobs[job].checkpoint_time == NOW + 50
    assert ckptstore.latest(head.store.conn, [job]) == {job: NOW + 50}


def test_preemption_takes_the_job_that_checkpointed_since_its_start():
    head = _head()
    first = _submit(head, NOW)
    _pass(head, NOW)
    second = _submit(head, NOW + 10)
    _pass(head, NOW + 10)
    # Without checkpoints the second (started later) would lose less; the first checkpointed
    # 100 s before the pro job came, so it loses only those.
    _checkpoint(head, first, 0, OWNER, NOW + 3500)
    _submit(head, NOW + 3600, qos="pro")
    _pass(head, NOW + 3600)
    assert head.jobs[first].reason == "Preempted" and head.jobs[second].reason == ""


def test_a_database_from_before_checkpoints_opens_and_upgrades(tmp_path: Path):
    db = tmp_path / "gq.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    for version, statements in enumerate(MIGRATIONS[:-1]):
        for statement in statements:
            conn.execute(statement)
        conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                     (str(version + 1),))
    conn.execute("INSERT INTO runs(job_id, restart, user, account, qos, gpus, start_time, "
                 "end_time, state) VALUES (7, 0, 'ann', '', 'free', 8, 0, 3600, 'PREEMPTED')")
    conn.close()
    store = Store(db)
    try:
        assert store.schema_version() == SCHEMA_VERSION
        # Its runs reported no checkpoints: all of the preempted run is lost.
        assert ckptstore.saved_usage(store.conn, 0, 7200) == []
        with store.tx():
            ckptstore.put(store.conn, 7, 0, 900.0)
            ckptstore.put(store.conn, 7, 0, 600.0)  # an older report: the time only grows
        assert ckptstore.latest(store.conn, [7, 8]) == {7: 900.0}
        [(user, _, qos, state, saved)] = ckptstore.saved_usage(store.conn, 0, 7200)
        assert (user, qos, state, saved) == ("ann", "free", "PREEMPTED", 8 * 900.0)
        # Clipped to the window: from 600 s on, 300 s were saved before the checkpoint.
        assert ckptstore.saved_usage(store.conn, 600, 7200)[0][4] == 8 * 300.0
    finally:
        store.close()


def test_report_counts_a_preempted_runs_waste_from_its_checkpoint():
    rows = [{"user": "ann", "account": "", "qos": "free", "state": "PREEMPTED",
             "gpu_seconds": 8 * 3600.0, "saved_gpu_seconds": 8 * 3000.0},
            {"user": "ann", "account": "", "qos": "free", "state": "FAILED",
             "gpu_seconds": 36.0},
            {"user": "ann", "account": "", "qos": "free", "state": "COMPLETED",
             "gpu_seconds": 3600.0}]
    data = summarize(rows)
    assert data["gpu_hours"] == pytest.approx(8 + 0.01 + 1)
    assert data["wasted_by_cause"]["preempted"] == pytest.approx(8 * 600 / 3600)
    assert data["wasted_gpu_hours"] == pytest.approx(8 * 600 / 3600 + 0.01)
    # A gqd from before checkpoints sends no saved_gpu_seconds: all of it is waste.
    old = summarize([{k: v for k, v in rows[0].items() if k != "saved_gpu_seconds"}])
    assert old["wasted_gpu_hours"] == pytest.approx(8.0)


def test_gq_checkpoint_needs_a_job_environment():
    assert run_of({"GQ_JOB_ID": "12", "GQ_RESTART_COUNT": "2"}) == (12, 2)
    with pytest.raises(UsageError, match="not inside a job"):
        run_of({})
    with pytest.raises(UsageError, match="bad GQ_JOB_ID"):
        run_of({"GQ_JOB_ID": "x"})


def test_a_restarted_gqd_keeps_its_running_jobs_checkpoints(tmp_path: Path):
    db = tmp_path / "gq.db"
    head = Head(from_dict(CFG, "test.toml"), Store(db), NOW)
    _register(head, "n0", 2)
    job = _submit(head, NOW)
    _pass(head, NOW)
    _checkpoint(head, job, 0, OWNER, NOW + 100)
    head.store.close()
    again = Head(from_dict(CFG, "test.toml"), Store(db), NOW + 200)
    try:
        assert again.jobs[job].checkpoint_time == NOW + 100
        assert again.table.running_views()[0].checkpoint_time == NOW + 100
    finally:
        again.store.close()
