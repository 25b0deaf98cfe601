"""`gq sim --autoscale` (gq/sim/autoscale.py): power saving replayed with gqd's own resume choice,
against the always-on cluster, on a workload with a 10x spike."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gq.sched import plan
from gq.sim import affinity
from gq.sim.autoscale import PowerModel, PoweredSimulator, always_on_node_s, spike
from gq.sim.engine import Cluster, SimInvariantError, Simulator
from gq.sim.metrics import summarize
from gq.sim.replay import gq_policy

CLUSTER = Cluster(nodes=4, gpus_per_node=2)


def _jobs() -> list:
    # A quiet inference service (a tenth of the GPUs busy) with ten times the arrivals for a
    # tenth of its span.
    return spike(affinity.inference(seed=1, jobs=300, gpus=8, load=0.1, cold_start_s=0), 10)


def _powered(power: PowerModel) -> PoweredSimulator:
    sim = PoweredSimulator(_jobs(), CLUSTER, plan, gq_policy(), power)
    sim.run()
    return sim


def test_a_spike_multiplies_the_arrivals_in_its_window_only() -> None:
    jobs = affinity.inference(seed=1, jobs=300, gpus=8, load=0.1, cold_start_s=0)
    first, last = jobs[0].submit_time, jobs[-1].submit_time
    begin, width = first + 0.4 * (last - first), 0.1 * (last - first)
    inside = sum(begin <= j.submit_time < begin + width for j in jobs)
    out = spike(jobs, 10)
    assert sum(begin <= j.submit_time < begin + width for j in out) == 10 * inside
    assert len(out) == len(jobs) + 9 * inside
    assert len({j.id for j in out}) == len(out)
    assert [j for j in out if not begin <= j.submit_time < begin + width] == \
        [j for j in jobs if not begin <= j.submit_time < begin + width]


def test_autoscaling_costs_delay_and_saves_node_hours_and_never_runs_on_a_node_off() -> None:
    base = Simulator(_jobs(), CLUSTER, plan, gq_policy()).run()
    sim = _powered(PowerModel(boot_s=60, suspend_time_s=60))
    result, counts = sim.result, sim.counts
    assert not result.unfinished and not base.unfinished
    assert counts.node_s < 0.6 * always_on_node_s(base)  # the quiet hours are off
    auto, always = summarize(result).wait, summarize(base).wait
    assert auto.avg > always.avg and auto.p99 > always.p99  # jobs wait for boots
    assert auto.p99 <= 60 + always.max + 30  # ... about one boot, not more
    assert counts.resumes == counts.suspends >= CLUSTER.nodes  # the spike resumed them all
    # A job runs only while each of its nodes is UP (booted, not yet suspended).
    for o in result.outcomes:
        assert o.start is not None and o.end is not None
        for node in o.nodes:
            assert any(a <= o.start and o.end <= b for a, b in counts.up_spans[node]), \
                (o.job.id, node, o.start, o.end, counts.up_spans[node])
    # A longer suspend_time keeps nodes on for the next arrivals: less delay, more node-hours.
    lazy = _powered(PowerModel(boot_s=60, suspend_time_s=600))
    assert lazy.counts.node_s > counts.node_s
    assert summarize(lazy.result).wait.avg < auto.avg


def test_with_every_node_always_on_the_replay_is_the_plain_one() -> None:
    base = Simulator(_jobs(), CLUSTER, plan, gq_policy()).run()
    sim = _powered(PowerModel(always_on=CLUSTER.nodes))
    assert [(o.job.id, o.start, o.nodes) for o in sim.result.outcomes] == \
        [(o.job.id, o.start, o.nodes) for o in base.outcomes]
    assert sim.counts.resumes == 0
    assert sim.counts.node_s == pytest.approx(always_on_node_s(base))


def test_the_resume_rate_holds_and_a_start_on_a_node_off_is_refused() -> None:
    sim = _powered(PowerModel(boot_s=30, suspend_time_s=60, resume_rate=1))
    times = sim.counts.resume_times
    assert times and all(b - a >= 60 - 1e-6 for a, b in zip(times, times[1:]))
    assert not sim.result.unfinished
    # The engine refuses what gqd never does: a start on a node that has not joined.
    off = PoweredSimulator(_jobs(), CLUSTER, plan, gq_policy(), PowerModel())
    job = off.arrivals[0]
    off._enqueue(job)
    from gq.sched.types import Start
    with pytest.raises(SimInvariantError, match="OFF"):
        off._start(Start(job_id=job.id, alloc={"n001": (0,)}), job.submit_time)


def test_gq_sim_autoscale_reports_delay_against_node_hours() -> None:
    # A spike that stays within the pool (load 0.05 x 10): the delay autoscaling adds is then the
    # boot time. In a pool the spike saturates, waits are set by queueing order (which the model
    # affinity's warm-first choice changes), and an autoscaled p99 can come out below always-on's.
    proc = subprocess.run(
        [sys.executable, "-m", "gq.cli.main", "sim", "--synthetic", "inference", "--nodes", "4",
         "--gpus-per-node", "2", "--load", "0.05", "--spike", "10", "--autoscale",
         "--boot-time", "1m", "--suspend-time", "60s,10m", "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    runs = {r["run"]: r for r in doc["runs"]}
    assert list(runs) == ["always-on", "autoscale suspend 60s", "autoscale suspend 600s"]
    always, quick = runs["always-on"], runs["autoscale suspend 60s"]
    assert quick["node_hours"] < runs["autoscale suspend 600s"]["node_hours"] \
        < always["node_hours"]
    assert quick["wait"]["p99"] > always["wait"]["p99"]
    assert doc["jobs"] > 3000 and all(r["unfinished"] == 0 for r in doc["runs"])


def test_gq_sim_autoscale_refuses_what_it_does_not_replay() -> None:
    for args, words in ((["--synthetic", "inference", "-n", "2", "--policy", "easy"],
                         "gq's policy only"),
                        (["x.csv", "--nodes-csv", "y.csv"], "not an inventory")):
        proc = subprocess.run([sys.executable, "-m", "gq.cli.main", "sim", *args, "--autoscale"],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
