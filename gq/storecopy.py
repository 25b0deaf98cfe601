"""`gq admin backup` and `gq admin restore`: copies of gqd's database, made and put back.

Both run in the CLI on the head host, reading the database themselves: so only who may read it
(root on a system cluster, where it is 0600; a personal cluster's owner) can copy every job's
environment out of it, and gqd's loop is not involved at all. A backup is one step of SQLite's
online backup API on a read-only connection: one read transaction, so one consistent snapshot
holding every commit made before it began (gqd's later commits go on meanwhile, and neither
restarts nor blocks it). A restore puts a checked copy in place with gqd stopped, and refuses
one that holds less than gqd's mark says it acknowledged unless told to accept the loss.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from gq import storeguard
from gq.errors import (NotFoundError, PermissionDenied, RefusedError, StoreBehind, StoreCorrupt,
                       UsageError)
from gq.fsutil import fsync_dir, private_dir, rename_durably
from gq.pidfile import read_alive
from gq.storeguard import Acked

#: Name of gqd's pid file in its state directory (gq/head/daemon.py).
PID_FILE = "gqd.pid"


def backup(db: Path, target: Path) -> tuple[Acked, int]:
    """Copy `db` into the new file `target` (0600, one file, no WAL); what it holds and how
    many jobs."""
    if target.exists():
        raise UsageError(f"{target} exists: gq admin backup writes a new file")
    if not os.access(db, os.R_OK):
        try:
            db.stat()
        except FileNotFoundError:
            raise NotFoundError(f"no gq database at {db}: run gq admin backup on the head "
                                f"host") from None
        except PermissionError:
            pass
        raise _denied(db, "backup")
    with _source(db) as src:
        return _copy(src, target, None)


def restore(source: Path, db: Path, force: bool, known_schema: int) -> tuple[Acked, Acked | None,
                                                                           Path | None]:
    """Put a copy of `source` in place of `db` (gqd stopped): what it holds, what the mark said
    (None: no mark), and where the database it replaced was kept (None: there was none)."""
    if db.parent.exists() and not os.access(db.parent, os.R_OK | os.W_OK | os.X_OK):
        raise _denied(db, "restore")
    pid = read_alive(db.parent / PID_FILE)
    if pid is not None:
        raise RefusedError(f"gqd is running (pid {pid}) on {db.parent}: stop it first "
                           f"(systemctl stop gqd, or gq down)")
    if not source.exists():
        raise NotFoundError(f"{source}: no such file")
    held = storeguard.inspect(source, known_schema)
    marked = storeguard.Mark(db).read()
    if storeguard.behind(held, marked) and not force:
        assert marked is not None
        raise StoreBehind(f"restoring {source} would roll back what gqd acknowledged: the "
                              f"mark {storeguard.mark_path(db)} {storeguard.loss(held, marked)}. "
                              f"Refused; --force accepts that loss")
    if not db.parent.exists():  # a new head host: the state directory gqd would make
        private_dir(db.parent, 0o700)
    tmp = db.with_name(f".{db.name}.restore")
    with storeguard.readonly(source) as src:
        _copy(src, tmp, marked)
    kept = _set_aside(db)
    os.rename(tmp, db)
    fsync_dir(db.parent)
    return held, marked, kept


def _denied(db: Path, command: str) -> PermissionDenied:
    return PermissionDenied(f"{db} is only for the user gqd runs as (it holds every job's "
                            f"environment): run gq admin {command} as that user (root)")


@contextlib.contextmanager
def _source(db: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to `db`: alongside a running gqd (its WAL locks keep the two
    apart), or, with none, through storeguard's private view, so nothing is created beside it."""
    if read_alive(db.parent / PID_FILE) is None:
        with storeguard.readonly(db) as conn:
            yield conn
        return
    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreCorrupt(f"cannot read {db}: {exc}") from None
    try:
        yield conn
    finally:
        conn.close()


def _copy(src: sqlite3.Connection, target: Path, past: Acked | None) -> tuple[Acked, int]:
    """Write the database of `src` into the new file `target`, checked, fsynced, whole or not
    at all; with its commit counter and job ids raised past `past` (a restore over a mark)."""
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    try:
        dst = sqlite3.connect(tmp, isolation_level=None)
        try:
            # One step (pages=-1): one read snapshot. In steps, each commit of gqd's between two
            # of them would restart the copy, for ever under a steady stream of submits.
            src.backup(dst, pages=-1)
            dst.execute("PRAGMA journal_mode=DELETE")  # the copy is one file, no -wal
            if past is not None:
                _raise_past(dst, past)
            problems = [r[0] for r in dst.execute("PRAGMA integrity_check").fetchall()]
            if problems != ["ok"]:
                raise StoreCorrupt(f"the copy fails SQLite's integrity check: {problems[:3]}")
            held = storeguard.acked_in(dst)
            jobs = int(dst.execute("SELECT COUNT(*) FROM jobs").fetchone()[0])
        finally:
            dst.close()
        rename_durably(tmp, target)
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise StoreCorrupt(f"cannot copy the database: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return held, jobs


def _raise_past(dst: sqlite3.Connection, past: Acked) -> None:
    """Counter and job ids past the mark: gqd starts on the copy, and never hands out again an id
    it acknowledged before (ids only grow, even across a restore)."""
    held = storeguard.acked_in(dst)
    dst.execute("BEGIN IMMEDIATE")
    if held.job_id < past.job_id:
        if not dst.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'jobs'",
                           (past.job_id,)).rowcount:
            dst.execute("INSERT INTO sqlite_sequence(name, seq) VALUES ('jobs', ?)",
                        (past.job_id,))
    dst.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('commits', ?)",
                (str(max(held.commits, past.commits) + 1),))
    dst.execute("COMMIT")


def _set_aside(db: Path) -> Path | None:
    """Rename the database being replaced, with its WAL as a pair (SQLite finds a WAL by name),
    and drop its -shm: the restored file must never meet the old WAL, which SQLite would replay
    into it. The WAL goes even without its database (a restore cut short)."""
    wal, shm = storeguard.side_files(db)
    kept = db.with_name(f"{db.name}.replaced-{time.strftime('%Y%m%dT%H%M%S')}")
    kept_wal, _ = storeguard.side_files(kept)
    if wal.exists():
        os.rename(wal, kept_wal)
    shm.unlink(missing_ok=True)
    found = db.exists()
    if found:
        os.rename(db, kept)
    fsync_dir(db.parent)
    return kept if found else None
