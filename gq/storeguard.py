"""What gqd checks before it opens its database, and the mark that lets it check.

gqd must never start on a database that silently holds less than it acknowledged: a 0-byte
file would look like a new cluster (ids from 1 again), a lost WAL or an old copy put back would
drop acknowledged jobs without a word. So before the store is opened for writing, `check` looks
at the files read-only and refuses (a StoreRefused subclass, one exit status each) a database
that is missing, empty, truncated, corrupt, of a newer schema, or behind the *mark*.

The mark (`gq.db.mark`, beside the database) is the witness outside the database: the commit
counter (meta `commits`, raised by every transaction that changed something) and the highest
job id (`sqlite_sequence`) of the last commit gqd made. It is rewritten after each such commit,
before any reply to it is sent, so it covers everything gqd acknowledged.

SQLite writes on open even through a read-only connection (it creates the -wal and -shm, and
rewrites the -shm) and deletes a -wal beside an empty database. So nothing here opens the real
files with SQLite: the checks read a private view, a directory holding hard links to the
database and its WAL, where SQLite may create its -shm. A read-only connection never
checkpoints, so the linked files are only read (tests/test_storeguard.py compares hashes).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3
import tempfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gq.errors import (StoreBehind, StoreCorrupt, StoreEmpty, StoreMissing, StoreNewer,
                       StoreTruncated)
from gq.fsutil import fsync_dir

log = logging.getLogger("gq.store")

#: The mark is the database's path plus this.
MARK_SUFFIX = ".mark"
#: The mark holds two slots of this many bytes; each write goes to the one the other is not.
SLOT_BYTES = 128
_SLOT = re.compile(rb"gq-mark v1 commits=(\d{20}) job=(\d{20}) crc=([0-9a-f]{8})")
#: How many of integrity_check's complaints a refusal quotes.
QUOTED_PROBLEMS = 3
_HEADER = b"SQLite format 3\x00"


@dataclass(frozen=True, order=True)
class Acked:
    """How far a database has got: its commit counter and the highest job id it handed out."""

    commits: int
    job_id: int


def mark_path(db: Path) -> Path:
    return db.with_name(db.name + MARK_SUFFIX)


def side_files(db: Path) -> tuple[Path, Path]:
    """The WAL and the shared-memory index SQLite keeps beside `db`."""
    return db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")


class Mark:
    """The high-water mark file, written by the store after each commit that changed something.

    Why no fsync per commit: the mark may lag what the database holds, never lead it. Each value
    written is that of a commit SQLite has already made durable (synchronous=FULL), so whatever
    version of the file survives a power cut says no more than the database holds; a lagging
    mark only lets a rollback of the last few commits before the cut go unnoticed, while after
    a crash of gqd alone (the page cache survives) it is exact. A write torn by a power cut
    damages only the slot being written (its checksum fails) and the other slot, one commit
    older, is read: lagging again, never leading. The file is fsynced once, when created, so
    that "a cluster ran here" survives whatever happens to the database.
    """

    def __init__(self, db: Path):
        self.path = mark_path(db)
        self.fd = -1
        self.failed = False

    def read(self) -> Acked | None:
        """The newest valid slot; None if there is no mark or neither slot is readable."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        found = [a for a in (_parse(data[i:i + SLOT_BYTES]) for i in (0, SLOT_BYTES)) if a]
        return max(found) if found else None

    def open(self) -> None:
        new = not self.path.exists()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.fchmod(self.fd, 0o600)
        if new:
            os.fsync(self.fd)
            fsync_dir(self.path.parent)

    def write(self, acked: Acked) -> None:
        """Record `acked` (of a commit already on disk) in the slot its counter picks."""
        try:
            os.pwrite(self.fd, _slot(acked), SLOT_BYTES * (acked.commits % 2))
            self.failed = False
        except OSError as exc:
            # The commit stands; only the witness lags (a pwrite into the file's own blocks
            # needs no space, so this is an I/O error). Said once, not at every commit.
            if not self.failed:
                log.error("cannot update %s: %s", self.path, exc)
            self.failed = True

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _slot(acked: Acked) -> bytes:
    body = f"commits={acked.commits:020d} job={acked.job_id:020d}".encode()
    line = b"gq-mark v1 " + body + f" crc={zlib.crc32(body):08x}".encode()
    return line.ljust(SLOT_BYTES - 1) + b"\n"


def _parse(slot: bytes) -> Acked | None:
    m = _SLOT.match(slot)
    if m is None:
        return None
    body = b"commits=" + m[1] + b" job=" + m[2]
    return Acked(int(m[1]), int(m[2])) if f"{zlib.crc32(body):08x}" == m[3].decode() else None


# ---------------------------------------------------------------- the check


def check(db: Path, known_schema: int) -> bool:
    """Refuse (raise a StoreRefused) a database gqd must not start on; True when there is no
    cluster here yet (no database, no WAL, no mark), False when `db` may be opened. Writes
    nothing to the database, its WAL, its -shm or the mark. `known_schema`: the newest schema
    version this gq knows."""
    wal, _ = side_files(db)
    mark = Mark(db)
    # Views a check killed midway left (gqd holds its pid lock: no other check runs): their
    # links would keep an old database's blocks, and its secrets, alive.
    for old in db.parent.glob(f".{db.name}-check-*"):
        shutil.rmtree(old, ignore_errors=True)
    if not db.exists():
        left = " and ".join(p.name for p in (mark.path, wal) if p.exists())
        if left:
            raise StoreMissing(
                f"{db} is missing, but {left} beside it {'show' if ' and ' in left else 'shows'}"
                f" a cluster ran here: refusing to "
                f"start an empty one. Put the database back (with its WAL, if it had one), "
                f"restore a backup with `gq admin restore FILE` (gqd stopped), or, to start a "
                f"new, empty cluster, remove {left}")
        return True
    _not_behind(db, inspect(db, known_schema), mark.read())
    return False


def inspect(db: Path, known_schema: int) -> Acked:
    """Refuse a database that is empty, truncated, corrupt or of a schema newer than
    `known_schema`; else how far it has got. Writes nothing to it or beside it."""
    wal, _ = side_files(db)
    size = db.stat().st_size
    if size == 0:
        raise StoreEmpty(f"{db} is empty (0 bytes): refusing to take it for a new cluster. "
                         f"{_remedy(db)}")
    pages = _header_pages(db, size, wal_has_frames=wal.exists() and wal.stat().st_size > 0)
    with readonly(db) as conn:
        _integrity(conn, db, size, pages)
        version = _schema_version(conn, db)
        if version > known_schema:
            raise StoreNewer(f"{db} has schema version {version}, newer than this gq "
                             f"({known_schema}); refusing to touch it: run the gq that wrote it")
        return acked_in(conn)


def _remedy(db: Path) -> str:
    return (f"Restore a backup with `gq admin restore FILE` (gqd stopped); gqd.8 says how. "
            f"Nothing was written to {db.name} or beside it.")


def _header_pages(db: Path, size: int, wal_has_frames: bool) -> int | None:
    """Check what the header alone shows; the page count it claims, when it is valid."""
    with open(db, "rb") as f:
        header = f.read(100)
    if len(header) < 100 or not header.startswith(_HEADER):
        if _HEADER.startswith(header[:len(_HEADER)]):
            raise StoreTruncated(f"{db} is truncated: {size} bytes, less than an SQLite header. "
                                 f"{_remedy(db)}")
        raise StoreCorrupt(f"{db} is not an SQLite database (its first bytes are not SQLite's "
                           f"header). {_remedy(db)}")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    counter, valid_for = header[24:28], header[92:96]
    pages = int.from_bytes(header[28:32], "big") if counter == valid_for else 0
    if page_size < 512 or page_size & (page_size - 1):
        raise StoreCorrupt(f"{db}: its header names page size {page_size}. {_remedy(db)}")
    # A checkpoint cut short may leave the header ahead of the file, with the pages still in
    # the WAL: only without WAL frames is a short file truncated for sure.
    if size % page_size or (pages and size < pages * page_size and not wal_has_frames):
        raise StoreTruncated(f"{db} is truncated: {size} bytes, but its header says "
                             f"{pages} pages of {page_size} bytes ({pages * page_size} bytes). "
                             f"{_remedy(db)}")
    return pages * page_size or None


def _integrity(conn: sqlite3.Connection, db: Path, size: int, expected: int | None) -> None:
    """SQLite's integrity_check (about 0.4 s for 100,000 jobs, see docs/RELIABILITY.md)."""
    try:
        problems = [r[0] for r in conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as exc:
        problems = [str(exc)]
    if problems == ["ok"]:
        return
    quoted = "; ".join(problems[:QUOTED_PROBLEMS]) + (
        f"; and {len(problems) - QUOTED_PROBLEMS} more" if len(problems) > QUOTED_PROBLEMS else "")
    if expected and size < expected:
        raise StoreTruncated(f"{db} is truncated: {size} bytes of the {expected} its header "
                             f"says, and SQLite finds: {quoted}. {_remedy(db)}")
    raise StoreCorrupt(f"{db} is corrupt: SQLite's integrity check finds: {quoted}. "
                       f"{_remedy(db)}")


def _schema_version(conn: sqlite3.Connection, db: Path) -> int:
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                            "AND name = 'meta'").fetchone():
            raise StoreCorrupt(f"{db} is an SQLite database but not gq's (it has no meta "
                               f"table). {_remedy(db)}")
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0
    except (sqlite3.DatabaseError, ValueError) as exc:
        raise StoreCorrupt(f"{db} is not a usable gq database: {exc}. {_remedy(db)}") from None


def acked_in(conn: sqlite3.Connection) -> Acked:
    """The commit counter and highest job id a database holds (0 for what it lacks)."""
    row = conn.execute("SELECT value FROM meta WHERE key = 'commits'").fetchone()
    has_seq = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'")
    seq = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone() \
        if has_seq.fetchone() else None
    return Acked(int(row[0]) if row else 0, int(seq[0]) if seq else 0)


def behind(held: Acked, marked: Acked | None) -> bool:
    """A database holding `held` has less than the mark `marked` says was acknowledged."""
    return marked is not None and (held.commits < marked.commits or held.job_id < marked.job_id)


def _not_behind(db: Path, held: Acked, marked: Acked | None) -> None:
    if marked is None:
        if mark_path(db).exists():
            log.warning("%s is unreadable: cannot tell whether %s is behind; a new mark is "
                        "written", mark_path(db), db)
        return
    if not behind(held, marked):
        return
    raise StoreBehind(f"{db} is behind what gqd acknowledged: {mark_path(db).name} "
                      f"{loss(held, marked)}. "
                      f"Put back the database that belongs here (with its {db.name}-wal), or "
                      f"accept the loss with `gq admin restore {db} --force` (gqd stopped)")


def loss(held: Acked, marked: Acked) -> str:
    """What starting on `held` would lose, against the mark `marked`."""
    ids = max(0, marked.job_id - held.job_id)
    return (f"says commit {marked.commits} and job id "
            f"{marked.job_id} were acknowledged, the database holds commit {held.commits} and "
            f"job ids up to {held.job_id}: starting on it would lose {ids} job id"
            f"{'' if ids == 1 else 's'} and the changes of "
            f"{max(0, marked.commits - held.commits)} commits")


# ---------------------------------------------------------------- the read-only view


@contextlib.contextmanager
def readonly(db: Path) -> Iterator[sqlite3.Connection]:
    """A read-only connection to `db` (and its WAL) that leaves their bytes as they were.

    It opens hard links to them in a private directory beside them, so that the -shm SQLite
    creates and writes is a private one; where links cannot be made (another file system, no
    room for a directory), copies in the system's temporary directory.
    """
    wal, _ = side_files(db)
    try:
        view = _view(db, wal, db.parent, os.link)
    except OSError:
        view = _view(db, wal, None, shutil.copyfile)
    try:
        conn = sqlite3.connect(f"file:{view / db.name}?mode=ro", uri=True, isolation_level=None,
                               check_same_thread=False)
        try:
            yield conn
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise StoreCorrupt(f"{db} cannot be read: {exc}. {_remedy(db)}") from None
    finally:
        shutil.rmtree(view, ignore_errors=True)


def _view(db: Path, wal: Path, parent: Path | None, put: Callable[[Path, Path], object]) -> Path:
    """A new private directory (in `parent`, else the system's) where `put` (a link, a copy)
    places `db` and its WAL."""
    view = Path(tempfile.mkdtemp(prefix=f".{db.name}-check-", dir=parent))
    try:
        put(db, view / db.name)
        if wal.exists():
            put(wal, view / wal.name)
    except OSError:
        shutil.rmtree(view, ignore_errors=True)
        raise
    return view
