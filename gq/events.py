"""Job and node events: what an event says, and the SQL that writes and reads the `events` table.

An event exists exactly when its change is durable: it is written by the statement that makes
the change, in the same transaction (gq/store.py calls this module at its write path):

- a job's state or hold changed: an SQLite trigger on the jobs table (`UPDATE OF state, hold`
  where the value really changed), so no code path of gqd's can change a job and forget its
  event, however gqd's job handling is arranged;
- jobs submitted: one PENDING event per job (each array task its own), when their submit
  becomes durable (`Store.unstage`, in the transaction that ends their staging): a big submit's
  staged rows have no events until then, and a submit that fails leaves none;
- a node's state or reason changed (`Store.save_node`).

`seq` is SQLite's AUTOINCREMENT rowid: it only grows, survives restarts, and is never reused,
even after pruning. A consumer that has seen every event up to N asks for those after N and
misses nothing that was acknowledged. Rows are kept for `[head] events_keep_s` and at most
`[head] events_keep_rows`; asking for pruned ones is an error saying where the stream now starts.

An event, as `gq events --json` prints it and the API sends it (docs/API.md):

    job:  seq, time (epoch seconds), kind "job", id, job_id ("123" or "100_7"), array_job_id,
          array_index, user, state, exit_code, reason, restart_count, hold ("", user, admin)
    node: seq, time, kind "node", node, state, reason

A job event's reason is the job's at that moment (a pending job's reason changing alone is no
event: every scheduling pass rewrites thousands of them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

#: Event kinds.
JOB, NODE = "job", "node"
KINDS = (JOB, NODE)
#: Wall-clock time inside SQL, in epoch seconds (what Python's time.time() gives).
_NOW_SQL = "((julianday('now') - 2440587.5) * 86400.0)"
#: When a job's change happened: gqd's own time for it where the row holds one (a start, an
#: end), else when it was written.
_JOB_TIME_SQL = (f"COALESCE(CASE WHEN NEW.state = 'RUNNING' THEN NEW.start_time "
                 f"WHEN NEW.state != 'PENDING' THEN NEW.end_time END, {_NOW_SQL})")
_COLUMNS = ("seq, time, kind, job_id, array_job_id, array_index, user, uid, state, exit_code, "
            "reason, restart, hold, node")
_JOB_VALUES = ("job_id, array_job_id, array_index, user, uid, state, exit_code, reason, "
               "restart, hold")

#: The schema migration that adds events (gq/store.py MIGRATIONS).
MIGRATION = [
    f"""CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, kind TEXT NOT NULL,
        job_id INTEGER, array_job_id INTEGER, array_index INTEGER, user TEXT, uid INTEGER,
        state TEXT NOT NULL, exit_code INTEGER, reason TEXT NOT NULL DEFAULT '',
        restart INTEGER, hold TEXT, node TEXT)""",
    "CREATE INDEX events_time ON events(time)",
    f"""CREATE TRIGGER events_job AFTER UPDATE OF state, hold ON jobs
        WHEN OLD.state IS NOT NEW.state OR OLD.hold IS NOT NEW.hold
        BEGIN
            INSERT INTO events(time, kind, {_JOB_VALUES})
            VALUES ({_JOB_TIME_SQL}, 'job', NEW.id, NEW.array_job_id, NEW.array_index,
                    NEW.user, NEW.uid, NEW.state, NEW.exit_code, NEW.reason,
                    NEW.restart_count, NEW.hold);
        END""",
]


def submitted(conn: sqlite3.Connection, first_id_sql: str) -> None:
    """One PENDING event for each job from the id `first_id_sql` (SQL) on: the staged jobs of a
    submit, in the transaction that makes them real."""
    conn.execute(f"INSERT INTO events(time, kind, {_JOB_VALUES}) "
                 f"SELECT submit_time, 'job', id, array_job_id, array_index, user, uid, state, "
                 f"exit_code, reason, restart_count, hold FROM jobs WHERE id >= {first_id_sql} "
                 f"ORDER BY id")


def node_changed(conn: sqlite3.Connection, name: str, state: str, reason: str) -> None:
    """A node event, written just before the node's row becomes (state, reason), when its
    stored row said otherwise (or there was none)."""
    old = conn.execute("SELECT state, reason FROM nodes WHERE name = ?", (name,)).fetchone()
    if old is None or tuple(old) != (state, reason):
        conn.execute(f"INSERT INTO events(time, kind, node, state, reason) "
                     f"VALUES ({_NOW_SQL}, 'node', ?, ?, ?)", (name, state, reason))


def bounds(conn: sqlite3.Connection) -> tuple[int, int]:
    """(the first seq still kept, the last seq ever given): (last + 1, last) when none is kept."""
    row = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'events'").fetchone()
    last = int(row[0]) if row else 0
    first = conn.execute("SELECT MIN(seq) FROM events").fetchone()[0]
    return (last + 1 if first is None else int(first)), last


def since(conn: sqlite3.Connection, after: int, until: int, *, uid: int | None = None,
          user: str | None = None, job: int | None = None, array: int | None = None,
          kinds: Iterable[str] | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """Events with after < seq <= until, oldest first, at most `limit`: with `uid`, only node
    events and that uid's job events; the other filters keep only events that match them all
    (a job or array filter keeps job events only)."""
    where = ["seq > ?", "seq <= ?"]
    args: list[Any] = [after, until]
    if uid is not None:
        where.append("(kind = 'node' OR uid = ?)")
        args.append(uid)
    for column, value in (("user", user), ("job_id", job), ("array_job_id", array)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if kinds is not None:
        chosen = sorted(set(kinds))
        where.append(f"kind IN ({', '.join('?' * len(chosen))})")
        args.extend(chosen)
    rows = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE {' AND '.join(where)} "
                        "ORDER BY seq LIMIT ?", (*args, limit))
    return [record(row) for row in rows]


def prune(conn: sqlite3.Connection, before: float, keep_rows: int) -> int:
    """Delete events older than `before` (epoch seconds) and all but the newest `keep_rows`;
    how many went."""
    _, last = bounds(conn)
    cur = conn.execute("DELETE FROM events WHERE time < ? OR seq <= ?", (before, last - keep_rows))
    return cur.rowcount


def record(row: tuple[Any, ...]) -> dict[str, Any]:
    """An event as the protocol, the CLI's --json and the API give it."""
    (seq, time, kind, job_id, array_job_id, array_index, user, uid, state, exit_code, reason,
     restart, hold, node) = row
    if kind == NODE:
        return {"seq": seq, "time": time, "kind": kind, "node": node, "state": state,
                "reason": reason}
    return {"seq": seq, "time": time, "kind": kind, "id": job_id,
            "job_id": str(job_id) if array_job_id is None else f"{array_job_id}_{array_index}",
            "array_job_id": array_job_id, "array_index": array_index, "user": user, "uid": uid,
            "state": state, "exit_code": exit_code, "reason": reason, "restart_count": restart,
            "hold": hold or ""}


def matches(event: dict[str, Any], *, uid: int | None = None, user: str | None = None,
            job: int | None = None, array: int | None = None,
            kinds: frozenset[str] | None = None) -> bool:
    """Whether `since` with these filters would give `event` (for events already read)."""
    if kinds is not None and event["kind"] not in kinds:
        return False
    if event["kind"] == NODE:
        return user is None and job is None and array is None
    return ((uid is None or event["uid"] == uid) and (user is None or event["user"] == user)
            and (job is None or event["id"] == job)
            and (array is None or event["array_job_id"] == array))
