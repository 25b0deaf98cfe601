"""Model affinity on live daemons (issue 20, Done when 1): gqd and one gqnode with 4 fake GPUs;
jobs of two cache keys go back to the GPU where their key ran before and see GQ_CACHE_WARM, and
a job with --cold-wait waits for its warm GPU, or takes a cold one once its wait is over."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gq.sched.affinity import WAITING_WARM
from tests.conftest import LiveCluster, prepare, running, wait_for

NODE = "node1"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveCluster]:
    cluster = prepare(tmp_path)
    models = tmp_path / "models"
    (models / "M").mkdir(parents=True)  # weights on local disk: M is warm on every GPU

    def change(cfg: Any) -> None:
        cfg.node.cache_dirs = [str(models)]
    cluster.configure(change)
    with running(cluster, nodes=1, fake_gpus="4") as up:
        yield up


def _keys(live: LiveCluster) -> dict[int, list[str]]:
    (node,) = live.nodes()
    return {g["index"]: g["cache_keys"] for g in node["gpus"]}


def _warm_on(live: LiveCluster, gpu: int, key: str) -> None:
    """Wait until gqd knows `key` is warm on `gpu` (a heartbeat after the run's launch)."""
    wait_for(lambda: key in _keys(live)[gpu], f"{key} to be warm on GPU {gpu}: {_keys(live)}")


def _free(live: LiveCluster, gpu: int) -> None:
    wait_for(lambda: live.nodes()[0]["gpus"][gpu]["job"] is None, f"GPU {gpu} to be free")


def _run(live: LiveCluster, key: str, *more: str, script: str = "true") -> tuple[int, Path]:
    out = live.work / f"out-{key}-{len(list(live.work.iterdir()))}"
    job = live.submit("--cache-key", key, "-o", str(out), *more, "--wrap",
                      f"echo warm=$GQ_CACHE_WARM; {script}")
    return job, out


def _ended(live: LiveCluster, job: int, out: Path) -> tuple[list[int], str]:
    shown = live.wait_state(job, "COMPLETED")
    return shown["gpu_ids"][NODE], out.read_text().strip()


def _reason(live: LiveCluster, job: int, want: str) -> dict[str, Any]:
    wait_for(lambda: live.show(job)["reason"] == want,
             f"job {job}'s reason to be {want!r}: {live.show(job)}\n" + live.log_tails("gqd"))
    return live.show(job)


def test_jobs_go_back_to_the_gpu_where_their_key_is_warm(live: LiveCluster) -> None:
    holder = live.submit("--wrap", "sleep 300")  # GPU 0, no key
    assert live.wait_state(holder, "RUNNING")["gpu_ids"] == {NODE: [0]}
    # (--cold-wait 0: a keyed job otherwise waits [scheduler] cold_wait_s for a warm GPU.)
    a1, out = _run(live, "A", "--cold-wait", "0")
    assert _ended(live, a1, out) == ([1], "warm=0")  # the first of its key: cold
    _warm_on(live, 1, "A")
    live.gq("cancel", str(holder), check=True)
    _free(live, 0)
    # GPU 0 is free and lowest, but A is warm on GPU 1.
    a2, out = _run(live, "A")
    assert _ended(live, a2, out) == ([1], "warm=1")
    b1, out = _run(live, "B", "--cold-wait", "0")  # B is warm nowhere: the plain rule, GPU 0
    assert _ended(live, b1, out) == ([0], "warm=0")
    _warm_on(live, 0, "B")
    # Both GPUs free now: each key's job goes to its own warm GPU.
    a3, out_a = _run(live, "A", script="sleep 2")
    b2, out_b = _run(live, "B", script="sleep 2")
    assert _ended(live, a3, out_a) == ([1], "warm=1")
    assert _ended(live, b2, out_b) == ([0], "warm=1")
    assert live.show(b2)["cache_key"] == "B"
    assert "CacheKey=B" in live.gq("show", str(b2), check=True).stdout
    keys = _keys(live)
    assert keys == {0: ["B", "M"], 1: ["A", "M"], 2: ["M"], 3: ["M"]}, keys
    # A key from [node] cache_dirs is warm from the first run on.
    m1, out = _run(live, "M")
    assert _ended(live, m1, out)[1] == "warm=1"


def test_cold_wait_waits_for_the_warm_gpu_or_goes_cold_when_it_runs_out(
        live: LiveCluster) -> None:
    a1, out = _run(live, "A", "--cold-wait", "0")
    assert _ended(live, a1, out) == ([0], "warm=0")
    _warm_on(live, 0, "A")
    busy, _ = _run(live, "A", script="sleep 300")  # holds the warm GPU
    assert live.wait_state(busy, "RUNNING")["gpu_ids"] == {NODE: [0]}
    patient, out_patient = _run(live, "A", "--cold-wait", "10m", script="sleep 1")
    hasty, out_hasty = _run(live, "A", "--cold-wait", "6s", script="sleep 300")
    # No --cold-wait: the default, [scheduler] cold_wait_s (15 s).
    default, out_default = _run(live, "B", script="sleep 300")
    # Three cold GPUs are free, yet all three wait (B is warm nowhere, and waits all the same).
    assert _reason(live, patient, WAITING_WARM)["state"] == "PENDING"
    assert _reason(live, hasty, WAITING_WARM)["state"] == "PENDING"
    assert _reason(live, default, WAITING_WARM)["state"] == "PENDING"
    assert live.show(patient)["cold_wait_s"] == 600
    shown = live.gq("show", str(patient), check=True).stdout
    assert "ColdWait=00:10:00" in shown and f"Reason={WAITING_WARM}" in shown, shown
    # The short wait runs out: that job takes a cold GPU (the lowest free one).
    shown = live.wait_state(hasty, "RUNNING")
    assert shown["gpu_ids"] == {NODE: [1]}
    wait_for(lambda: out_hasty.exists() and out_hasty.read_text().strip() == "warm=0",
             "the cold job's GQ_CACHE_WARM=0")
    # So does the default's, later: the next cold GPU.
    assert live.wait_state(default, "RUNNING")["gpu_ids"] == {NODE: [2]}
    wait_for(lambda: out_default.exists() and out_default.read_text().strip() == "warm=0",
             "the default-wait job's GQ_CACHE_WARM=0")
    # The long one still waits, though GPU 3 is free; once GPU 0 is, it goes warm.
    assert live.show(patient)["state"] == "PENDING"
    assert live.show(patient)["reason"] == WAITING_WARM
    live.gq("cancel", str(busy), check=True)
    assert _ended(live, patient, out_patient) == ([0], "warm=1")
    live.gq("cancel", str(hasty), str(default), check=True)
