"""Checkpoints on live daemons: a free job that runs `gq checkpoint` and one that touches the
marker in $GQ_CHECKPOINT_DIR are preempted by a pro job; `gq show` has their last_checkpoint,
and `gq report` counts as waste only the GPU time since each one's checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gq import defaults
from gq.cli.accounting import gpu_hours
from gq.errors import ExitStatus
from tests.conftest import LiveCluster, prepare, running, wait_for

#: Each free job works this long before it checkpoints: the GPU time a preemption must not
#: count as waste.
WORK_S = 8
GQ = f"{sys.executable} -m gq.cli.main"


@pytest.fixture
def ckpt_cluster(tmp_path: Path) -> Iterator[LiveCluster]:
    """Two nodes of 8 fake GPUs; no preemption exemption; checkpoint dirs under the test's."""
    live = prepare(tmp_path)
    root = tmp_path / "ckpt"

    def change(cfg):  # noqa: ANN001, ANN202
        cfg.head.checkpoint_root = str(root)

    live.configure(change)
    with running(live) as up:
        up.reconfigure("[scheduler]\npreempt_exempt_s = 0")
        yield up


def _script(work: Path, name: str, how: str) -> Path:
    """A free job: its first run works WORK_S, checkpoints (`how`), notes the times around it,
    then works on; a later run (after the preemption) ends at once."""
    path = work / f"{name}.sh"
    path.write_text(f"""#!/bin/bash
[ "$GQ_RESTART_COUNT" -ge 1 ] && exit 0
sleep {WORK_S}
date +%s.%N > {work}/{name}.before
{how}
date +%s.%N > {work}/{name}.after
exec sleep 600
""")
    return path


def _time(path: Path) -> float:
    return float(path.read_text())


def test_preempted_jobs_waste_only_the_work_since_their_checkpoint(ckpt_cluster: LiveCluster
                                                                   ) -> None:
    cluster, work = ckpt_cluster, ckpt_cluster.work
    scripts = {"cmd": _script(work, "cmd", f"{GQ} checkpoint > {work}/cmd.out 2>&1"),
               "marker": _script(work, "marker",
                                 f'touch "$GQ_CHECKPOINT_DIR/{defaults.CHECKPOINT_MARKER}"')}
    jobs = {name: cluster.submit("-q", "free", "-g", "8", "-t", "1h", str(path))
            for name, path in scripts.items()}
    for job_id in jobs.values():
        cluster.wait_state(job_id, "RUNNING")
    wait_for(lambda: all((work / f"{n}.after").exists() for n in jobs), "both to checkpoint",
             timeout=60)
    assert "checkpoint at" in (work / "cmd.out").read_text(), (work / "cmd.out").read_text()
    # gq show has each one's checkpoint (the marker's comes with a heartbeat).
    wait_for(lambda: all(cluster.show(j)["last_checkpoint"] for j in jobs.values()),
             "gq show to have both checkpoints")
    shown = cluster.gq("show", str(jobs["marker"]), check=True).stdout
    assert "LastCheckpoint=20" in shown, shown
    before = {n: _time(work / f"{n}.before") for n in jobs}
    after = {n: _time(work / f"{n}.after") for n in jobs}
    # Some work after the checkpoints, which the preemption does throw away.
    wait_for(lambda: time.time() > max(after.values()) + 3, "work after the checkpoints")
    submitted = time.time()
    pro = cluster.submit("-q", "pro", "-N", "2", "-g", "8", "-t", "10m", "--wrap", "true")
    cluster.wait_state(pro, "RUNNING", "COMPLETED", timeout=60)
    preempted = time.time()
    for job_id in jobs.values():
        final = cluster.wait_state(job_id, "COMPLETED", timeout=60)
        assert final["restart_count"] == 1, final
        # The job's last checkpoint stays shown after its next run ended.
        assert final["last_checkpoint"] is not None
    report = json.loads(cluster.gq("report", "--json", check=True).stdout)
    lost = report["wasted_by_cause"]["preempted"] * 3600  # GPU-seconds
    # Each lost 8 GPUs x (its end - its checkpoint): its end came between the pro job's submit
    # and its start, its checkpoint between `before` and `after`.
    low = sum(8 * (submitted - after[n]) for n in jobs)
    high = sum(8 * (preempted - before[n]) for n in jobs)
    print(f"lost {lost:.1f} GPU-s, bounds [{low:.1f}, {high:.1f}]")  # shown with -s
    assert low - 1 <= lost <= high + 1, (low, lost, high, cluster.log_tails("gqd"))
    # Counted from the start, the loss would hold the WORK_S before each checkpoint too.
    assert lost < sum(8 * (submitted - (before[n] - WORK_S)) for n in jobs) - 1
    text = cluster.gq("report", check=True).stdout
    assert f"preempted {gpu_hours(lost / 3600)}" in text, text


def test_gq_checkpoint_outside_a_job_is_a_usage_error() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GQ_")}
    proc = subprocess.run([sys.executable, "-m", "gq.cli.main", "checkpoint"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == ExitStatus.USAGE == 2, proc
    assert "not inside a job" in proc.stderr
