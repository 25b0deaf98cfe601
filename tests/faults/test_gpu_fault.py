"""Fault 5: a GPU reports an XID error; its node is drained with the reason, its jobs requeued."""

from __future__ import annotations

import psutil

from gq.node.gpus import FAULT_FILE
from tests.conftest import LiveCluster, wait_for

XID = "Xid 79: GPU has fallen off the bus"
#: Records each run (which restart, which node) and the pid of its process, then sleeps.
SCRIPT = ("echo $GQ_RESTART_COUNT $GQ_NODELIST >> runs.$GQ_JOB_ID; "
          "echo $$ > pid.$GQ_JOB_ID.$GQ_RESTART_COUNT; exec sleep 300")


def _node(live: LiveCluster, name: str) -> dict:
    return next(n for n in live.nodes() if n["name"] == name)


def _pid(live: LiveCluster, job_id: int, restart: int) -> int:
    path = live.work / f"pid.{job_id}.{restart}"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(), f"{path.name}"))


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_xid_error_drains_the_node_and_requeues_its_jobs(cluster: LiveCluster) -> None:
    requeued = cluster.submit("--wrap", SCRIPT)
    lost = cluster.submit("--no-requeue", "--wrap", SCRIPT)
    (bad,) = cluster.wait_state(requeued, "RUNNING")["node_list"]
    assert cluster.wait_state(lost, "RUNNING")["node_list"] == [bad], "best fit packs them"
    old_pids = [_pid(cluster, requeued, 0), _pid(cluster, lost, 0)]

    (cluster.layout.node_dir(bad) / FAULT_FILE).write_text(f"3 {XID}\n")
    wait_for(lambda: _node(cluster, bad)["state"] == "DRAIN", f"{bad} to be drained")
    assert _node(cluster, bad)["reason"] == f"GPU 3: {XID}"
    listing = cluster.gq("nodes", check=True).stdout
    assert any(bad in line and "DRAIN" in line and XID in line for line in listing.splitlines())

    # The requeued job runs again elsewhere as its next run; the --no-requeue one ends NODE_FAIL.
    wait_for(lambda: cluster.show(requeued)["restart_count"] == 1, "the job's second run")
    job = cluster.wait_state(requeued, "RUNNING")
    (good,) = job["node_list"]
    assert good != bad
    _pid(cluster, requeued, 1)
    assert (cluster.work / f"runs.{requeued}").read_text() == f"0 {bad}\n1 {good}\n"
    assert cluster.wait_state(lost, "NODE_FAIL")["restart_count"] == 0
    for pid in old_pids:
        wait_for(lambda: _gone(pid), f"the first runs on {bad} to be killed (pid {pid})")

    # Once the GPU is fixed (no fault reported), an admin puts the node back.
    (cluster.layout.node_dir(bad) / FAULT_FILE).unlink()
    cluster.gq("admin", "resume", bad, check=True)
    assert _node(cluster, bad)["state"] == "UP"
    cluster.gq("cancel", str(requeued), check=True)
