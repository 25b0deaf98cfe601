"""The SQLite store: schema, migrations, transactions and queries. The only module that speaks SQL.

gqd is the only writer. It keeps active jobs in memory and writes through; reads of finished jobs
come from here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from gq import ckptstore, events, stepstore, storeguard
from gq.errors import StoreCorrupt, StoreError, StoreNewer, StoreRefused
from gq.fsutil import rename_durably
from gq.model import Gpu, Job, JobSpec, JobState, Node, NodeState

#: Each migration takes the schema from version i to i + 1.
MIGRATIONS: list[list[str]] = [
    [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        """CREATE TABLE jobs (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL, user TEXT NOT NULL, uid INTEGER NOT NULL, qos TEXT NOT NULL,
            state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '',
            nodes INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu_type TEXT,
            time_limit_s INTEGER, submit_time REAL NOT NULL, start_time REAL, end_time REAL,
            exit_code INTEGER, alloc TEXT NOT NULL DEFAULT '{}',
            holds_alloc INTEGER NOT NULL DEFAULT 0, restart_count INTEGER NOT NULL DEFAULT 0,
            array_job_id INTEGER, array_index INTEGER, spec BLOB NOT NULL)""",
        # Active jobs are loaded at start-up; a partial index keeps that fast on a long history.
        "CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('PENDING', 'RUNNING')",
        "CREATE INDEX jobs_holding ON jobs(holds_alloc) WHERE holds_alloc = 1",
        "CREATE INDEX jobs_user ON jobs(user, submit_time)",
        """CREATE TABLE nodes (name TEXT PRIMARY KEY, state TEXT NOT NULL, reason TEXT NOT NULL,
            last_seen REAL NOT NULL, info BLOB NOT NULL)""",
    ],
    [
        # Who holds a pending job back (gq hold): '', 'user' or 'admin'.
        "ALTER TABLE jobs ADD COLUMN hold TEXT NOT NULL DEFAULT ''",
        """CREATE INDEX jobs_array ON jobs(array_job_id, array_index)
            WHERE array_job_id IS NOT NULL""",
        "CREATE INDEX jobs_end ON jobs(end_time)",
        # One row per ended run of a job: a preempted or requeued run is a row of its own, so
        # its GPU time is accounted for (gq report) though the job itself ran again.
        """CREATE TABLE runs (
            job_id INTEGER NOT NULL, restart INTEGER NOT NULL, user TEXT NOT NULL,
            account TEXT NOT NULL, qos TEXT NOT NULL, gpus INTEGER NOT NULL,
            start_time REAL NOT NULL, end_time REAL NOT NULL, state TEXT NOT NULL,
            PRIMARY KEY (job_id, restart))""",
        "CREATE INDEX runs_end ON runs(end_time)",
    ],
    [
        # How many of a job's requeues were for a node fault (bounded by its --retries).
        "ALTER TABLE jobs ADD COLUMN node_fail_count INTEGER NOT NULL DEFAULT 0",
    ],
    [
        # What a run used, as its nodes measured it (NULL: unknown): peak memory in bytes
        # (the most of its nodes', Slurm's MaxRSS) and CPU seconds (their sum, TotalCPU).
        "ALTER TABLE runs ADD COLUMN max_rss INTEGER",
        "ALTER TABLE runs ADD COLUMN total_cpu_s REAL",
    ],
    [
        # The partition a job runs in (Slurm's comma list of them), for listings by it; NULL
        # for jobs stored before partitions (their cluster's default partition).
        "ALTER TABLE jobs ADD COLUMN partition TEXT",
    ],
    [
        # Job and node events, each written with its change (gq/events.py), and users' API
        # tokens: only a token's sha256 is kept (gq/head/tokens.py); expires NULL: never.
        *events.MIGRATION,
        """CREATE TABLE tokens (
            id INTEGER PRIMARY KEY AUTOINCREMENT, hash TEXT NOT NULL UNIQUE,
            uid INTEGER NOT NULL, user TEXT NOT NULL, name TEXT NOT NULL,
            created REAL NOT NULL, expires REAL, read_only INTEGER NOT NULL)""",
    ],
    stepstore.MIGRATION,  # job steps (srun), JOBID.STEP in gq history
    ckptstore.MIGRATION,  # runs' checkpoints (gq checkpoint, the marker file)
]
SCHEMA_VERSION = len(MIGRATIONS)
#: How many arrays' shared spec blobs the store keeps in memory.
SPEC_CACHE = 64

log = logging.getLogger("gq.store")

_JOB_COLUMNS = ("id, name, user, uid, qos, state, reason, nodes, gpus, gpu_type, time_limit_s, "
                "submit_time, start_time, end_time, exit_code, alloc, holds_alloc, restart_count, "
                "array_job_id, array_index, spec, hold, node_fail_count, partition")
#: The first id of staged jobs (see Store.stage_jobs), as SQL: past every id when none are.
_STAGED_FROM = ("COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'staged_from'), "
                "9223372036854775807)")
#: Columns `update_job` may write, mapped to how a Job attribute becomes a column value.
_UPDATABLE = {
    "state": lambda j: j.state.value, "reason": lambda j: j.reason,
    "start_time": lambda j: j.start_time, "end_time": lambda j: j.end_time,
    "exit_code": lambda j: j.exit_code, "alloc": lambda j: json.dumps(j.alloc),
    "holds_alloc": lambda j: int(j.holds_alloc), "restart_count": lambda j: j.restart_count,
    "time_limit_s": lambda j: j.spec.time_limit_s, "qos": lambda j: j.spec.qos,
    "name": lambda j: j.spec.name,
    "hold": lambda j: j.hold, "node_fail_count": lambda j: j.node_fail_count,
}


#: The name the store's refusals had before they were split by cause (gq.errors.StoreRefused).
SchemaError = StoreRefused


class Store:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        in_memory = str(path) == ":memory:"
        #: Array job id -> the spec blob its tasks share (see add_staged).
        self._specs: dict[int, bytes] = {}
        #: Transactions that changed something, ever: meta `commits`, raised by `tx()`.
        self.commits = 0
        self._counting = False
        #: The high-water mark beside the file (gq/storeguard.py); none for ":memory:".
        self._mark: storeguard.Mark | None = None
        if not in_memory:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Read-only checks first: a database we refuse must stay byte-identical.
            if storeguard.check(self.path, SCHEMA_VERSION):
                _create(self.path)
        #: The open transaction was rolled back by SQLite under a savepoint (see savepoint).
        self._lost = False
        # Autocommit mode: transactions are explicit (`tx()`), never implicit.
        self.conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._check_version()  # what storeguard checked, for a ":memory:" one too
            self.conn.execute("PRAGMA journal_mode=WAL")
            # FULL: a commit is on disk (WAL fsynced) before `submit` is answered, so an
            # acknowledged job survives power loss, not only a crash of gqd. Group commit (one
            # transaction per loop iteration) makes that one fsync per batch, not one per job.
            self.conn.execute("PRAGMA synchronous=FULL")
            self.conn.execute("PRAGMA busy_timeout=5000")
            self._migrate()
            self.commits = self._counter()
            if not in_memory:
                _make_private(self.path)
                self._mark = storeguard.Mark(self.path)
                self._mark.open()
                self._mark.write(self.acked())
            self._counting = True
            # Only gqd opens the store (under its pid lock), so no submit is in the works now.
            if self.conn.execute("SELECT 1 FROM meta WHERE key = 'staged_from'").fetchone():
                with self.tx():  # a big submit that gqd never committed: none of it is kept
                    self.drop_staged()
        except sqlite3.DatabaseError as exc:
            self.close()
            raise StoreCorrupt(f"{self.path} is not a usable gq database: {exc}") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self.conn.close()
        if self._mark is not None:
            self._mark.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; any sqlite error becomes StoreError and nothing is kept.
        One that changed something raises the commit counter with it and, once committed,
        the mark (gq/storeguard.py): before the caller can answer anyone."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"cannot start a transaction: {exc}") from None
        self._lost = False
        before = self.conn.total_changes
        try:
            yield self.conn
            if self._lost:
                raise sqlite3.OperationalError("SQLite rolled the transaction back after an "
                                               "error (see the log)")
            counted = self._counting and self.conn.total_changes != before
            if counted:
                self.conn.execute("UPDATE meta SET value = ? WHERE key = 'commits'",
                                  (str(self.commits + 1),))
            self.conn.execute("COMMIT")
        except sqlite3.Error as exc:
            self._rollback()
            raise StoreError(_write_failure(self.path, exc)) from None
        except BaseException:
            self._rollback()
            raise
        if counted:
            self.commits += 1
            if self._mark is not None:
                self._mark.write(self.acked())

    def _rollback(self) -> None:
        self._specs.clear()  # it may hold rows rolled back, whose ids the next insert takes
        with contextlib.suppress(sqlite3.Error):
            self.conn.execute("ROLLBACK")

    def acked(self) -> storeguard.Acked:
        """How far this store has got: its commit counter and highest job id."""
        row = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        return storeguard.Acked(self.commits, int(row[0]) if row else 0)

    def _counter(self) -> int:
        with self.tx():
            self.conn.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('commits', '0')")
        return int(self.conn.execute("SELECT value FROM meta WHERE key = 'commits'").fetchone()[0])

    @contextlib.contextmanager
    def savepoint(self, name: str, keep: tuple[type[BaseException], ...] = ()
                  ) -> Iterator[None]:
        """A savepoint inside the open transaction: an exception rolls back what was written
        since, except one of `keep` (a refusal the caller raises after its checks), which keeps
        it. The transaction itself goes on either way."""
        self.conn.execute(f"SAVEPOINT {name}")
        try:
            yield
        except keep:
            self.conn.execute(f"RELEASE {name}")
            raise
        except BaseException:
            self._specs.clear()
            if self.conn.in_transaction:
                self.conn.execute(f"ROLLBACK TO {name}")
                self.conn.execute(f"RELEASE {name}")
            else:
                # SQLite rolled the whole transaction back (a full disk, an I/O error): what
                # the caller does next must not commit statement by statement, and the
                # transaction must fail as a whole.
                self._lost = True
                self.conn.execute("BEGIN IMMEDIATE")
            raise
        self.conn.execute(f"RELEASE {name}")

    # ------------------------------------------------------------ schema

    def schema_version(self) -> int:
        try:
            has_meta = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
            if not has_meta:
                return 0
            row = self.conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreCorrupt(f"{self.path} is not a usable gq database: {exc}") from None
        return int(row[0]) if row else 0

    def _check_version(self) -> None:
        version = self.schema_version()
        if version > SCHEMA_VERSION:
            raise StoreNewer(f"{self.path} has schema version {version}, newer than this gq "
                             f"({SCHEMA_VERSION}); refusing to touch it")

    def _migrate(self) -> None:
        for target in range(self.schema_version(), SCHEMA_VERSION):
            with self.tx() as c:
                _migration(c, target)

    # ------------------------------------------------------------ jobs

    # A submit too big for one loop turn is inserted over several transactions (gq/head/
    # submits.py). Its rows are "staged" until the transaction that clears the meta key
    # `staged_from` (the first staged id) commits: readers skip them, and opening the store
    # drops them. So a crash leaves all of such a submit or none of it.

    def stage_jobs(self) -> int:
        """Start staging, inside the caller's transaction: the first id the staged jobs take
        (consecutive from there; nothing else may insert jobs until `unstage`)."""
        self.drop_staged()  # of a failed submit whose own drop failed
        row = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        first = (row[0] if row else 0) + 1
        self.conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('staged_from', ?)",
                          (str(first),))
        return first

    def next_id(self) -> int:
        """The id the next job inserted will get (sbatch --test-only names it)."""
        row = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'").fetchone()
        return (row[0] if row else 0) + 1

    def add_staged(self, rows: list[tuple[Job, bytes]]) -> None:
        """Insert (job, spec blob) pairs with the ids they were given since `stage_jobs`; an
        array's tasks after its first have an empty blob (they share the first's)."""
        self.conn.executemany(f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES (?{', ?' * 23})",
                              [_job_row(j, blob, j.id) for j, blob in rows])

    def unstage(self) -> None:
        """The staged jobs are real once the caller's transaction commits, and so are their
        submit events."""
        events.submitted(self.conn, _STAGED_FROM)
        self.conn.execute("DELETE FROM meta WHERE key = 'staged_from'")

    def add_jobs(self, jobs: list[Job], *, array: bool = False) -> None:
        """Insert `jobs` inside the caller's transaction as gqd's submits do (stage_jobs,
        add_staged, unstage), all at once: for tools and tests that fill a store. Each gets the
        next id, in list order. With `array` they are the tasks of one array (one spec): each
        gets the first's id as its array's, and shares the first's stored spec."""
        first = self.stage_jobs()
        rows = []
        for offset, job in enumerate(jobs):
            job.id = first + offset
            if array:
                job.array_job_id = first
            rows.append((job, b"" if array and offset else spec_blob(job.spec)))
        self.add_staged(rows)
        self.unstage()

    def drop_staged(self) -> None:
        """Delete staged jobs (of a submit that failed, or was cut short by a crash), inside
        the caller's transaction."""
        self.conn.execute(f"DELETE FROM jobs WHERE id >= {_STAGED_FROM}")
        self.conn.execute("DELETE FROM meta WHERE key = 'staged_from'")

    def update_jobs(self, jobs: Iterable[Job], *columns: str) -> None:
        """`update_job` for many jobs in one statement."""
        sets = ", ".join(f"{name} = ?" for name in columns)
        self.conn.executemany(f"UPDATE jobs SET {sets} WHERE id = ?",
                              ((*(_UPDATABLE[n](j) for n in columns), j.id) for j in jobs))

    def _job(self, row: tuple[Any, ...]) -> Job:
        spec, array_job_id = row[20], row[18]
        if not spec and array_job_id is not None:
            spec = self._array_spec(array_job_id)
        return _job(row, spec)

    def _array_spec(self, array_job_id: int) -> bytes:
        """The spec blob an array's tasks share (on its first task's row); a few are cached."""
        blob = self._specs.get(array_job_id)
        if blob is None:
            blob = self.conn.execute("SELECT spec FROM jobs WHERE id = ?",
                                     (array_job_id,)).fetchone()[0]
            if len(self._specs) >= SPEC_CACHE:
                self._specs.clear()
            self._specs[array_job_id] = blob
        return blob

    def update_job(self, job: Job, *columns: str) -> None:
        """Write the named attributes of `job` (all updatable ones when none are named)."""
        names = columns or tuple(_UPDATABLE)
        sets = ", ".join(f"{name} = ?" for name in names)
        self.conn.execute(f"UPDATE jobs SET {sets} WHERE id = ?",
                          (*(_UPDATABLE[n](job) for n in names), job.id))

    def get_job(self, job_id: int) -> Job | None:
        row = self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = ? "
                                f"AND id < {_STAGED_FROM}", (job_id,)).fetchone()
        return self._job(row) if row else None

    def array_task(self, array_job_id: int, index: int) -> Job | None:
        row = self.conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE array_job_id = ? AND array_index = ? "
            f"AND id < {_STAGED_FROM}", (array_job_id, index)).fetchone()
        return self._job(row) if row else None

    def history(self, since: float, until: float, user: str | None = None,
                states: list[str] | None = None, after: int = 0,
                limit: int = 100_000, ids: list[int] | None = None,
                partition: str | None = None) -> list[Job]:
        """Jobs submitted by `until` that had not ended by `since` (sacct's window), by id,
        from the first after `after`; only those of `ids` (a job, or every task of an array
        by its id) and of `partition` when given."""
        where = ["id > ?", "submit_time <= ?", "(end_time IS NULL OR end_time >= ?)",
                 f"id < {_STAGED_FROM}"]
        args: list[Any] = [after, until, since]
        if user:
            where.append("user = ?")
            args.append(user)
        if states:
            where.append(f"state IN ({', '.join('?' * len(states))})")
            args.extend(states)
        if ids is not None:
            marks = ", ".join("?" * len(ids))
            where.append(f"(id IN ({marks}) OR array_job_id IN ({marks}))")
            args.extend([*ids, *ids])
        if partition:
            where.append("(',' || partition || ',') LIKE ?")
            args.append(f"%,{partition},%")
        rows = self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} "
                                 "ORDER BY id LIMIT ?", (*args, limit))
        return [self._job(r) for r in rows]

    # ------------------------------------------------------------ runs

    def insert_run(self, job: Job, end: float, state: str) -> None:
        """Record a run of `job` that has ended (`state`: its outcome, or REQUEUED)."""
        if job.start_time is None:
            return
        s = job.spec
        self.conn.execute(
            "INSERT OR REPLACE INTO runs(job_id, restart, user, account, qos, gpus, start_time, "
            "end_time, state) VALUES (?,?,?,?,?,?,?,?,?)",
            (job.id, job.restart_count, s.user, s.account or "", s.qos or "", s.gpus * s.nodes,
             job.start_time, max(end, job.start_time), state))

    def set_run_stats(self, job_id: int, restart: int, max_rss: int | None,
                      cpu_s: float | None) -> None:
        """What the run (job_id, restart) used so far, as its nodes reported it, inside the
        caller's transaction; nothing if the run has no row yet. A figure only grows: a head
        restarted between two nodes' reports must not lower what the first one said."""
        self.conn.execute(
            # SQLite's MAX(a, b) is NULL when either is: then the one that is known, if any.
            "UPDATE runs SET max_rss = COALESCE(MAX(max_rss, :rss), max_rss, :rss), "
            "total_cpu_s = COALESCE(MAX(total_cpu_s, :cpu), total_cpu_s, :cpu) "
            "WHERE job_id = :job AND restart = :restart",
            {"rss": max_rss, "cpu": cpu_s, "job": job_id, "restart": restart})

    def run_stats(self, job_ids: Iterable[tuple[int, int]]) -> dict[int, dict[str, Any]]:
        """Job id -> {"max_rss", "total_cpu_s"} of the given runs (job id, restart) that have
        a row; a value is None where no node reported one."""
        keys = set(job_ids)
        if not keys:
            return {}
        low, high = min(k[0] for k in keys), max(k[0] for k in keys)
        rows = self.conn.execute(
            "SELECT job_id, restart, max_rss, total_cpu_s FROM runs WHERE job_id BETWEEN ? AND ? "
            "AND (max_rss IS NOT NULL OR total_cpu_s IS NOT NULL)", (low, high))
        return {job_id: {"max_rss": rss, "total_cpu_s": cpu}
                for job_id, restart, rss, cpu in rows if (job_id, restart) in keys}

    def run_usage(self, since: float, until: float) -> list[tuple[str, str, str, str, float]]:
        """(user, account, qos, run state, GPU-seconds inside [since, until]) of ended runs."""
        return self.conn.execute(
            "SELECT user, account, qos, state, "
            "SUM(gpus * (MIN(end_time, :until) - MAX(start_time, :since))) FROM runs "
            "WHERE end_time > :since AND start_time < :until "
            "GROUP BY user, account, qos, state ORDER BY user, account, qos, state",
            {"since": since, "until": until}).fetchall()

    def live_jobs(self) -> list[Job]:
        """Jobs the head must keep in memory: pending, running, or still holding GPUs."""
        rows = self.conn.execute(
            f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state IN ('PENDING', 'RUNNING') "
            f"AND id < {_STAGED_FROM} "
            f"UNION SELECT {_JOB_COLUMNS} FROM jobs WHERE holds_alloc = 1 ORDER BY id")
        return [self._job(r) for r in rows]

    def finished_jobs(self, *, user: str | None = None, since: float | None = None,
                      limit: int = 1000) -> list[Job]:
        where = ["state NOT IN ('PENDING', 'RUNNING')"]
        args: list[str | float] = []
        if user:
            where.append("user = ?")
            args.append(user)
        if since is not None:
            where.append("COALESCE(end_time, submit_time) >= ?")
            args.append(since)
        rows = self.conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE {' AND '.join(where)} "
                                 "ORDER BY id DESC LIMIT ?", (*args, limit))
        return [self._job(r) for r in rows][::-1]

    # ------------------------------------------------------------ nodes

    def save_node(self, node: Node) -> None:
        events.node_changed(self.conn, node.name, node.state.value, node.reason)
        info = {"gpus": [_gpu_dict(g) for g in node.gpus], "cpus": node.cpus, "mem": node.mem,
                "drain_reason": node.drain_reason, "features": node.features}
        self.conn.execute(
            "INSERT OR REPLACE INTO nodes(name, state, reason, last_seen, info) VALUES (?,?,?,?,?)",
            (node.name, node.state.value, node.reason, node.last_seen,
             msgpack.packb(info, use_bin_type=True)))

    def load_nodes(self) -> list[Node]:
        nodes = []
        for name, state, reason, last_seen, info in self.conn.execute(
                "SELECT name, state, reason, last_seen, info FROM nodes ORDER BY name"):
            data = msgpack.unpackb(info, raw=False)
            nodes.append(Node(name=name, state=NodeState(state), reason=reason,
                              drain_reason=data.get("drain_reason", ""),
                              last_seen=last_seen, cpus=data["cpus"], mem=data["mem"],
                              features=list(data.get("features", [])),
                              gpus=[Gpu(**g) for g in data["gpus"]]))
        return nodes


    # ------------------------------------------------------------ events and tokens

    def event_bounds(self) -> tuple[int, int]:
        """(the first event's seq still kept, the last seq given); see gq.events.bounds."""
        return events.bounds(self.conn)

    def events_since(self, after: int, until: int, **filters: Any) -> list[dict[str, Any]]:
        """Events with after < seq <= until that match `filters` (gq.events.since)."""
        return events.since(self.conn, after, until, **filters)

    def steps_of(self, job_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
        """The jobs' steps (gq.stepstore.of_jobs)."""
        return stepstore.of_jobs(self.conn, job_ids)

    def prune_events(self, before: float, keep_rows: int) -> int:
        return events.prune(self.conn, before, keep_rows)

    def load_tokens(self) -> list[tuple[Any, ...]]:
        """(id, hash, uid, user, name, created, expires, read_only) of every token."""
        return self.conn.execute("SELECT id, hash, uid, user, name, created, expires, "
                                 "read_only FROM tokens ORDER BY id").fetchall()

    def add_token(self, digest: str, uid: int, user: str, name: str, created: float,
                  expires: float | None, read_only: bool) -> int:
        """A new token's row inside the caller's transaction; its id."""
        cur = self.conn.execute(
            "INSERT INTO tokens(hash, uid, user, name, created, expires, read_only) "
            "VALUES (?,?,?,?,?,?,?)", (digest, uid, user, name, created, expires, int(read_only)))
        return int(cur.lastrowid or 0)

    def delete_tokens(self, ids: Iterable[int]) -> None:
        self.conn.executemany("DELETE FROM tokens WHERE id = ?", ((i,) for i in ids))


def _migration(conn: sqlite3.Connection, target: int) -> None:
    """Take the schema from version `target` to `target + 1`, inside the caller's transaction."""
    for statement in MIGRATIONS[target]:
        conn.execute(statement)
    conn.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('schema_version', ?)",
                 (str(target + 1),))


def _create(path: Path) -> None:
    """A new database, built under a temporary name and renamed into place whole: so a gq.db
    that exists always holds a schema, and an empty one is damage, never a first start that
    was cut short. Created 0600: SQLite gives its -wal and -shm the database's mode."""
    tmp = path.with_name(f".{path.name}.new")
    for leftover in (tmp, *storeguard.side_files(tmp)):
        leftover.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("BEGIN IMMEDIATE")
        for target in range(SCHEMA_VERSION):
            _migration(conn, target)
        conn.execute("COMMIT")
    finally:
        conn.close()  # the last connection: the WAL is checkpointed into the file and removed
    rename_durably(tmp, path)


def _make_private(path: Path) -> None:
    """The database and its side files 0600: they hold every job's script and environment.
    (A database from a gq before this one may be 0644.)"""
    for file in (path, *storeguard.side_files(path)):
        try:
            os.chmod(file, 0o600)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot make %s private (0600): %s", file, exc)


def _write_failure(path: Path, exc: sqlite3.Error) -> str:
    """What a user is told when a request could not be saved (the usual cause: a full disk)."""
    full = getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL"
    hint = "; free space on its filesystem" if full else ""
    return f"gqd could not save to its database {path} ({exc}{hint}): nothing was changed"


def _gpu_dict(gpu: Gpu) -> dict[str, Any]:
    return {"index": gpu.index, "type": gpu.type, "memory": gpu.memory, "uuid": gpu.uuid,
            "name": gpu.name}


def spec_blob(spec: JobSpec) -> bytes:
    """A job's spec as its row stores it (the `spec` column; read back by `_job`)."""
    return msgpack.packb(spec.to_dict(), use_bin_type=True)


def _job_row(job: Job, blob: bytes, job_id: int | None) -> tuple[Any, ...]:
    s = job.spec
    return (job_id, s.name, s.user, s.uid, s.qos, job.state.value, job.reason, s.nodes, s.gpus,
            s.gpu_type, s.time_limit_s, job.submit_time, job.start_time, job.end_time,
            job.exit_code, json.dumps(job.alloc) if job.alloc else "{}", int(job.holds_alloc),
            job.restart_count,
            job.array_job_id, job.array_index, blob, job.hold, job.node_fail_count, s.partition)


def _job(row: Iterable[Any], spec: bytes) -> Job:
    (job_id, name, _user, _uid, qos, state, reason, _nodes, _gpus, _gpu_type, time_limit_s,
     submit_time, start_time, end_time, exit_code, alloc, holds_alloc, restart_count,
     array_job_id, array_index, _spec, hold, node_fail_count, _partition) = row
    # qos, time limit and name may be updated after submit (gq update): the columns, not the
    # blob (an array's tasks share their first task's), are current.
    values = msgpack.unpackb(spec, raw=False)
    values["qos"], values["time_limit_s"], values["name"] = qos, time_limit_s, name
    return Job(id=job_id, spec=JobSpec.from_dict(values),
               state=JobState(state), reason=reason, submit_time=submit_time,
               start_time=start_time, end_time=end_time, exit_code=exit_code,
               alloc=json.loads(alloc), holds_alloc=bool(holds_alloc),
               restart_count=restart_count, array_job_id=array_job_id, array_index=array_index,
               hold=hold, node_fail_count=node_fail_count)
