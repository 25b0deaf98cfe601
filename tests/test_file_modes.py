"""A personal cluster (`gq up`) keeps its state private too: directories 0700 (0711 where a job's
owner must pass through to its run directory), the database, its mark, each run's order and
record, the outbox and the logs 0600. (A system cluster, with real users: tests/test_users.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import LiveCluster, wait_for


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_a_personal_clusters_state_is_readable_by_its_owner_only(cluster: LiveCluster) -> None:
    release = cluster.work / "release"
    job = cluster.submit("--export", "ALL,GQ_TEST_SECRET=x", "--wrap",
                         "while [ ! -e release ]; do sleep 0.1; done")
    cluster.wait_state(job, "RUNNING")
    head, node = Path(cluster.config().head.state_dir), cluster.layout.node_dir("node1")
    # RUNNING is gqd's word once it ordered the launch; the node makes the run's directory
    # when the order reaches it, a moment later.
    run = wait_for(lambda: next((node / "jobs").glob(f"{job}.*"), None), "the run's directory")
    wait_for(lambda: (run / "run").exists(), "the run's record")
    dirs = {p: _mode(p) for p in (head, node, node / "jobs", node / "outbox", run,
                                  cluster.layout.root / "logs")}
    assert dirs == {head: 0o700, node: 0o711, node / "jobs": 0o711, node / "outbox": 0o700,
                    run: 0o700, cluster.layout.root / "logs": 0o700}, dirs
    files = [*head.glob("gq.db*"), run / "launch.msg", run / "run",
             *(cluster.layout.root / "logs").iterdir()]
    assert {p.name for p in head.glob("gq.db*")} >= {"gq.db", "gq.db-wal", "gq.db.mark"}
    assert {p: _mode(p) for p in files} == {p: 0o600 for p in files}
    release.touch()
    assert cluster.wait_state(job, "COMPLETED", "FAILED")["state"] == "COMPLETED"
