"""SIGTERM to gqnode (systemctl stop, KillMode=process) stops the daemon, never its jobs."""

from __future__ import annotations

import os
import signal

from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster

#: Records each start, waits for its go file, exits with the code in it.
SCRIPT = """#!/bin/sh
echo run >> runs.$GQ_JOB_ID
while [ ! -e go.$GQ_JOB_ID ]; do sleep 0.1; done
exit $(cat go.$GQ_JOB_ID)
"""


def _stop(live: LiveCluster, times: int) -> None:
    pid = live.node_pid("node1")
    for _ in range(times):
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: live.node_pid("node1") is None, "gqnode to stop")


def _go(live: LiveCluster, job_id: int, code: int) -> None:
    tmp = live.work / f".go.{job_id}"
    tmp.write_text(f"{code}\n")
    tmp.rename(live.work / f"go.{job_id}")  # whole when the job sees it


def test_sigterm_to_gqnode_leaves_jobs_running_and_they_are_readopted(
        make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, fake_gpus="3")
    with live.client() as c:
        ids = c.submit([live.spec(SCRIPT) for _ in range(3)])
    wait_for(lambda: all((live.work / f"runs.{i}").exists() for i in ids), "every job to begin")
    codes = dict(zip(ids, (3, 0, 5)))

    # One SIGTERM: gqnode stops, the jobs run on; one of them ends while nobody watches it.
    _stop(live, 1)
    assert "3 jobs keep running" in live.log("node1")
    _go(live, ids[0], codes[ids[0]])
    wait_for(lambda: live.run_ended("node1", ids[0]), "a job to end while gqnode is stopped")
    assert live.gq("up").returncode == 0, live.log("node1")
    assert live.wait_state(ids[0], "FAILED")["exit_code"] == 3

    # Two SIGTERMs in a row (an impatient admin) are no harder a stop: the jobs still run.
    _stop(live, 2)
    _go(live, ids[1], codes[ids[1]])
    assert live.gq("up").returncode == 0, live.log("node1")
    assert live.wait_state(ids[1], "COMPLETED")["exit_code"] == 0
    assert live.show(ids[2])["state"] == "RUNNING", "the re-adopted job runs on"

    _go(live, ids[2], codes[ids[2]])
    with live.client() as c:
        done = {j["id"]: j for j in c.wait(ids, timeout_s=60)}
    for job_id, code in codes.items():
        job = done[job_id]
        assert (job["exit_code"], job["restart_count"]) == (code, 0), job
        assert (live.work / f"runs.{job_id}").read_text() == "run\n", f"job {job_id} ran twice"
    wait_for(lambda: live.settled("node1"), "every report to be acknowledged")


def test_sigterm_to_gqd_stops_it_promptly_every_time(make_cluster: MakeCluster) -> None:
    """gqd's stop closes its sockets and ends its ZMQ context: it used to hang there now and
    then (about one stop in five with a few hundred jobs), when the ZAP handler's socket was
    closed from the main thread while its own thread was blocked in recv on it."""
    live = make_cluster(nodes=1, fake_gpus="1")
    with live.client() as c:
        c.submit([live.spec("#!/bin/sh\ntrue\n", hold=True) for _ in range(300)])
    for attempt in range(8):
        pid = live.head_pid()
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: live.head_pid() is None, f"gqd to stop (stop {attempt + 1})",
                 timeout=15)
        assert live.gq("up").returncode == 0, live.log("gqd")
        wait_for(lambda: live.head_pid() is not None, "gqd to start again")
