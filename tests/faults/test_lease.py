"""The node-side head lease ([node] head_lease_s, HTCondor's job lease): a node cut off from gqd
stops its jobs when the lease runs out, gqd requeues them only after that, and no job ever runs
in two places; a gqd restart shorter than the lease kills nothing."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from gq import config as config_mod
from gq.errors import ConfigError
from tests.conftest import LiveCluster, wait_for
from tests.faults.conftest import MakeCluster
from tests.faults.test_partition import CUT, HEARTBEAT_S, HOST, Net, net, split  # noqa: F401
from tests.faults.test_partition import SCRIPT as PARTITION_SCRIPT

#: A lease of a few seconds, longer than node_timeout_s, so that gqd's wait for it shows.
LEASE_S = 4.0
NODE_TIMEOUT_S = 2.0
KILL_GRACE_S = 1.0
#: Records each run (restart count, node) and its pid, then waits for its go file.
SCRIPT = PARTITION_SCRIPT.format(code=0)


#: The lease of the head restart test: room for a gqd restart on a slow, shared machine.
RESTART_LEASE_S = 10.0


def _leased(cfg: config_mod.Config, lease: float = LEASE_S) -> None:
    cfg.head.node_timeout_s, cfg.node.heartbeat_s = NODE_TIMEOUT_S, HEARTBEAT_S
    cfg.node.head_lease_s, cfg.head.kill_grace_s = lease, KILL_GRACE_S


@pytest.fixture
def leased_split(net: Net, tmp_path: Path) -> Iterator[LiveCluster]:  # noqa: F811
    """gqd and HOST on the host, CUT in the namespace, all under a head lease; HOST drained,
    so jobs start on CUT."""
    with split(net, tmp_path, _leased) as live:
        yield live


def _node(live: LiveCluster, name: str) -> dict:
    return next((n for n in live.nodes() if n["name"] == name), {})


def _pid(live: LiveCluster, job_id: int, restart: int) -> int | None:
    path = live.work / f"pid.{job_id}.{restart}"
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def _live(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _hands_over(live: LiveCluster, job_id: int, first: int, lost: str, to: str) -> None:
    """Node `lost` was just cut off (or its gqnode killed) under run 0 of the job (pid `first`):
    it goes DOWN with the job still RUNNING there, the job stops there at the lease's end, and
    only then is it requeued and started on node `to`; never two live copies at any poll."""
    cut_at = time.monotonic()
    seen_down_running = False
    stopped_at = requeued_at = None
    deadline = cut_at + 60
    while requeued_at is None or stopped_at is None:
        assert time.monotonic() < deadline, "the job was neither stopped nor requeued\n" + \
            live.log_tails("gqd", lost)
        old, new = _live(first), _live(_pid(live, job_id, 1))
        # The invariant, at every poll: never two live copies of the job.
        assert not (old and new), "the job runs in two places at once"
        if not old and stopped_at is None:
            stopped_at = time.monotonic()
        if _pid(live, job_id, 1) is not None and requeued_at is None:
            requeued_at = time.monotonic()
        if not seen_down_running and _node(live, lost).get("state") == "DOWN":
            job = live.show(job_id)
            # DOWN, but its lease still runs: gqd has not requeued the job yet.
            seen_down_running = (job["state"], job["restart_count"]) == ("RUNNING", 0) and old
        time.sleep(0.05)
    assert seen_down_running, "gqd requeued the job as soon as the node was DOWN"
    assert requeued_at >= stopped_at, "the rerun started before the cut-off copy stopped"
    assert stopped_at - cut_at >= LEASE_S - HEARTBEAT_S - 0.5, "stopped before its lease"
    job = live.wait_state(job_id, "RUNNING")
    assert (job["restart_count"], job["node_list"]) == (1, [to])


def test_cut_off_node_stops_its_job_before_gqd_requeues_it(
        leased_split: LiveCluster, net: Net) -> None:  # noqa: F811
    live = leased_split
    job_id = live.submit("--wrap", SCRIPT)
    assert live.wait_state(job_id, "RUNNING")["node_list"] == [CUT]
    first = wait_for(lambda: _pid(live, job_id, 0), "the job to start on the cut node")
    live.gq("admin", "drain", CUT, "--reason", "maintenance", check=True)
    live.gq("admin", "resume", HOST, check=True)
    net.cut()
    try:
        _hands_over(live, job_id, first, CUT, HOST)
    finally:
        net.heal()
    assert "head lease expired" in live.log(CUT)
    assert f"node {CUT}: its head lease has run out: requeuing its 1 jobs" in live.log("gqd")
    wait_for(lambda: _node(live, CUT).get("state") == "DRAIN", f"{CUT} to come back")
    wait_for(lambda: live.settled(CUT), "the stopped run's report to be delivered")
    (live.work / f"go.{job_id}.1").touch()
    job = live.wait_state(job_id, "COMPLETED")
    assert (job["restart_count"], job["node_list"]) == (1, [HOST])
    assert (live.work / f"runs.{job_id}").read_text() == f"0 {CUT}\n1 {HOST}\n"


def test_jobs_of_a_killed_gqnode_stop_at_the_lease_end_before_they_are_requeued(
        make_cluster: MakeCluster) -> None:
    """gqnode SIGKILLed, its shepherd alive: the shepherd watches the lease and stops the job."""
    live = make_cluster(nodes=2, change=_leased)
    live.gq("admin", "drain", "node2", "--reason", "jobs start on node1", check=True)
    job_id = live.submit("--wrap", SCRIPT)
    assert live.wait_state(job_id, "RUNNING")["node_list"] == [HOST]
    first = wait_for(lambda: _pid(live, job_id, 0), "the job to start on node1")
    live.gq("admin", "drain", HOST, "--reason", "maintenance", check=True)
    live.gq("admin", "resume", "node2", check=True)
    node_pid = live.node_pid(HOST)
    assert node_pid is not None
    os.kill(node_pid, signal.SIGKILL)
    _hands_over(live, job_id, first, HOST, "node2")
    assert live.gq("up").returncode == 0, live.log(HOST)  # node1 back: its stale run reported
    wait_for(lambda: live.settled(HOST), "the stopped run's report to be delivered")
    assert "head lease expired: gqnode renewed it no more" in live.log(HOST)
    (live.work / f"go.{job_id}.1").touch()
    job = live.wait_state(job_id, "COMPLETED")
    assert (job["restart_count"], job["node_list"]) == (1, ["node2"])
    assert (live.work / f"runs.{job_id}").read_text() == f"0 {HOST}\n1 node2\n"


def test_head_restart_shorter_than_the_lease_kills_nothing(make_cluster: MakeCluster) -> None:
    live = make_cluster(nodes=1, change=lambda cfg: _leased(cfg, RESTART_LEASE_S))
    job_id = live.submit("--wrap", SCRIPT)
    live.wait_state(job_id, "RUNNING")
    pid = wait_for(lambda: _pid(live, job_id, 0), "the job to start")
    head_pid = live.head_pid()
    assert head_pid is not None
    os.kill(head_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: live.head_pid() is None, "gqd to die")
    assert live.gq("up").returncode == 0, live.log("gqd")
    wait_for(lambda: _node(live, HOST).get("state") == "UP", "the node to register again")
    # Past the lease as it stood when gqd died: only the restarted gqd's answers renewed it.
    while time.monotonic() < killed_at + RESTART_LEASE_S + KILL_GRACE_S + 1:
        assert _live(pid), "the job was killed by a head restart shorter than the lease\n" + \
            live.log_tails("gqd", HOST)
        time.sleep(0.1)
    assert "head lease expired" not in live.log(HOST)
    (live.work / f"go.{job_id}.0").touch()
    job = live.wait_state(job_id, "COMPLETED")
    assert job["restart_count"] == 0
    assert (live.work / f"runs.{job_id}").read_text() == f"0 {HOST}\n"


def test_a_lease_shorter_than_two_heartbeats_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gq.toml"
    path.write_text("[node]\nheartbeat_s = 2\nhead_lease_s = 3\n")
    with pytest.raises(ConfigError, match="head_lease_s must be 0"):
        config_mod.load(path)
    path.write_text("[node]\nheartbeat_s = 2\nhead_lease_s = 4\n")
    assert config_mod.load(path).node.head_lease_s == 4
