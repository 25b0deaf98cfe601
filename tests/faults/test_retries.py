"""`--retries N`: a job is requeued after at most N node faults, then ends NODE_FAIL."""

from __future__ import annotations

from gq.node.gpus import FAULT_FILE
from tests.conftest import LiveCluster, wait_for

XID = "Xid 48: double bit ECC error"
SCRIPT = "echo $GQ_RESTART_COUNT $GQ_NODELIST >> runs.$GQ_JOB_ID; exec sleep 300"


def _fault(live: LiveCluster, node: str) -> None:
    (live.layout.node_dir(node) / FAULT_FILE).write_text(f"0 {XID}\n")
    wait_for(lambda: next(n for n in live.nodes() if n["name"] == node)["state"] == "DRAIN",
             f"{node} to be drained")


def test_retries_bound_the_requeues_after_node_faults(cluster: LiveCluster) -> None:
    # Contradictory and bad values are usage errors, refused before anything is sent.
    bad = cluster.gq("submit", "--no-requeue", "--retries", "2", "--wrap", "true")
    assert bad.returncode == 2 and "--retries" in bad.stderr, bad.stderr
    assert cluster.gq("submit", "--retries", "-1", "--wrap", "true").returncode == 2

    script = cluster.work / "once.sh"
    script.write_text(f"#!/bin/sh\n#GQ --retries 1\n{SCRIPT}\n")
    once = cluster.submit(str(script))                      # from its #GQ line
    never = cluster.submit("--retries", "0", "--wrap", SCRIPT)
    default = cluster.submit("--wrap", SCRIPT)              # [head] default_retries (5)
    first = {cluster.wait_state(j, "RUNNING")["node_list"][0] for j in (once, never, default)}
    assert len(first) == 1, "best fit packs them on one node"
    (bad_node,) = first
    assert cluster.show(once)["retries"] == 1 and cluster.show(default)["retries"] == 5
    assert "Retries=0/1" in cluster.gq("show", str(once), check=True).stdout

    # First node fault: --retries 0 ends NODE_FAIL at once (it is still requeueable by hand);
    # the others are requeued and run on the other node.
    _fault(cluster, bad_node)
    job = cluster.wait_state(never, "NODE_FAIL")
    assert job["restart_count"] == 0 and "--retries 0" in job["reason"], job
    for job_id in (once, default):
        wait_for(lambda: cluster.show(job_id)["node_fail_count"] == 1, f"job {job_id} requeued")
        job = cluster.wait_state(job_id, "RUNNING")
        assert job["node_list"] != [bad_node] and job["restart_count"] == 1
    (good_node,) = cluster.show(once)["node_list"]
    wait_for(lambda: (cluster.work / f"runs.{once}").read_text().count("\n") == 2,
             "the second run to begin")
    assert "Retries=1/1" in cluster.gq("show", str(once), check=True).stdout

    # Second fault: `once` has used its retry and ends NODE_FAIL; `default` waits for a node.
    _fault(cluster, good_node)
    job = cluster.wait_state(once, "NODE_FAIL")
    assert (job["restart_count"], job["node_fail_count"]) == (1, 1), job
    assert "--retries 1" in job["reason"], job
    job = cluster.wait_state(default, "PENDING")
    assert (job["restart_count"], job["node_fail_count"]) == (2, 2), job
    assert (cluster.work / f"runs.{once}").read_text() == f"0 {bad_node}\n1 {good_node}\n"

    # A manual requeue gives the NODE_FAIL job its retries afresh.
    cluster.gq("requeue", str(never), check=True)
    job = cluster.show(never)
    assert (job["state"], job["node_fail_count"]) == ("PENDING", 0), job
    cluster.gq("cancel", str(never), str(default), check=True)
