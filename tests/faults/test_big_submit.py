"""A submit too big for one loop turn (gq/head/submits.py): gqd answers others meanwhile, shows
none of it until it is committed, and a crash keeps all of it or none of it."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading

from gq import defaults
from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

#: Tasks of the big array: seconds of gqd's work, many loop turns.
TASKS = 60_000


def _db(live: LiveCluster) -> sqlite3.Connection:
    path = os.path.join(live.config().head.state_dir, defaults.DB_FILE)
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)


def _staging(live: LiveCluster) -> bool:
    """The big submit has committed staged rows (and not yet its last ones)."""
    with _db(live) as db:
        return db.execute("SELECT 1 FROM meta WHERE key = 'staged_from'").fetchone() is not None


def _rows(live: LiveCluster, name: str) -> list[int]:
    with _db(live) as db:
        return [r[0] for r in db.execute("SELECT id FROM jobs WHERE name = ? ORDER BY id",
                                         (name,))]


def _big(live: LiveCluster) -> subprocess.Popen[str]:
    """`gq submit` of a big held array, as a user would run it."""
    return subprocess.Popen(
        [sys.executable, "-m", "gq.cli.main", "submit", "--parsable", "--hold", "--array",
         f"0-{TASKS - 1}", "--name", "big", "--wrap", "true"],
        env=live.env, cwd=live.work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _restart(live: LiveCluster) -> None:
    wait_for(lambda: live.head_pid() is None, "gqd to die")
    assert live.gq("up").returncode == 0, live.log("gqd")


def test_big_submit_answers_others_meanwhile_and_is_seen_whole(
        make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, fake_gpus="1")
    proc = _big(live)
    try:
        wait_for(lambda: _staging(live) or proc.poll() is not None, "the big submit to stage")
        assert proc.poll() is None, "the submit was answered before it was seen staging"
        # gqd answers other requests while the submit is in the works, and shows none of it.
        with live.client() as c:
            assert c.ping()["version"] == defaults.PROTOCOL_VERSION
            assert not [j for j in c.queue() if j["name"] == "big"]
        assert proc.poll() is None, "the big submit ended before the others were answered"
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    first = int(out.strip())
    assert _rows(live, "big") == list(range(first, first + TASKS))
    assert not _staging(live)
    # Acknowledged: a crash now keeps all of it.
    os.kill(live.head_pid(), signal.SIGKILL)
    _restart(live)
    assert _rows(live, "big") == list(range(first, first + TASKS))
    with live.client() as c:  # and gqd has them
        assert c.show(first + TASKS - 1)["state"] == "PENDING"


def test_head_killed_during_a_big_submit_keeps_none_of_it(make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, fake_gpus="1")
    proc = _big(live)
    try:
        wait_for(lambda: _staging(live) or proc.poll() is not None, "the big submit to stage")
        assert proc.poll() is None, "the submit was answered before it was seen staging"
        assert _rows(live, "big"), "no staged rows were committed before the kill"
        os.kill(live.head_pid(), signal.SIGKILL)
    finally:
        # No answer can come now; this process was started by the test.
        proc.kill()
        out, _ = proc.communicate()
    assert not out.strip(), f"the client was given ids: {out!r}"
    _restart(live)
    assert _rows(live, "big") == [] and not _staging(live)
    # Later submits take ids past the dropped ones and are seen at once.
    job_id = live.submit("--hold", "--name", "after", "--wrap", "true")
    with live.client() as c:
        assert [j["id"] for j in c.queue()] == [job_id]
