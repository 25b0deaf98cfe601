"""A node's `[node] health_check` program fails: the node is drained with the program's first
output line as the reason and its jobs are requeued; it stays drained until an admin resumes it."""

from __future__ import annotations

from pathlib import Path

from gq import config as config_mod
from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

SCRIPT = "echo $GQ_RESTART_COUNT $GQ_NODELIST >> runs.$GQ_JOB_ID; exec sleep 300"
#: Fails while `unhealthy.NODE` exists and hangs while `hang.NODE` does.
CHECK = """#!/bin/sh
cd {work}
[ -e hang.$GQ_NODE ] && exec sleep 300
if [ -e unhealthy.$GQ_NODE ]; then
    echo "  "
    echo "scratch disk is read-only"
    echo "a second line, not the reason"
    exit 1
fi
echo "all good"
"""


def _node(live: LiveCluster, name: str) -> dict:
    return next(n for n in live.nodes() if n["name"] == name)


def _checks_passed(live: LiveCluster, name: str) -> int:
    return live.log(name).count("health check passes again")


def test_failing_health_check_drains_the_node_until_an_admin_resumes_it(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    check = tmp_path / "healthcheck"
    work = tmp_path / "work"  # the cluster's work directory (tests.conftest.prepare)
    check.write_text(CHECK.format(work=work))
    check.chmod(0o755)

    def change(cfg: config_mod.Config) -> None:
        cfg.node.health_check = str(check)
        cfg.node.health_check_interval_s = 0.2
        cfg.node.health_check_timeout_s = 1.0
        cfg.node.heartbeat_s = 0.2
    live = make_cluster(nodes=2, change=change)
    job_id = live.submit("--wrap", SCRIPT)
    (bad,) = live.wait_state(job_id, "RUNNING")["node_list"]
    good = "node2" if bad == "node1" else "node1"

    (work / f"unhealthy.{bad}").touch()
    wait_for(lambda: _node(live, bad)["state"] == "DRAIN", f"{bad} to be drained")
    assert _node(live, bad)["reason"] == "scratch disk is read-only"
    assert _node(live, good)["state"] == "UP", "the other node's check passes"
    # Its job is requeued (the GPU-fault path) and runs again on the healthy node.
    wait_for(lambda: live.show(job_id)["restart_count"] == 1, "the job to be requeued")
    assert live.wait_state(job_id, "RUNNING")["node_list"] == [good]
    assert live.show(job_id)["node_fail_count"] == 1

    # The check passes again: as in Slurm, the node stays drained until an admin resumes it.
    passed = _checks_passed(live, bad)
    (work / f"unhealthy.{bad}").unlink()
    wait_for(lambda: _checks_passed(live, bad) > passed, "the check to pass again")
    assert _node(live, bad)["state"] == "DRAIN"
    live.gq("admin", "resume", bad, check=True)
    assert _node(live, bad)["state"] == "UP"

    # A check that hangs past health_check_timeout_s fails too; its processes are killed.
    (work / f"hang.{good}").touch()
    wait_for(lambda: _node(live, good)["state"] == "DRAIN", f"{good} to be drained")
    assert "timed out after 1s" in _node(live, good)["reason"]
    wait_for(lambda: live.show(job_id)["restart_count"] == 2, "the job to be requeued again")
    assert live.wait_state(job_id, "RUNNING")["node_list"] == [bad]
    (work / f"hang.{good}").unlink()
    live.gq("cancel", str(job_id), check=True)
