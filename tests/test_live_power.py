"""Power saving with a fake cloud (issue 20, Done when 3): `[power] nodes` declared POWERED_DOWN,
a resume program that starts real gqnode processes for the nodes it is given (recording its
arguments and the pids) and a suspend program that stops them again."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gq import keys
from gq.cluster import metrics_url, write_config
from gq.hostlist import expand
from tests.conftest import LiveCluster, prepare, running, wait_for
from tests.test_metrics import scrape_until, value

RESUME = r'''
import json, os, subprocess, sys
here = os.path.dirname(os.path.abspath(__file__))
cloud = json.load(open(os.path.join(here, "cloud.json")))
with open(os.path.join(here, "resumed.log"), "a") as f:
    f.write(sys.argv[1] + "\n")
from gq.hostlist import expand
for name in expand(sys.argv[1]):
    if name not in cloud["shapes"]:
        continue  # a node that never comes
    log = open(os.path.join(here, name + ".log"), "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gq.node.main", "--config", cloud["config"], "--name", name,
         "--addr", "127.0.0.1", *cloud["shapes"][name]],
        stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    with open(os.path.join(here, name + ".pid"), "w") as f:
        f.write(str(proc.pid))
'''

SUSPEND = r'''
import os, signal, sys, time
import psutil
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "suspended.log"), "a") as f:
    f.write(sys.argv[1] + "\n")
from gq.hostlist import expand
for name in expand(sys.argv[1]):
    path = os.path.join(here, name + ".pid")
    if not os.path.exists(path):
        continue
    pid = int(open(path).read())
    try:
        os.kill(pid, signal.SIGTERM)
        proc = psutil.Process(pid)
        deadline = time.monotonic() + 20
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
            if time.monotonic() > deadline:
                proc.kill()
            time.sleep(0.05)
    except psutil.NoSuchProcess:
        pass
    except ProcessLookupError:
        pass
    os.unlink(path)
'''


def _cloud(live: LiveCluster, shapes: dict[str, list[str]], power: str) -> Path:
    """The fake cloud's programs beside the cluster; `shapes`: the nodes the resume program
    really starts (name -> gqnode's options: its image); `power`: the rest of the [power]
    table."""
    cloud = live.root / "cloud"
    cloud.mkdir()
    (cloud / "resume.py").write_text(RESUME)
    (cloud / "suspend.py").write_text(SUSPEND)
    (cloud / "cloud.json").write_text(json.dumps({"config": str(live.config_path),
                                                  "shapes": shapes}))
    cfg = write_config(live.layout)
    keys.ensure(Path(cfg.auth.key_dir), [keys.HEAD, *shapes])  # the cloud image's keys
    with open(live.config_path, "a") as f:
        f.write(textwrap.dedent(f"""
            [power]
            resume_program = "{sys.executable} {cloud / 'resume.py'}"
            suspend_program = "{sys.executable} {cloud / 'suspend.py'}"
            """) + textwrap.dedent(power))
    return cloud


def _power_off(cloud: Path) -> None:
    """The fake cloud stops what it still runs (a failed test's nodes): as its suspend program
    does, before the cluster's teardown looks for leftovers."""
    names = [p.stem for p in cloud.glob("*.pid")]
    if names:
        subprocess.run([sys.executable, str(cloud / "suspend.py"), ",".join(names)], timeout=60,
                       check=False)


@contextlib.contextmanager
def _up(live: LiveCluster, cloud: Path) -> Iterator[None]:
    """The cluster (gqd and node1, one fake GPU) up, the fake cloud's nodes stopped after."""
    with running(live, nodes=1, fake_gpus="1"):
        try:
            yield
        finally:
            _power_off(cloud)


def _calls(cloud: Path, log: str) -> list[list[str]]:
    path = cloud / log
    return [expand(line) for line in path.read_text().split()] if path.exists() else []


def _states(live: LiveCluster) -> dict[str, dict[str, Any]]:
    return {n["name"]: n for n in live.nodes()}


def test_a_burst_resumes_just_the_fitting_nodes_and_idle_ones_are_suspended(
        tmp_path: Path) -> None:
    live = prepare(tmp_path)
    big, small = ["--fake-gpus", "4xa100:80G"], ["--fake-gpus", "2xl4:24G", "--features",
                                                 "inference"]
    cloud = _cloud(live, {"big1": big, "big2": big, "small1": small, "small2": small}, """
        suspend_time = 2
        resume_timeout = 45
        nodes = ["big[1-2]:gpus=4xa100:80G", "small[1-2]:gpus=2xl4:24G,features=inference"]
        """)
    with _up(live, cloud):
        nodes = _states(live)
        assert {n: nodes[n]["state"] for n in ("big1", "big2", "small1", "small2")} == \
            dict.fromkeys(("big1", "big2", "small1", "small2"), "POWERED_DOWN")
        assert [g["type"] for g in nodes["big1"]["gpus"]] == ["a100"] * 4  # known before it came
        assert nodes["small2"]["features"] == ["inference"]
        assert "POWERED_DOWN" in live.gq("nodes", check=True).stdout
        # A burst (held, then released at once): two 2-GPU A100 jobs fit one big node, the L4
        # job one small node; nothing fits node1's one fake GPU.
        jobs = [live.submit("--hold", *args, "--wrap", "sleep 3") for args in (
            ("-g", "2", "--gpu-type", "a100"), ("-g", "2", "--gpu-type", "a100"),
            ("-g", "1", "--gpu-type", "l4", "--gpu-mem", "20G", "--constraint", "inference"))]
        live.gq("release", *map(str, jobs), check=True)
        shown = [live.wait_state(j, "RUNNING", "COMPLETED") for j in jobs]
        assert [s["node_list"] for s in shown] == [["big1"], ["big1"], ["small1"]], \
            live.log_tails("gqd")
        resumed = [n for call in _calls(cloud, "resumed.log") for n in call]
        assert sorted(resumed) == ["big1", "small1"], resumed  # each once, and no other
        nodes = _states(live)
        assert nodes["big2"]["state"] == nodes["small2"]["state"] == "POWERED_DOWN"
        for j in jobs:
            assert live.wait_state(j, "COMPLETED")["exit_code"] == 0
        # Idle for suspend_time: the suspend program stops them, and they are powered down.
        wait_for(lambda: all(_states(live)[n]["state"] == "POWERED_DOWN"
                             for n in ("big1", "small1")), "the idle nodes to be suspended")
        suspended = sorted(n for call in _calls(cloud, "suspended.log") for n in call)
        assert suspended == ["big1", "small1"], suspended
        assert not list(cloud.glob("*.pid"))  # the suspend program stopped their gqnodes
        # Demand again: a stopped node is resumed again, a second time.
        again = live.submit("-g", "4", "--gpu-type", "a100", "--wrap", "true")
        assert live.wait_state(again, "COMPLETED")["node_list"] in (["big1"], ["big2"])
        assert len(_calls(cloud, "resumed.log")) >= 2


def test_a_node_that_never_joins_is_down_after_resume_timeout(tmp_path: Path) -> None:
    live = prepare(tmp_path)
    # The resume program starts nothing for big1 or big2: they never join.
    cloud = _cloud(live, {}, """
        resume_timeout = 8
        nodes = ["big[1-2]:gpus=4xa100:80G", "small1:gpus=2xl4:24G"]
        """)
    with _up(live, cloud):
        url = metrics_url(live.config())
        assert url is not None
        job = live.submit("-g", "4", "--gpu-type", "a100", "--gpu-mem", "40G", "--wrap", "true")
        # The figure an autoscaler scales on, while the job waits; the nodes by power state.
        samples = scrape_until(url, lambda s: value(s, "gq_pending_gpus", gpu_type="a100",
                                                    vram_class="40G") == 4
                               and value(s, "gq_nodes", state="POWERING_UP") == 1
                               and value(s, "gq_nodes", state="POWERED_DOWN") == 2,
                               "the pending A100 demand, big1 powering up")
        assert value(samples, "gq_nodes", state="DOWN") == 0
        # The job says what it waits for: in gq show, gq queue and squeue alike.
        wait_for(lambda: live.show(job)["reason"] == "PoweringUp (big1)",
                 "the job's reason to name the node powering up for it")
        assert "PoweringUp (big1)" in live.gq("queue", check=True).stdout
        from gq.slurm import shims
        squeue = shims.ensure(tmp_path / "slurm-bin") / "squeue"
        out = subprocess.run([str(squeue), "-h", "-j", str(job), "-o", "%T %r"], env=live.env,
                             capture_output=True, text=True, timeout=60, check=True).stdout
        assert out.split(None, 1) == ["PENDING", "PoweringUp (big1)\n"], out
        down = wait_for(lambda: (n := _states(live)["big1"])["state"] == "DOWN" and n,
                        "big1 to be DOWN after its resume timed out")
        assert down["reason"] == "resume timed out after 8s"
        # Its claim is released: the job (still pending) resumes big2, and only then.
        assert live.show(job)["state"] == "PENDING"
        wait_for(lambda: [n for c in _calls(cloud, "resumed.log") for n in c] == ["big1", "big2"],
                 "big2 to be resumed for the job")
        wait_for(lambda: live.show(job)["reason"] == "PoweringUp (big2)",
                 "the job's reason to name big2 now")
        assert _states(live)["small1"]["state"] == "POWERED_DOWN"  # its L4s fit no A100 job
        # gqd restarts: the power states are in the store.
        os.kill(live.head_pid(), signal.SIGTERM)
        wait_for(lambda: live.head_pid() is None, "gqd to stop")
        assert live.gq("up").returncode == 0
        nodes = _states(live)
        assert nodes["small1"]["state"] == "POWERED_DOWN"
        assert nodes["big2"]["state"] in ("POWERING_UP", "DOWN")
        live.gq("cancel", str(job), check=True)
