"""Fault 2: gqnode SIGKILLed with 16 running jobs, half of them ending while it is down."""

from __future__ import annotations

import os
import re
import shutil
import signal

from gq.node.shepherd import PID_FILE, read_pid
from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

JOBS = 16
#: Each job records every start, then waits for its go file and exits with its own code.
SCRIPT = """#!/bin/sh
echo run >> runs.$GQ_JOB_ID
while [ ! -e go.$GQ_JOB_ID ]; do sleep 0.1; done
exit {code}
"""


def _release(live: LiveCluster, ids: list[int]) -> None:
    for job_id in ids:
        (live.work / f"go.{job_id}").touch()


def _finals_logged(live: LiveCluster, job_id: int) -> int:
    """How many times gqd recorded an end for the job (a duplicate report would log twice)."""
    return len(re.findall(rf"job {job_id} [A-Z_]+ \(exit", live.log("gqd")))


def test_gqnode_killed_with_16_running_jobs_reports_each_end_once(
        make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, fake_gpus=str(JOBS))
    codes = [i % 5 for i in range(JOBS)]  # 0 (COMPLETED) and four failure codes
    with live.client() as c:
        ids = c.submit([live.spec(SCRIPT.format(code=code)) for code in codes])
    expected = dict(zip(ids, codes))
    for job_id in ids:
        live.wait_state(job_id, "RUNNING")
    wait_for(lambda: all((live.work / f"runs.{i}").exists() for i in ids), "every job to begin")

    os.kill(live.node_pid("node1"), signal.SIGKILL)
    wait_for(lambda: live.node_pid("node1") is None, "gqnode to die")
    while_down, after = ids[::2], ids[1::2]
    _release(live, while_down)
    wait_for(lambda: all(live.run_ended("node1", i) for i in while_down),
             "half the jobs to end while gqnode is down")
    assert {live.show(i)["state"] for i in while_down} == {"RUNNING"}, "nobody could have told gqd"

    assert live.gq("up").returncode == 0, live.log("node1")
    for job_id in while_down:
        job = live.wait_state(job_id, "COMPLETED", "FAILED")
        assert job["exit_code"] == expected[job_id], job
    assert {live.show(i)["state"] for i in after} == {"RUNNING"}, "re-adopted jobs kept running"
    _release(live, after)
    with live.client() as c:
        done = {j["id"]: j for j in c.wait(ids, timeout_s=60)}
    for job_id, code in expected.items():
        job = done[job_id]
        assert (job["state"], job["exit_code"]) == ("COMPLETED" if code == 0 else "FAILED", code)
        assert job["restart_count"] == 0, f"job {job_id} was requeued"
        assert (live.work / f"runs.{job_id}").read_text() == "run\n", f"job {job_id} ran twice"
    # Every end reached gqd, was acked (the node keeps nothing), and was recorded exactly once.
    wait_for(lambda: live.settled("node1"), "every report to be acknowledged")
    assert {i: _finals_logged(live, i) for i in ids} == dict.fromkeys(ids, 1)


def test_run_lost_with_the_nodes_state_is_requeued(make_cluster: MakeCluster) -> None:
    # A node that comes back without a run it had started (reimaged, state directory lost) is
    # asked nothing about it: the head must see it missing from the node's list and requeue it.
    live = make_cluster(nodes=1, fake_gpus="1")
    job_id = live.submit("--wrap", 'echo $$ >> runs.$GQ_JOB_ID; '
                                   '[ "$GQ_RESTART_COUNT" = 1 ] || exec sleep 300')
    runs = live.work / f"runs.{job_id}"
    wait_for(lambda: runs.exists() and runs.read_text().strip(), "the job to start")
    wait_for(lambda: live.acked("node1"), "gqd to know that the run started")
    os.kill(live.node_pid("node1"), signal.SIGKILL)
    wait_for(lambda: live.node_pid("node1") is None, "gqnode to die")
    (run_dir,) = (live.layout.node_dir("node1") / "jobs").iterdir()
    shepherd, _ = read_pid(run_dir, "shepherd", PID_FILE)
    assert shepherd > 0, "no shepherd pid in the run's record"  # kill(0) would kill us
    os.kill(shepherd, signal.SIGKILL)
    os.kill(int(runs.read_text()), signal.SIGKILL)
    shutil.rmtree(run_dir)

    assert live.gq("up").returncode == 0, live.log("node1")
    job = live.wait_state(job_id, "COMPLETED")
    assert job["restart_count"] == 1, job
    assert len(runs.read_text().split()) == 2, "the lost run was not run again"
