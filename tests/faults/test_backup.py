"""`gq admin backup` of a running cluster under load, and the documented restore path: a copy
that would roll back acknowledged jobs is refused (by gqd and by `gq admin restore`) unless
forced, and a forced restore never hands out an acknowledged id again."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

from gq.client import Client
from gq.errors import ExitStatus
from tests.conftest import DEADLINE_S, LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

CLIENTS = 4
#: Submits acknowledged before the backup starts.
BEFORE = 200


class Submitter(threading.Thread):
    """One client submitting one job a request until told to stop; its acknowledged ids."""

    def __init__(self, live: LiveCluster, index: int):
        super().__init__(daemon=True)
        self.live, self.index = live, index
        self.acked: list[int] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.live.config(), timeout_s=30.0) as client:
                while not self.stop.is_set():
                    spec = self.live.spec("#!/bin/sh\ntrue\n", name=f"c{self.index}")
                    self.acked.extend(client.submit([spec]))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            self.error = exc


def _ids(db: Path) -> set[int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return {row[0] for row in conn.execute("SELECT id FROM jobs")}
    finally:
        conn.close()


def test_backup_while_4_clients_submit_holds_every_job_acknowledged_before_it(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    live = make_cluster(nodes=1, fake_gpus="1")
    live.gq("admin", "drain", "node1", "--reason", "hold the queue", check=True)
    clients = [Submitter(live, i) for i in range(CLIENTS)]
    for c in clients:
        c.start()
    try:
        wait_for(lambda: sum(len(c.acked) for c in clients) >= BEFORE or any(
            c.error for c in clients), f"{BEFORE} submits to be acknowledged")
        acked_before = {i for c in clients for i in list(c.acked)}
        (tmp_path / "backups").mkdir()
        copy = tmp_path / "backups" / "gq.db"
        proc = live.gq("admin", "backup", str(copy))
    finally:
        for c in clients:
            c.stop.set()
        for c in clients:
            c.join(timeout=DEADLINE_S)
    assert not any(c.error for c in clients), [c.error for c in clients]
    assert proc.returncode == 0, proc.stderr
    assert "wrote" in proc.stderr and "jobs, job ids up to" in proc.stderr, proc.stderr
    in_copy = _ids(copy)
    missing = acked_before - in_copy
    assert not missing, f"{len(missing)} jobs acknowledged before the backup are not in it"
    assert copy.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in copy.parent.iterdir()] == ["gq.db"]  # one file: no -wal, no temp


def test_restore_refuses_to_roll_back_acknowledged_jobs_unless_forced(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    live = make_cluster(nodes=1, fake_gpus="1")
    live.gq("admin", "drain", "node1", "--reason", "hold the queue", check=True)
    with live.client() as c:
        kept = c.submit([live.spec("#!/bin/sh\ntrue\n", name="kept")] * 20)
    copy = tmp_path / "backup.db"
    live.gq("admin", "backup", str(copy), check=True)
    with live.client() as c:
        lost = c.submit([live.spec("#!/bin/sh\ntrue\n", name="after")] * 7)
    assert live.gq("down").returncode == 0
    db = Path(live.config().head.state_dir) / "gq.db"

    # Put the copy in place by hand, as an admin might: gqd refuses to start on it.
    db.write_bytes(copy.read_bytes())
    for side in ("gq.db-wal", "gq.db-shm"):
        db.with_name(side).unlink(missing_ok=True)
    proc = subprocess.run([sys.executable, "-m", "gq.head.daemon", "--config",
                           str(live.config_path)], capture_output=True, text=True,
                          timeout=DEADLINE_S)
    assert proc.returncode == ExitStatus.STORE_BEHIND, proc.stderr
    assert "would lose 7 job ids" in proc.stderr and "gq admin restore" in proc.stderr

    # The documented path says the same and does nothing without --force.
    refused = live.gq("admin", "restore", str(copy))
    assert refused.returncode == ExitStatus.STORE_BEHIND, refused.stderr
    assert "would lose 7 job ids" in refused.stderr and "--force" in refused.stderr
    forced = live.gq("admin", "restore", str(copy), "--force")
    assert forced.returncode == 0, forced.stderr
    assert "accepted the loss" in forced.stderr and "kept as" in forced.stderr, forced.stderr

    assert live.gq("up").returncode == 0, live.log("gqd")
    with live.client() as c:
        queued = {j["id"] for j in c.queue()}
        (new,) = c.submit([live.spec("#!/bin/sh\ntrue\n", name="new")])
    assert queued == set(kept)
    assert new > max(lost), "a restore handed out an acknowledged job id again"
