"""Faults 3 and 4: a node cut off from the head by a network partition, shorter and longer than
node_timeout. The node runs in a network namespace of its own, joined to the host (where gqd and
another node run) by a veth pair; the partition is the namespace's end of the pair going down."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from gq import config as config_mod
from gq import keys
from tests.conftest import LiveCluster, node_in_netns, prepare, running, wait_for

#: Short enough for a fast test, long enough that a loaded CI machine never misses it by accident.
NODE_TIMEOUT_S = 5.0
HEARTBEAT_S = 0.5
#: The node behind the partition, and the one on the host that takes over its jobs.
CUT, HOST = "nsnode", "node1"
#: Records each run (restart count, node) and its pid, then waits for its go file.
SCRIPT = """#!/bin/sh
echo "$GQ_RESTART_COUNT $GQ_NODELIST" >> runs.$GQ_JOB_ID
echo $$ > pid.$GQ_JOB_ID.$GQ_RESTART_COUNT
while [ ! -e go.$GQ_JOB_ID.$GQ_RESTART_COUNT ]; do sleep 0.1; done
exit {code}
"""


@dataclass
class Net:
    """A network namespace and the veth pair joining it to the host."""

    ns: str
    host_if: str
    ns_if: str
    host_addr: str
    ns_addr: str

    def cut(self) -> None:
        _ip("-n", self.ns, "link", "set", self.ns_if, "down")

    def heal(self) -> None:
        _ip("-n", self.ns, "link", "set", self.ns_if, "up")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    if shutil.which("ip") is None:
        pytest.skip("network namespaces need iproute2's ip (.ci/run installs it)")
    tag = os.getpid() % 100_000
    net = Net(ns=f"gqf{tag}", host_if=f"gqh{tag}", ns_if=f"gqn{tag}",
              host_addr=f"10.231.{tag % 250}.1", ns_addr=f"10.231.{tag % 250}.2")
    try:
        _ip("netns", "add", net.ns)
        _ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.ns_if,
            "netns", net.ns)
        _ip("addr", "add", f"{net.host_addr}/30", "dev", net.host_if)
        _ip("link", "set", net.host_if, "up")
        _ip("-n", net.ns, "addr", "add", f"{net.ns_addr}/30", "dev", net.ns_if)
        _ip("-n", net.ns, "link", "set", net.ns_if, "up")
    except subprocess.CalledProcessError as exc:
        subprocess.run(["ip", "netns", "del", net.ns], capture_output=True)
        pytest.skip(f"cannot make a network namespace here: {exc.stderr.strip()}")
    try:
        yield net
    finally:
        subprocess.run(["ip", "netns", "del", net.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", net.host_if], capture_output=True)


@pytest.fixture
def split_cluster(net: Net, tmp_path: Path) -> Iterator[LiveCluster]:
    """gqd and HOST on the host, CUT in the namespace: HOST drained, so jobs start on CUT."""
    def timeouts(cfg: config_mod.Config) -> None:
        cfg.head.node_timeout_s, cfg.node.heartbeat_s = NODE_TIMEOUT_S, HEARTBEAT_S

    with split(net, tmp_path, timeouts) as live:
        yield live


@contextlib.contextmanager
def split(net: Net, tmp_path: Path,
          change: Callable[[config_mod.Config], None]) -> Iterator[LiveCluster]:
    """A cluster as `split_cluster` makes it, its config changed by `change` too."""
    live = prepare(tmp_path)

    def reachable_from_the_namespace(cfg: config_mod.Config) -> None:
        port = cfg.head.node_endpoint.rsplit(":", 1)[1]
        cfg.head.node_endpoint = cfg.node.head = f"tcp://{net.host_addr}:{port}"
        change(cfg)

    live.configure(reachable_from_the_namespace)
    keys.ensure(live.layout.keys, [CUT])  # `gq up` makes keys only for the nodes it starts
    with running(live, nodes=1, fake_gpus="8"), live.layout.log(CUT).open("ab") as log:
        cut_node = node_in_netns(live, net.ns, CUT, net.ns_addr, log)
        try:
            wait_for(lambda: _node(live, CUT).get("state") == "UP", f"{CUT} to register")
            live.gq("admin", "drain", HOST, "--reason", "jobs start on the cut node", check=True)
            yield live
        finally:
            # `gq down` stops CUT too (its pid file is in the cluster's state); reap it here.
            live.gq("down", timeout=90)
            cut_node.wait(timeout=30)


def _node(live: LiveCluster, name: str) -> dict:
    return next((n for n in live.nodes() if n["name"] == name), {})


def _start(live: LiveCluster, codes: list[int]) -> list[int]:
    with live.client() as c:
        ids = c.submit([live.spec(SCRIPT.format(code=code)) for code in codes])
    for job_id in ids:
        assert live.wait_state(job_id, "RUNNING")["node_list"] == [CUT]
        _pid(live, job_id, 0)
    return ids


def _go(live: LiveCluster, job_id: int, restart: int) -> None:
    (live.work / f"go.{job_id}.{restart}").touch()


def _pid(live: LiveCluster, job_id: int, restart: int) -> int:
    path = live.work / f"pid.{job_id}.{restart}"
    return int(wait_for(lambda: path.exists() and path.read_text().strip(),
                        f"job {job_id} run {restart} to start"))


def _runs(live: LiveCluster, job_id: int) -> str:
    return (live.work / f"runs.{job_id}").read_text()


def test_partition_shorter_than_node_timeout_requeues_nothing(
        split_cluster: LiveCluster, net: Net) -> None:
    live = split_cluster
    ok, failed, running_on = _start(live, [0, 5, 0])
    net.cut()
    try:
        for job_id in (ok, failed):
            _go(live, job_id, 0)
        wait_for(lambda: live.run_ended(CUT, ok) and live.run_ended(CUT, failed),
                 "two jobs to end behind the partition", timeout=NODE_TIMEOUT_S / 2)
        assert {live.show(i)["state"] for i in (ok, failed)} == {"RUNNING"}, "nothing got out"
    finally:
        net.heal()
    assert live.wait_state(ok, "COMPLETED")["exit_code"] == 0
    assert live.wait_state(failed, "FAILED")["exit_code"] == 5
    wait_for(lambda: live.acked(CUT), "the partitioned node's reports to be acknowledged")
    job = live.show(running_on)
    assert (job["state"], job["node_list"]) == ("RUNNING", [CUT]), "the job kept running there"
    assert f"node {CUT} is DOWN" not in live.log("gqd")
    for job_id in (ok, failed, running_on):
        assert live.show(job_id)["restart_count"] == 0
        assert _runs(live, job_id) == f"0 {CUT}\n", f"job {job_id} was started again"
    live.gq("cancel", str(running_on), check=True)


def test_partition_longer_than_node_timeout_reruns_jobs_once_elsewhere(
        split_cluster: LiveCluster, net: Net) -> None:
    live = split_cluster
    # `lingering` is still running behind the partition when it heals; `finished` ends there
    # with success while cut off. Both must count only their rerun on HOST.
    lingering, finished = _start(live, [0, 0])
    stale_pids = {job_id: _pid(live, job_id, 0) for job_id in (lingering, finished)}
    live.gq("admin", "drain", CUT, "--reason", "maintenance", check=True)
    live.gq("admin", "resume", HOST, check=True)
    net.cut()
    try:
        wait_for(lambda: _node(live, CUT)["state"] == "DOWN", f"{CUT} to be DOWN",
                 timeout=NODE_TIMEOUT_S * 4)
        assert "drained: maintenance" in _node(live, CUT)["reason"]
        for job_id in (lingering, finished):
            _pid(live, job_id, 1)
            job = live.wait_state(job_id, "RUNNING")
            assert (job["restart_count"], job["node_list"]) == (1, [HOST])
        _go(live, finished, 0)
        wait_for(lambda: live.run_ended(CUT, finished), "the stale run to succeed unseen")
        for job_id in (lingering, finished):
            _go(live, job_id, 1)
            assert live.wait_state(job_id, "COMPLETED")["node_list"] == [HOST]
    finally:
        net.heal()
    node = wait_for(lambda: (n := _node(live, CUT))["state"] != "DOWN" and n,
                    f"{CUT} to come back")
    assert (node["state"], node["reason"]) == ("DRAIN", "maintenance"), "the drain was lost"
    wait_for(lambda: not psutil.pid_exists(stale_pids[lingering]) or
             psutil.Process(stale_pids[lingering]).status() == psutil.STATUS_ZOMBIE,
             "the stale copy to be killed once the node is reachable")
    wait_for(lambda: live.settled(CUT), "the stale runs' reports to be delivered")
    assert f"ignoring stale finished report for job {finished} run 0" in live.log("gqd")
    for job_id in (lingering, finished):
        job = live.show(job_id)
        assert (job["state"], job["exit_code"], job["restart_count"], job["node_list"]) == \
            ("COMPLETED", 0, 1, [HOST])
        assert _runs(live, job_id) == f"0 {CUT}\n1 {HOST}\n"
