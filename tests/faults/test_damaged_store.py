"""Fault 8: the real gqd started on a damaged copy of a real cluster's database refuses, with its
message and exit status (gqd.8, EXIT STATUS), and leaves every file byte for byte as it was."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gq import config as config_mod
from gq.errors import ExitStatus
from gq.store import SCHEMA_VERSION, Store
from tests.conftest import DEADLINE_S, prepare, running, wait_for
from tests.test_storeguard import hashes

#: Jobs in the copies: a bulk submit, then single ones (small commits the WAL still holds).
BULK, SINGLES = 300, 5
PAGE = 4096


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """gqd's state directory as a real cluster left it: "crashed" (gqd SIGKILLed after the
    submits: commits in the WAL, a -shm), and "clean" (the same, opened and closed by the store
    as a stopping gqd does: all in gq.db, no WAL). Each test damages its own copy of one."""
    root = tmp_path_factory.mktemp("damaged")
    with running(prepare(root), nodes=1, fake_gpus="1") as live:
        live.gq("admin", "drain", "node1", "--reason", "hold the queue", check=True)
        with live.client() as c:
            assert len(c.submit([live.spec("#!/bin/sh\ntrue\n", name="bulk")] * BULK)) == BULK
            for i in range(SINGLES):
                c.submit([live.spec("#!/bin/sh\ntrue\n", name=f"one{i}")])
        os.kill(live.head_pid(), signal.SIGKILL)
        wait_for(lambda: live.head_pid() is None, "gqd to die")
        shutil.copytree(Path(live.config().head.state_dir), root / "crashed",
                        ignore=shutil.ignore_patterns("gqd.pid"))
        assert live.gq("up").returncode == 0, live.log("gqd")  # for `gq down`
    shutil.copytree(root / "crashed", root / "clean")
    Store(root / "clean" / "gq.db").close()
    assert not (root / "clean" / "gq.db-wal").exists()
    yield {"crashed": root / "crashed", "clean": root / "clean", "config": live.config_path}


def _start_gqd(copies: dict[str, Path], which: str, tmp_path: Path,
               damage: Callable[[Path], None]) -> tuple[subprocess.CompletedProcess[str], Path]:
    """gqd on a damaged copy of `which`; its run, and the copy. Files other than gqd's pid file
    must be as they were after `damage`."""
    config = _config_for(copies, which, tmp_path)
    state = tmp_path / "state"
    damage(state / "gq.db")
    before = hashes(state)
    proc = subprocess.run([sys.executable, "-m", "gq.head.daemon", "--config", str(config)],
                          capture_output=True, text=True, timeout=DEADLINE_S)
    after = hashes(state)
    after.pop("gqd.pid", None)
    assert after == before, f"gqd changed its refused store: {before} -> {after}"
    return proc, state


def _refused(proc: subprocess.CompletedProcess[str], status: ExitStatus, *words: str) -> None:
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    assert "gqd cannot start" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def _remove_store(db: Path) -> None:
    for path in (db, db.with_name("gq.db-wal"), db.with_name("gq.db-shm")):
        path.unlink(missing_ok=True)


def test_missing_database_beside_its_mark_is_refused(copies, tmp_path: Path) -> None:
    proc, state = _start_gqd(copies, "crashed", tmp_path, _remove_store)
    _refused(proc, ExitStatus.STORE_MISSING, "gq.db is missing", "gq.db.mark", "gq admin restore")
    assert not (state / "gq.db").exists(), "a new, empty cluster was started"


def test_empty_database_is_refused(copies, tmp_path: Path) -> None:
    proc, state = _start_gqd(copies, "crashed", tmp_path, lambda db: db.write_bytes(b""))
    _refused(proc, ExitStatus.STORE_EMPTY, "is empty (0 bytes)")
    assert (state / "gq.db-wal").stat().st_size > 0  # SQLite would have deleted it


def test_truncated_database_is_refused(copies, tmp_path: Path) -> None:
    proc, _ = _start_gqd(copies, "clean", tmp_path,
                         lambda db: os.truncate(db, db.stat().st_size // 2 // PAGE * PAGE))
    _refused(proc, ExitStatus.STORE_TRUNCATED, "is truncated", "its header says")


def test_database_with_a_garbage_page_is_refused(copies, tmp_path: Path) -> None:
    def garbage(db: Path) -> None:
        with open(db, "r+b") as f:
            f.seek(db.stat().st_size // PAGE // 2 * PAGE)
            f.write(bytes((i * 37 + 11) % 256 for i in range(PAGE)))
    proc, _ = _start_gqd(copies, "clean", tmp_path, garbage)
    _refused(proc, ExitStatus.STORE_CORRUPT, "is corrupt", "integrity check finds")


def test_wal_removed_after_acknowledged_commits_is_refused_with_the_loss(copies,
                                                                          tmp_path: Path) -> None:
    left: list[int] = []

    def lose_wal(db: Path) -> None:
        wal = db.with_name("gq.db-wal")
        assert wal.stat().st_size > 0, "the killed gqd left no commits in its WAL"
        wal.unlink()
        conn = sqlite3.connect(f"file:{db}?immutable=1", uri=True)
        left.append(conn.execute("SELECT COALESCE(MAX(id), 0) FROM jobs").fetchone()[0])
        conn.close()

    proc, _ = _start_gqd(copies, "crashed", tmp_path, lose_wal)
    lost = BULK + SINGLES - left[0]
    assert lost > 0
    _refused(proc, ExitStatus.STORE_BEHIND, "behind what gqd acknowledged",
             f"would lose {lost} job id")


def test_database_of_a_newer_schema_is_refused(copies, tmp_path: Path) -> None:
    def newer(db: Path) -> None:
        conn = sqlite3.connect(db)
        with conn:
            conn.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                         (str(SCHEMA_VERSION + 1),))
        conn.close()
    proc, _ = _start_gqd(copies, "clean", tmp_path, newer)
    _refused(proc, ExitStatus.STORE_NEWER, f"schema version {SCHEMA_VERSION + 1}, newer")


def test_the_undamaged_copies_start(copies, tmp_path: Path) -> None:
    """The control: the same copies, undamaged, pass the checks (gqd gets as far as binding)."""
    for which in ("crashed", "clean"):
        config = _config_for(copies, which, tmp_path / which)
        with open(tmp_path / which / "gqd.log", "w") as log:
            proc = subprocess.Popen([sys.executable, "-m", "gq.head.daemon", "--config",
                                     str(config)], stderr=log)
        try:
            wait_for(lambda: (tmp_path / which / "gqd.sock").exists() or proc.poll() is not None,
                     "gqd to bind its socket")
            assert proc.poll() is None, (tmp_path / which / "gqd.log").read_text()
        finally:
            proc.kill()
            proc.wait(timeout=DEADLINE_S)


def _config_for(copies: dict[str, Path], which: str, where: Path) -> Path:
    shutil.copytree(copies[which], where / "state")
    cfg = config_mod.load(copies["config"])
    cfg.head.state_dir = str(where / "state")
    cfg.head.client_endpoints = [f"ipc://{where / 'gqd.sock'}"]
    cfg.head.node_endpoint = "tcp://127.0.0.1:*"
    cfg.head.metrics_addr = ""
    (where / "gq.toml").write_text(config_mod.to_toml(cfg))
    return where / "gq.toml"
