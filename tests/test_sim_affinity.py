"""Model affinity in `gq sim` (gq/sim/affinity.py): cold starts counted and charged to the run,
warm keys given to the scheduler, and the synthetic inference workload's figures."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from gq.sched import plan
from gq.sim import affinity
from gq.sim.engine import Cluster, simulate
from gq.sim.metrics import summarize
from gq.sim.replay import NO_AFFINITY, run
from gq.sim.trace import TraceJob


def _job(i: int, t: float, key: str | None, runtime: float = 10.0, **kw) -> TraceJob:
    # No cold wait unless a test gives one (a keyed job's default, [scheduler] cold_wait_s,
    # has its own test).
    kw.setdefault("cold_wait_s", 0.0)
    return TraceJob(id=i, name=str(i), submit_time=t, runtime_s=runtime, time_limit_s=100,
                    cache_key=key, **kw)


def test_a_cold_start_is_counted_and_adds_its_cost_to_the_run() -> None:
    jobs = [_job(1, 0.0, "A"), _job(2, 50.0, "A"), _job(3, 100.0, "B"), _job(4, 150.0, None)]
    loads = affinity.cold_starts(jobs, 30.0, {"B": 5.0})
    result = simulate(jobs, Cluster(nodes=1, gpus_per_node=1), plan, loads=loads)
    ends = {o.job.id: o.end for o in result.outcomes}
    # A cold (10 + 30 s), A warm, B cold at its own cost, the keyless job never loads.
    assert ends == {1: 40.0, 2: 60.0, 3: 115.0, 4: 160.0}
    m = summarize(result)
    assert (m.cold_starts, m.warm_starts) == (2, 1)
    assert m.load_gpu_h == (30.0 + 5.0) / 3600.0


def test_the_scheduler_is_told_the_warm_gpus_unless_blind() -> None:
    # Two GPUs; A ran on GPU 1 (GPU 0 was busy). The next A goes back there with affinity,
    # to the lowest free GPU (0) without.
    jobs = [_job(1, 0.0, None, runtime=20.0), _job(2, 1.0, "A"), _job(3, 100.0, "A")]
    cluster = Cluster(nodes=1, gpus_per_node=2)
    cold = (30.0, {}, 1)
    with_affinity = summarize(run(jobs, cluster, "gq", cold=cold))
    without = summarize(run(jobs, cluster, NO_AFFINITY, cold=cold))
    assert (with_affinity.cold_starts, with_affinity.warm_starts) == (1, 1)
    assert (without.cold_starts, without.warm_starts) == (2, 0)


def test_a_cold_wait_waits_for_the_warm_gpu() -> None:
    # A is warm on GPU 0, which job 2 (no key) holds until 70; job 3 of key A arrives at 50
    # with GPU 1 free: with a 60 s cold wait it waits for GPU 0 (starts at 70, warm).
    jobs = [_job(1, 0.0, "A"), _job(2, 40.0, None, runtime=30.0),
            _job(3, 50.0, "A", cold_wait_s=60.0)]
    result = run(jobs, Cluster(nodes=1, gpus_per_node=2), "gq", cold=(30.0, {}, 1))
    third = next(o for o in result.outcomes if o.job.id == 3)
    assert third.start == 70.0 and third.end == 80.0
    short = [*jobs[:2], dataclasses.replace(jobs[2], cold_wait_s=5.0)]
    result = run(short, Cluster(nodes=1, gpus_per_node=2), "gq", cold=(30.0, {}, 1))
    third = next(o for o in result.outcomes if o.job.id == 3)
    assert third.start == 55.0 and third.end == 95.0  # its wait ran out: cold on GPU 1


def test_a_keyed_job_without_a_cold_wait_waits_the_default() -> None:
    # As above, but job 3 gives no --cold-wait: it waits the policy's default (15 s) for GPU 0,
    # which frees only at 70, then starts cold on GPU 1; with --cold-wait 0 it starts at once.
    jobs = [_job(1, 0.0, "A"), _job(2, 40.0, None, runtime=30.0),
            _job(3, 50.0, "A", cold_wait_s=None)]
    cluster, cold = Cluster(nodes=1, gpus_per_node=2), (30.0, {}, 1)
    third = next(o for o in run(jobs, cluster, "gq", cold=cold).outcomes if o.job.id == 3)
    assert (third.start, third.end) == (65.0, 105.0)
    now = [*jobs[:2], dataclasses.replace(jobs[2], cold_wait_s=0.0)]
    third = next(o for o in run(now, cluster, "gq", cold=cold).outcomes if o.job.id == 3)
    assert (third.start, third.end) == (50.0, 90.0)
    # Without the default (gq-placeonly, as before), at once too.
    third = next(o for o in run(jobs, cluster, "gq-placeonly", cold=cold).outcomes
                 if o.job.id == 3)
    assert third.start == 50.0


def test_jobs_without_keys_replay_exactly_as_without_a_cold_start_model() -> None:
    jobs = [TraceJob(id=i, name=str(i), submit_time=i * 7.0, runtime_s=30.0 + i % 5 * 40,
                     time_limit_s=400, gpus=1 + i % 3) for i in range(1, 200)]
    cluster = Cluster(nodes=2, gpus_per_node=4)
    plain = run(jobs, cluster, "gq")
    modelled = run(jobs, cluster, "gq", cold=(30.0, {}, 1))
    assert [(o.start, o.end, o.nodes) for o in plain.outcomes] \
        == [(o.start, o.end, o.nodes) for o in modelled.outcomes]
    assert summarize(modelled).cold_starts == 0


@pytest.mark.parametrize("load", [0.5, 0.7, 0.85])
def test_the_synthetic_inference_workload_meets_the_target(load: float) -> None:
    """Issue 20's target on the documented workload (docs/SCHEDULING.md) with gq's defaults
    (no per-job flag beyond the key): at least 50% fewer cold starts at no more than 10%
    higher p99 wait, at each load. Placement alone (gq-placeonly) misses it at 0.7."""
    jobs = affinity.inference(seed=1, jobs=1500, gpus=32, load=load)
    assert len({j.cache_key for j in jobs}) == 8
    assert all(5.0 <= j.runtime_s <= 120.0 for j in jobs)
    cluster, cold = Cluster(nodes=4, gpus_per_node=8), (30.0, {}, 1)
    base = summarize(run(jobs, cluster, NO_AFFINITY, cold=cold))
    warm = summarize(run(jobs, cluster, "gq", cold=cold))
    assert warm.cold_starts <= 0.5 * base.cold_starts, (warm.cold_starts, base.cold_starts)
    assert warm.wait.p99 <= 1.1 * base.wait.p99, (warm.wait.p99, base.wait.p99)
    assert warm.load_gpu_h < base.load_gpu_h
    if load == 0.7:
        placed = summarize(run(jobs, cluster, "gq-placeonly", cold=cold))
        assert placed.cold_starts > 0.5 * base.cold_starts, (placed.cold_starts, base.cold_starts)


def test_gq_sim_synthetic_reports_cold_starts() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gq.cli.main", "sim", "--synthetic", "inference", "--nodes", "4",
         "--seed", "2", "--load", "0.3", "--cold-start", "20s", "--cold-start", "model-0=1m",
         "--policy", f"gq,{NO_AFFINITY}", "--json"], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = {r["policy"]: r for r in json.loads(proc.stdout)["results"]}
    gq, blind = results["gq"], results[NO_AFFINITY]
    assert gq["cold_starts"] + gq["warm_starts"] == gq["jobs"] == 3000
    assert gq["cold_starts"] < blind["cold_starts"]
    assert 0 < gq["load_gpu_h"] < blind["load_gpu_h"]
