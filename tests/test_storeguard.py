"""gq/storeguard.py on real SQLite files: the mark, and the read-only check that refuses a damaged
database without changing a byte of it (the live gqd side: tests/faults/test_damaged_store.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from gq import storecopy, storeguard
from gq.errors import (RefusedError, StoreBehind, StoreCorrupt, StoreEmpty, StoreMissing, StoreNewer,
                       StoreTruncated)
from gq.model import Job, JobSpec
from gq.pidfile import acquire
from gq.store import SCHEMA_VERSION, Store
from gq.storeguard import Acked, Mark


def _add_jobs(store: Store, n: int, commits: int = 1) -> None:
    spec = JobSpec(script="#!/bin/sh\ntrue\n", qos="normal", env={"SECRET": "x" * 500})
    for _ in range(commits):
        with store.tx():
            store.add_jobs([Job(id=0, spec=spec, submit_time=1.0) for _ in range(n)])


def hashes(directory: Path) -> dict[str, tuple[int, str, int]]:
    """Name -> (size, sha256, mtime) of every file in `directory`: what must not change."""
    out = {}
    for path in sorted(directory.iterdir()):
        st = path.stat()
        out[path.name] = (st.st_size, hashlib.sha256(path.read_bytes()).hexdigest(),
                          st.st_mtime_ns)
    return out


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    """A store as gqd leaves it when killed: commits in the WAL, a -shm, the mark."""
    db = tmp_path / "live" / "gq.db"
    store = Store(db)
    _add_jobs(store, 50, commits=4)
    copy = tmp_path / "crashed"
    shutil.copytree(db.parent, copy)  # copied while open: the WAL is not checkpointed
    store.close()
    return copy / "gq.db"


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    """A store closed cleanly: everything in gq.db, no WAL."""
    db = tmp_path / "clean" / "gq.db"
    store = Store(db)
    _add_jobs(store, 200, commits=3)
    store.close()
    assert not storeguard.side_files(db)[0].exists()
    return db


def _refused(db: Path, error: type[Exception], match: str) -> None:
    before = hashes(db.parent)
    with pytest.raises(error, match=match) as info:
        Store(db)
    assert hashes(db.parent) == before, "a refused store was changed"
    assert info.value.exit_status == error.exit_status  # type: ignore[attr-defined]


def test_mark_follows_each_commit_that_changed_something(tmp_path: Path) -> None:
    store = Store(tmp_path / "gq.db")
    try:
        first = Mark(store.path).read()
        _add_jobs(store, 3)
        after = Mark(store.path).read()
        assert after == store.acked() and after.job_id == 3
        assert after.commits == first.commits + 1
        with store.tx():
            pass  # a turn of gqd's loop that changed nothing: not counted, no mark write
        assert Mark(store.path).read() == after
        assert (store.path.parent / "gq.db.mark").stat().st_mode & 0o777 == 0o600
    finally:
        store.close()


def test_a_torn_slot_falls_back_to_the_other_one_commit_older(tmp_path: Path) -> None:
    mark = Mark(tmp_path / "gq.db")
    mark.open()
    mark.write(Acked(7, 40))
    mark.write(Acked(8, 41))
    mark.close()
    data = bytearray(mark.path.read_bytes())
    data[storeguard.SLOT_BYTES * 0 + 30] ^= 0x01  # commit 8 went to slot 0 (8 % 2)
    mark.path.write_bytes(bytes(data))
    assert Mark(tmp_path / "gq.db").read() == Acked(7, 40)  # lags, never leads
    mark.path.write_bytes(b"\0" * 2 * storeguard.SLOT_BYTES)
    assert Mark(tmp_path / "gq.db").read() is None


def test_a_new_store_is_created_whole_and_private(tmp_path: Path) -> None:
    store = Store(tmp_path / "state" / "gq.db")
    store.close()
    names = {p.name for p in (tmp_path / "state").iterdir()}
    assert names == {"gq.db", "gq.db.mark"}, names  # no temporary file left
    for name in names:
        assert (tmp_path / "state" / name).stat().st_mode & 0o777 == 0o600
    assert storeguard.check(tmp_path / "state" / "gq.db", SCHEMA_VERSION) is False


def test_missing_database_with_its_mark_is_refused(crashed: Path) -> None:
    for side in storeguard.side_files(crashed):
        side.unlink()
    crashed.unlink()
    _refused(crashed, StoreMissing, "missing, but gq.db.mark beside it")
    assert not crashed.exists()


def test_empty_database_is_refused_and_its_wal_kept(crashed: Path) -> None:
    crashed.write_bytes(b"")
    _refused(crashed, StoreEmpty, r"empty \(0 bytes\)")
    # SQLite deletes the WAL beside an empty database as it opens it: never opened.
    assert storeguard.side_files(crashed)[0].stat().st_size > 0


@pytest.mark.parametrize("cut", ["page", "mid-page", "header"])
def test_truncated_database_is_refused(clean: Path, cut: str) -> None:
    size = clean.stat().st_size
    keep = {"page": size // 2 // 4096 * 4096, "mid-page": size // 2 + 100, "header": 60}[cut]
    os.truncate(clean, keep)
    _refused(clean, StoreTruncated, "truncated")


def test_garbage_page_is_refused(clean: Path) -> None:
    pages = clean.stat().st_size // 4096
    with open(clean, "r+b") as f:
        f.seek(pages // 2 * 4096)
        f.write(bytes((i * 37 + 11) % 256 for i in range(4096)))
    _refused(clean, StoreCorrupt, "integrity check finds")


def test_wal_removed_after_acknowledged_commits_is_refused_with_the_loss(crashed: Path) -> None:
    wal, _ = storeguard.side_files(crashed)
    wal.unlink()
    conn = sqlite3.connect(f"file:{crashed}?immutable=1", uri=True)
    left = conn.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0]
    conn.close()
    assert left < 200
    _refused(crashed, StoreBehind, f"would lose {200 - left} job ids")


def test_an_old_copy_put_back_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "gq.db"
    store = Store(db)
    _add_jobs(store, 10)
    store.close()
    old = tmp_path / "old.db"
    shutil.copy(db, old)
    store = Store(db)
    _add_jobs(store, 5)
    store.close()
    shutil.copy(old, db)
    _refused(db, StoreBehind, "would lose 5 job ids and the changes of 1 commits")


def test_newer_schema_is_refused(clean: Path) -> None:
    conn = sqlite3.connect(clean)
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     (str(SCHEMA_VERSION + 1),))
    conn.close()
    _refused(clean, StoreNewer, f"schema version {SCHEMA_VERSION + 1}, newer")


def test_a_database_without_a_mark_opens_and_gets_one(clean: Path) -> None:
    # As after an upgrade from a gq without marks: nothing to compare with, so nothing refused.
    storeguard.mark_path(clean).unlink()
    conn = sqlite3.connect(clean)
    with conn:
        conn.execute("DELETE FROM meta WHERE key = 'commits'")
    conn.close()
    store = Store(clean)
    store.close()
    assert Mark(clean).read() == Acked(0, 600)


def test_the_check_reads_a_live_wal_without_changing_it(crashed: Path) -> None:
    before = hashes(crashed.parent)
    assert storeguard.check(crashed, SCHEMA_VERSION) is False
    assert hashes(crashed.parent) == before
    assert {p.name for p in crashed.parent.iterdir()} == set(before)  # no view left behind


# ---------------------------------------------------------------- backup and restore


def test_backup_of_a_stopped_store_writes_nothing_beside_it(crashed: Path, tmp_path: Path) -> None:
    before = hashes(crashed.parent)
    held, jobs = storecopy.backup(crashed, tmp_path / "copy.db")
    assert hashes(crashed.parent) == before
    assert (held.job_id, jobs) == (200, 200)  # the WAL's commits too
    assert storeguard.inspect(tmp_path / "copy.db", SCHEMA_VERSION) == held


def test_restore_in_place_accepts_a_lost_wal_only_when_forced(crashed: Path) -> None:
    storeguard.side_files(crashed)[0].unlink()
    with pytest.raises(StoreBehind, match="would lose"):
        storecopy.restore(crashed, crashed, False, SCHEMA_VERSION)
    held, marked, kept = storecopy.restore(crashed, crashed, True, SCHEMA_VERSION)
    assert marked is not None and marked.job_id == 200 and held.job_id < 200
    assert kept is not None and kept.exists()
    store = Store(crashed)  # the guard passes now
    try:
        _add_jobs(store, 1)
        assert store.acked().job_id == 201, "an acknowledged id was handed out again"
    finally:
        store.close()


def test_restore_never_leaves_the_old_wal_beside_the_copy(crashed: Path, tmp_path: Path) -> None:
    storecopy.backup(crashed, tmp_path / "copy.db")
    old_wal = storeguard.side_files(crashed)[0].read_bytes()
    storecopy.restore(tmp_path / "copy.db", crashed, False, SCHEMA_VERSION)
    wal, shm = storeguard.side_files(crashed)
    assert not wal.exists() and not shm.exists()
    kept = [p for p in crashed.parent.iterdir() if p.name.endswith("-wal")]
    assert [p.read_bytes() for p in kept] == [old_wal]  # set aside with its database
    store = Store(crashed)
    assert store.acked().job_id == 200
    store.close()


def test_restore_refuses_while_gqd_runs(crashed: Path, tmp_path: Path) -> None:
    storecopy.backup(crashed, tmp_path / "copy.db")
    lock = acquire(crashed.parent / "gqd.pid")
    try:
        with pytest.raises(RefusedError, match="gqd is running"):
            storecopy.restore(tmp_path / "copy.db", crashed, True, SCHEMA_VERSION)
    finally:
        os.close(lock)


def test_a_view_left_by_a_check_cut_short_is_removed(clean: Path) -> None:
    left = clean.parent / ".gq.db-check-killed"
    left.mkdir()
    os.link(clean, left / "gq.db")  # would keep this database's blocks alive once replaced
    assert storeguard.check(clean, SCHEMA_VERSION) is False
    assert not left.exists()
