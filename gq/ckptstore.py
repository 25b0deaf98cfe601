"""Runs' checkpoints in the store: when each run (job id, restart) last saved its progress.

A table of its own beside gq/store.py's `runs` (a live run has no `runs` row until it ends),
written by gqd (gq/head/checkpoints.py) inside the turn's transaction and read for the
scheduler's victims (a live job's latest), `gq show` and `gq report`: a preempted run's GPU time
before its last checkpoint is use, only the time since is lost.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

#: The schema migration that adds the table (gq/store.py's MIGRATIONS); a database made before
#: it opens and gets an empty table: its runs reported no checkpoints.
MIGRATION = [
    """CREATE TABLE checkpoints (
        job_id INTEGER NOT NULL, restart INTEGER NOT NULL, time REAL NOT NULL,
        PRIMARY KEY (job_id, restart))""",
]

#: Run outcomes whose lost work counts from the run's last checkpoint: the run was stopped from
#: outside (preempted, its node lost) and its next run resumes from the checkpoint.
RESUMED = ("PREEMPTED", "NODE_FAIL")


def put(conn: sqlite3.Connection, job_id: int, restart: int, when: float) -> None:
    """Run (job_id, restart) checkpointed at `when`; a time only grows."""
    conn.execute("INSERT INTO checkpoints(job_id, restart, time) VALUES (?, ?, ?) "
                 "ON CONFLICT(job_id, restart) DO UPDATE SET time = MAX(time, excluded.time)",
                 (job_id, restart, when))


def latest(conn: sqlite3.Connection, job_ids: Iterable[int]) -> dict[int, float]:
    """Job id -> the time of its latest checkpoint (of any run), for those that have one."""
    ids = sorted(set(job_ids))
    out: dict[int, float] = {}
    for i in range(0, len(ids), 500):  # SQLite's bound on a statement's parameters
        part = ids[i:i + 500]
        rows = conn.execute("SELECT job_id, MAX(time) FROM checkpoints WHERE job_id IN "
                            f"({','.join('?' * len(part))}) GROUP BY job_id", part)
        out.update((job_id, when) for job_id, when in rows)
    return out


def saved_usage(conn: sqlite3.Connection, since: float, until: float
                ) -> list[tuple[str, str, str, str, float]]:
    """(user, account, qos, run state, GPU-seconds inside [since, until] before the run's last
    checkpoint) of ended runs that were stopped from outside (RESUMED) and had checkpointed."""
    marks = ",".join(f":s{i}" for i in range(len(RESUMED)))
    return conn.execute(
        "SELECT r.user, r.account, r.qos, r.state, SUM(r.gpus * ("
        "MIN(MIN(c.time, r.end_time), :until) - MAX(r.start_time, :since))) "
        "FROM runs r JOIN checkpoints c ON c.job_id = r.job_id AND c.restart = r.restart "
        f"WHERE r.state IN ({marks}) AND c.time > r.start_time "
        "AND MIN(c.time, r.end_time) > :since AND r.start_time < :until "
        "GROUP BY r.user, r.account, r.qos, r.state",
        {**{f"s{i}": s for i, s in enumerate(RESUMED)}, "since": since, "until": until}
    ).fetchall()
