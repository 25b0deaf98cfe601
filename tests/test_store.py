"""Unit tests for gq.store on a real SQLite file: schema, transactions, job and node queries."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from gq.errors import StoreError
from gq.model import Gpu, Job, JobSpec, JobState, Node, NodeState
from gq.store import SCHEMA_VERSION, SchemaError, Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "gq.db"


@pytest.fixture
def store(db: Path) -> Iterator[Store]:
    s = Store(db)
    try:
        yield s
    finally:
        s.close()


def _spec(**over) -> JobSpec:
    base = dict(script="#!/bin/sh\necho hi\n", name="train", args=["--lr", "0.1"], user="alice",
                uid=1000, gid=1000, cwd="/home/alice", env={"A": "1", "B": "two"}, nodes=1,
                gpus=2, gpu_type="h100", gpu_mem=40 * 1024**3, cpus=4, mem=8 * 1024**3,
                time_limit_s=3600, qos="normal", output="out-%j.log", error=None, requeue=False)
    base.update(over)
    return JobSpec(**base)


def _job(**over) -> Job:
    spec_over = over.pop("spec", {})
    base = dict(id=0, spec=_spec(**spec_over), state=JobState.PENDING, submit_time=1000.0)
    base.update(over)
    return Job(**base)


def _insert(store: Store, job: Job) -> Job:
    """`job` stored as gqd stores a submit's (Store.add_jobs: the staged path); it gets its id."""
    with store.tx():
        store.add_jobs([job])
    return job


def _count(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    finally:
        conn.close()


# ---------------------------------------------------------------- schema and pragmas


def test_fresh_db_is_migrated_with_wal_and_full_sync(store: Store, db: Path):
    assert db.exists()
    assert store.schema_version() == SCHEMA_VERSION
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    tables = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "jobs", "nodes"} <= tables
    # And the version is really stored, not only reported.
    conn = sqlite3.connect(db)
    try:
        value = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()[0]
    finally:
        conn.close()
    assert int(value) == SCHEMA_VERSION


def test_reopen_does_not_migrate_again(db: Path):
    Store(db).close()
    s = Store(db)  # would fail with "table meta already exists" if it re-ran migrations
    try:
        assert s.schema_version() == SCHEMA_VERSION
    finally:
        s.close()


def test_newer_schema_is_refused_and_file_left_untouched(db: Path):
    s = Store(db)
    with s.tx() as c:
        c.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                  (str(SCHEMA_VERSION + 1),))
    s.close()
    before = db.read_bytes()
    with pytest.raises(SchemaError, match=f"schema version {SCHEMA_VERSION + 1}"):
        Store(db)
    assert db.read_bytes() == before


def test_newer_schema_in_rollback_journal_mode_left_untouched(db: Path):
    db.parent.mkdir(parents=True)
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION + 1),))
    conn.commit()
    conn.close()
    before = db.read_bytes()
    with pytest.raises(SchemaError):
        Store(db)
    assert db.read_bytes() == before


def test_garbage_file_is_not_overwritten(db: Path):
    db.parent.mkdir(parents=True)
    garbage = bytes(range(256)) * 16
    db.write_bytes(garbage)
    with pytest.raises(Exception):  # noqa: B017 - the exact class is checked in the next test
        Store(db)
    assert db.read_bytes() == garbage


def test_garbage_file_is_refused_with_schema_error(db: Path):
    db.parent.mkdir(parents=True)
    db.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(SchemaError):
        Store(db)


# ---------------------------------------------------------------- jobs


def test_insert_and_get_round_trip(store: Store):
    job = _job(state=JobState.RUNNING, reason="", start_time=1010.5,
               alloc={"n2": [3, 1], "n1": [0, 2]}, holds_alloc=True, restart_count=3,
               array_job_id=7, array_index=4)
    _insert(store, job)
    assert job.id >= 1
    got = store.get_job(job.id)
    assert got == job
    assert got.spec == _spec()
    assert got.state is JobState.RUNNING
    assert got.alloc == {"n2": [3, 1], "n1": [0, 2]}
    assert list(got.alloc) == ["n2", "n1"]  # node rank order is kept
    assert got.holds_alloc is True and got.restart_count == 3


def test_ids_increase_and_missing_job_is_none(store: Store):
    a, b = _insert(store, _job()), _insert(store, _job())
    assert b.id > a.id
    assert store.get_job(b.id + 100) is None


def test_jobs_inserted_together_get_the_next_ids_in_order(store: Store):
    before = _insert(store, _job()).id
    jobs = [_job(spec={"name": f"j{i}", "env": {"I": str(i)}}) for i in range(5)]
    with store.tx():
        store.add_jobs(jobs)
    assert [j.id for j in jobs] == list(range(before + 1, before + 6))
    for job in jobs:
        assert store.get_job(job.id).spec == job.spec
    assert _insert(store, _job()).id == before + 6
    assert [j.id for j in store.history(0, 2000, after=before + 2, limit=2)] == [before + 3,
                                                                                 before + 4]


def test_update_job_writes_only_named_columns(store: Store):
    job = _insert(store, _job())
    job.state, job.reason, job.exit_code = JobState.RUNNING, "changed in memory", 9
    job.start_time, job.alloc, job.holds_alloc = 1234.0, {"n1": [0]}, True
    with store.tx():
        store.update_job(job, "state", "start_time")
    got = store.get_job(job.id)
    assert got.state is JobState.RUNNING and got.start_time == 1234.0
    assert got.reason == "" and got.exit_code is None
    assert got.alloc == {} and got.holds_alloc is False


def test_update_job_without_columns_writes_all(store: Store):
    job = _insert(store, _job())
    job.state, job.reason, job.exit_code, job.end_time = JobState.FAILED, "NonZeroExit", 3, 2000.0
    job.alloc, job.holds_alloc, job.restart_count = {"n1": [1]}, True, 2
    with store.tx():
        store.update_job(job)
    assert store.get_job(job.id) == job


def test_qos_and_time_limit_updates_override_spec_blob(store: Store):
    job = _insert(store, _job(spec={"qos": "free", "time_limit_s": 600}))
    job.spec = dataclasses.replace(job.spec, qos="pro", time_limit_s=7200)
    with store.tx():
        store.update_job(job, "qos", "time_limit_s")
    got = store.get_job(job.id)
    assert got.spec.qos == "pro" and got.spec.time_limit_s == 7200
    assert got.spec.script == job.spec.script  # the rest still comes from the blob
    job.spec = dataclasses.replace(job.spec, time_limit_s=None)
    with store.tx():
        store.update_job(job, "time_limit_s")
    assert store.get_job(job.id).spec.time_limit_s is None


def test_live_jobs(store: Store):
    pending = _insert(store, _job(state=JobState.PENDING))
    running = _insert(store, _job(state=JobState.RUNNING, holds_alloc=True, alloc={"n": [0]}))
    done = _insert(store, _job(state=JobState.COMPLETED, end_time=2000.0))
    holding = _insert(store, _job(state=JobState.CANCELLED, holds_alloc=True, alloc={"n": [1]}))
    failed = _insert(store, _job(state=JobState.FAILED, end_time=2000.0))
    live = store.live_jobs()
    assert [j.id for j in live] == [pending.id, running.id, holding.id]  # once each, by id
    assert done.id not in {j.id for j in live} and failed.id not in {j.id for j in live}
    assert live[2] == holding


def test_finished_jobs_filters_by_user_and_since(store: Store):
    a_old = _insert(store, _job(spec={"user": "alice"}, state=JobState.COMPLETED, end_time=100.0))
    b_mid = _insert(store, _job(spec={"user": "bob"}, state=JobState.FAILED, end_time=200.0))
    a_new = _insert(store, _job(spec={"user": "alice"}, state=JobState.CANCELLED, end_time=300.0))
    # Cancelled while pending: no end time, its submit time counts.
    a_noend = _insert(store, _job(spec={"user": "alice"}, state=JobState.CANCELLED,
                                  submit_time=250.0))
    _insert(store, _job(spec={"user": "alice"}, state=JobState.RUNNING))
    _insert(store, _job(spec={"user": "alice"}, state=JobState.PENDING))

    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(store.finished_jobs()) == [a_old.id, b_mid.id, a_new.id, a_noend.id]
    assert ids(store.finished_jobs(user="alice")) == [a_old.id, a_new.id, a_noend.id]
    assert ids(store.finished_jobs(user="bob")) == [b_mid.id]
    assert ids(store.finished_jobs(user="carol")) == []
    assert ids(store.finished_jobs(since=200.0)) == [b_mid.id, a_new.id, a_noend.id]
    assert ids(store.finished_jobs(user="alice", since=260.0)) == [a_new.id]
    assert ids(store.finished_jobs(limit=2)) == [a_new.id, a_noend.id]  # the newest, oldest first


# ---------------------------------------------------------------- transactions


def test_exception_in_tx_rolls_back_and_reraises(store: Store, db: Path):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with store.tx():
            store.add_jobs([_job()])
            raise Boom
    assert store.live_jobs() == []
    assert _count(db) == 0
    # The connection is usable afterwards (no transaction left open).
    job = _insert(store, _job())
    assert store.get_job(job.id) is not None


def test_sqlite_error_in_tx_becomes_store_error(store: Store, db: Path):
    with pytest.raises(StoreError, match="could not save .* nothing was changed"):
        with store.tx() as c:
            store.add_jobs([_job()])
            c.execute("INSERT INTO no_such_table VALUES (1)")
    assert _count(db) == 0
    # A constraint violation (qos is NOT NULL) is a sqlite error too.
    with pytest.raises(StoreError):
        with store.tx():
            store.add_jobs([_job(spec={"qos": None})])
    assert _count(db) == 0


def test_committed_tx_is_visible_to_another_connection(store: Store, db: Path):
    _insert(store, _job())
    assert _count(db) == 1


def test_jobs_survive_reopen(db: Path):
    s = Store(db)
    job = _insert(s, _job(state=JobState.RUNNING, alloc={"n1": [0, 1]}, holds_alloc=True))
    s.close()
    s2 = Store(db)
    try:
        assert s2.get_job(job.id) == job
        assert [j.id for j in s2.live_jobs()] == [job.id]
    finally:
        s2.close()


def test_group_commit_500_inserts_in_one_tx(db: Path):
    s = Store(db)
    with s.tx():
        jobs = [_job(spec={"name": f"j{i}"}) for i in range(500)]
        for job in jobs:  # one submit each, as 500 `gq submit` calls in one loop turn
            s.add_jobs([job])
    ids = [job.id for job in jobs]
    s.close()
    assert len(set(ids)) == 500
    s2 = Store(db)
    try:
        live = s2.live_jobs()
        assert [j.id for j in live] == sorted(ids)
        assert [j.spec.name for j in live] == [f"j{i}" for i in range(500)]
    finally:
        s2.close()


# ---------------------------------------------------------------- nodes


def test_save_and_load_nodes_round_trip(db: Path):
    gpus = [Gpu(index=0, type="h100", memory=80 * 1024**3, uuid="GPU-a", name="NVIDIA H100"),
            Gpu(index=1, type="a100", memory=40 * 1024**3, uuid="GPU-b", name="NVIDIA A100")]
    n1 = Node(name="n1", gpus=gpus, cpus=64, mem=512 * 1024**3, state=NodeState.DRAIN,
              reason="bad fan", drain_reason="bad fan", last_seen=1234.5)
    n0 = Node(name="n0", gpus=[], cpus=8, mem=1024**3, state=NodeState.UP, last_seen=99.0)
    s = Store(db)
    with s.tx():
        s.save_node(n1)
        s.save_node(n0)
    s.close()
    s2 = Store(db)
    try:
        loaded = s2.load_nodes()
        assert [n.name for n in loaded] == ["n0", "n1"]
        assert loaded[1] == n1 and loaded[0] == n0
        assert loaded[1].gpus == gpus and all(isinstance(g, Gpu) for g in loaded[1].gpus)
        # Saving again replaces the row.
        n0.state, n0.reason = NodeState.DOWN, "silent"
        with s2.tx():
            s2.save_node(n0)
        again = s2.load_nodes()
        assert len(again) == 2 and again[0].state is NodeState.DOWN and again[0].reason == "silent"
    finally:
        s2.close()


def test_retries_and_node_fault_count_survive_a_restart(db: Path) -> None:
    store = Store(db)
    job = _insert(store, _job(spec={"retries": 3, "requeue": True}, node_fail_count=1))
    job.node_fail_count = 2
    with store.tx():
        store.update_job(job, "node_fail_count")
    store.close()
    store = Store(db)
    try:
        (again,) = store.live_jobs()
        assert (again.spec.retries, again.node_fail_count) == (3, 2)
    finally:
        store.close()


def test_a_runs_peak_memory_and_cpu_time_are_kept_growing_and_unknown_stays_unknown(
        store: Store) -> None:
    job = _insert(store, _job(state=JobState.RUNNING, start_time=1000.0))
    with store.tx():
        store.set_run_stats(job.id, 0, 5, 1.0)  # before the run's row: nothing to write
        store.insert_run(job, 1010.0, "COMPLETED")
        assert store.run_stats([(job.id, 0)]) == {}, "no node said anything yet"
        store.set_run_stats(job.id, 0, None, 2.5)
    assert store.run_stats([(job.id, 0)]) == {job.id: {"max_rss": None, "total_cpu_s": 2.5}}
    with store.tx():
        store.set_run_stats(job.id, 0, 300, 4.0)
        store.set_run_stats(job.id, 0, 200, 3.0)  # a restarted head's partial sum: never lower
        store.set_run_stats(job.id, 0, None, None)
    assert store.run_stats([(job.id, 0), (job.id, 1)]) == {
        job.id: {"max_rss": 300, "total_cpu_s": 4.0}}
    assert store.run_stats([(job.id, 1)]) == {}, "another run of the job"
