"""The job steps table (gq/head/steps.py owns its rows): one row a step, `JOBID.STEP` in
`gq history` and sacct, written when the step starts and when it ends."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from typing import Any

#: The schema migration that adds steps (gq/store.py MIGRATIONS).
MIGRATION = [
    """CREATE TABLE steps (
        job_id INTEGER NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL,
        state TEXT NOT NULL, exit_code INTEGER, ntasks INTEGER NOT NULL,
        nodes TEXT NOT NULL, start_time REAL NOT NULL, end_time REAL,
        detail TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (job_id, step))""",
    "CREATE INDEX steps_live ON steps(state) WHERE state = 'RUNNING'",
]
#: `detail`: what a live step's bookkeeping needs after a restart of gqd (JSON: its run, -K,
#: the nodes that reported and their exit codes).
_COLUMNS = ("job_id", "step", "name", "state", "exit_code", "ntasks", "nodes", "start_time",
            "end_time", "detail")


def next_step(conn: sqlite3.Connection, job_id: int) -> int:
    """The id the job's next step takes: one past its last (0 for its first)."""
    row = conn.execute("SELECT MAX(step) FROM steps WHERE job_id = ?", (job_id,)).fetchone()
    return 0 if row[0] is None else int(row[0]) + 1


def put(conn: sqlite3.Connection, row: dict[str, Any]) -> None:
    """Write a step's row (its start, or its end over the start)."""
    conn.execute(f"INSERT OR REPLACE INTO steps ({', '.join(_COLUMNS)}) VALUES "
                 f"({', '.join('?' * len(_COLUMNS))})", tuple(row[c] for c in _COLUMNS))


def live(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The steps not ended yet (gqd loads them when it starts)."""
    rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM steps WHERE state = 'RUNNING' "
                        "ORDER BY job_id, step")
    return [dict(zip(_COLUMNS, row)) for row in rows]


def of_jobs(conn: sqlite3.Connection, job_ids: Iterable[int]) -> dict[int, list[dict[str, Any]]]:
    """The steps of these jobs, each job's in step order."""
    ids = sorted(set(job_ids))
    out: dict[int, list[dict[str, Any]]] = {}
    for i in range(0, len(ids), 500):  # SQLite's limit on parameters
        chunk = ids[i:i + 500]
        rows = conn.execute(f"SELECT {', '.join(_COLUMNS)} FROM steps WHERE job_id IN "
                            f"({', '.join('?' * len(chunk))}) ORDER BY job_id, step", chunk)
        for row in rows:
            rec = dict(zip(_COLUMNS, row))
            out.setdefault(rec["job_id"], []).append(rec)
    return out
