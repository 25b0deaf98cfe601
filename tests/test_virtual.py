"""`gqnode --virtual N`: N node identities in one process, each a node of its own to a real gqd."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from gq import keys
from gq.node.virtual import names
from tests.conftest import LiveCluster, prepare, running, wait_for

#: Short enough that a killed node goes DOWN within a few seconds.
NODE_TIMEOUT_S, HEARTBEAT_S = 1.5, 0.3


@contextlib.contextmanager
def virtual_gqnode(live: LiveCluster, base: str, count: int, gpus: str
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """One `gqnode --virtual` process on the cluster, its identities' keys made first."""
    cfg = live.config()
    keys.ensure(Path(cfg.auth.key_dir), names(base, count))
    log = open(live.layout.log(base), "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "gq.node.main", "--config",
                             str(live.config_path), "--name", base, "--virtual", str(count),
                             "--fake-gpus", gpus, "--addr", "127.0.0.1"],
                            env=live.env, stdout=log, stderr=log)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_three_virtual_nodes_register_run_jobs_and_go_down_together(tmp_path: Path) -> None:
    live = prepare(tmp_path)

    def quick(cfg):  # noqa: ANN001, ANN202
        cfg.head.node_timeout_s, cfg.node.heartbeat_s = NODE_TIMEOUT_S, HEARTBEAT_S
    live.configure(quick)
    expected = names("vn", 3)
    assert expected == ["vn-v001", "vn-v002", "vn-v003"]
    # `gq up` wants a node of its own; with one GPU, no 2-GPU job below can land on it.
    with running(live, nodes=1, fake_gpus="1"), virtual_gqnode(live, "vn", 3, "2") as proc:
        def states() -> dict[str, str]:
            return {n["name"]: n["state"] for n in live.nodes() if n["name"] != "node1"}
        wait_for(lambda: states() == dict.fromkeys(expected, "UP"),
                 "three virtual nodes to register", timeout=30)
        listing = live.gq("nodes", check=True).stdout
        assert all(name in listing for name in expected), listing
        assert {len(n["gpus"]) for n in live.nodes() if n["name"] in expected} == {2}

        # Each job takes a whole node and waits for the others to start, so the three can
        # only run one on each.
        script = ('#!/bin/sh\necho "$GQ_NODELIST $CUDA_VISIBLE_DEVICES"\n'
                  'while [ ! -e go ]; do sleep 0.05; done\n')
        with live.client() as c:
            ids = c.submit([live.spec(script, gpus=2)] * 3)
            wait_for(lambda: all(live.show(i)["state"] == "RUNNING" for i in ids),
                     "the three jobs to run at once")
            (live.work / "go").touch()
            done = c.wait(ids, timeout_s=30)
        assert [j["state"] for j in done] == ["COMPLETED"] * 3, done
        ran_on = {}
        for job_id in ids:
            out = (live.work / f"gq-{job_id}.out").read_text().split()
            assert out[1:] == ["0,1"], out
            ran_on[job_id] = out[0]
            assert list(live.show(job_id)["gpu_ids"]) == [out[0]]
        assert sorted(ran_on.values()) == expected
        for name in expected:  # each identity keeps its own state, under the process's
            assert (live.layout.node_dir("vn") / name / "outbox").is_dir()

        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        wait_for(lambda: states() == dict.fromkeys(expected, "DOWN"),
                 "all three nodes to go DOWN", timeout=30)


def test_virtual_needs_fake_gpus(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "gq.node.main", "--virtual", "4",
                           "--state-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 2 and "--virtual" in proc.stderr and "--fake-gpus" in proc.stderr
