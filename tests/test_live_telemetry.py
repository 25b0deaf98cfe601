"""Telemetry in placement on live daemons: gqd and a gqnode with two 64G fake GPUs whose readings
the test injects (gq/node/gpus.py's TELEMETRY_FILE) while it runs."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gq.node.gpus import TELEMETRY_FILE
from tests.conftest import LiveCluster, prepare, running, wait_for

NODE = "node1"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCluster]:
    cluster = prepare(tmp_path)

    def change(cfg: Any) -> None:
        cfg.head.telemetry_stale_s = 6.0  # three heartbeats
        cfg.head.node_timeout_s = 120.0  # a stopped gqnode stays UP while its telemetry ages
        cfg.node.max_gpu_temp_c = 85.0
    cluster.configure(change)
    with running(cluster, nodes=1, fake_gpus="2xh100:64G") as up:
        yield up


def _inject(live: LiveCluster, text: str) -> None:
    path = live.layout.node_dir(NODE) / TELEMETRY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)  # whole, never half-written when gqnode reads it


def _gpu(live: LiveCluster, index: int) -> dict[str, Any]:
    (node,) = live.nodes()
    return node["gpus"][index]


def _reason(live: LiveCluster, job_id: int, want: str) -> None:
    wait_for(lambda: live.show(job_id)["reason"] == want,
             f"job {job_id}'s reason to be {want!r} (it is {live.show(job_id)['reason']!r})\n"
             + live.log_tails("gqd", NODE))


def test_vram_held_outside_gq_keeps_a_job_off_that_gpu(live: LiveCluster) -> None:
    _inject(live, "0 used=30G\n")  # a stray process holds 30G of GPU 0's 64G
    wait_for(lambda: _gpu(live, 0)["skip"] == "30G used outside gq, 34G free",
             "gq nodes to show GPU 0's VRAM held outside gq")
    listing = live.gq("nodes", check=True).stdout
    assert "30G used outside gq, 34G free" in listing, listing

    first = live.submit("--gpu-mem", "40G", "--wrap", "sleep 300")
    assert live.wait_state(first, "RUNNING")["gpu_ids"] == {NODE: [1]}
    # A small job may still have GPU 0: 34G free covers it.
    small = live.submit("--gpu-mem", "20G", "--wrap", "sleep 300")
    assert live.wait_state(small, "RUNNING")["gpu_ids"] == {NODE: [0]}
    live.gq("cancel", str(small), check=True)
    live.wait_state(small, "CANCELLED")

    second = live.submit("--gpu-mem", "40G", "--wrap", "sleep 300")
    _reason(live, second, "Resources (telemetry skips node1:0 VRAM held outside gq)")
    queue = live.gq("queue", check=True).stdout
    assert "telemetry skips node1:0" in queue, queue
    assert live.show(second)["state"] == "PENDING"

    # The stray process ends: the next heartbeat's readings free GPU 0, and the job starts there.
    _inject(live, "")
    assert live.wait_state(second, "RUNNING")["gpu_ids"] == {NODE: [0]}
    live.gq("cancel", str(first), str(second), check=True)


def test_a_hot_gpu_is_skipped_and_stale_telemetry_shown_as_such(live: LiveCluster) -> None:
    _inject(live, "1 temp=91\n")
    wait_for(lambda: _gpu(live, 1)["skip"] == "too hot: 91C over 85C, no new jobs",
             "gq nodes to show GPU 1 too hot")
    listing = live.gq("nodes", check=True).stdout
    assert any(line.split()[2] == "1" and "too hot: 91C" in line
               for line in listing.splitlines()[1:]), listing

    one = live.submit("--wrap", "sleep 300")
    assert live.wait_state(one, "RUNNING")["gpu_ids"] == {NODE: [0]}
    pair = live.submit("-g", "2", "--wrap", "sleep 300")
    _reason(live, pair, "Resources (telemetry skips node1:1 too hot)")
    live.gq("cancel", str(one), check=True)
    live.wait_state(one, "CANCELLED")
    job = live.show(pair)
    assert job["state"] == "PENDING" and "node1:1 too hot" in job["reason"], job

    # gqnode stops sampling (stopped): its telemetry goes stale, shown so, and placement falls
    # back to the GPUs' type and VRAM: the pair starts once it is stale, with nothing else new.
    pid = live.node_pid(NODE)
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: (n := live.nodes()[0])["telemetry_stale"]
                 and n["gpus"][1]["skip"] == "telemetry stale", "gq nodes to show stale telemetry")
        assert live.nodes()[0]["state"] == "UP"
        assert "telemetry stale" in live.gq("nodes", check=True).stdout
        assert live.wait_state(pair, "RUNNING")["gpu_ids"] == {NODE: [0, 1]}
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: not live.nodes()[0]["telemetry_stale"], "fresh telemetry again")
    live.gq("cancel", str(pair), check=True)
