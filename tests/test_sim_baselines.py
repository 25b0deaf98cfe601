"""The simulator's standard baselines (EASY, conservative, FIFO, first fit): their rules on
hand-built traces, their indexed queue, and agreement with the independent reference simulator
(../shared/refsim) job by job on random traces."""

from __future__ import annotations

import csv
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest

from gq.sim import trace as trace_mod
from gq.sim.baselines import BASELINES, conservative, easy, fifo, firstfit
from gq.sim.engine import Cluster, SimResult, simulate
from gq.sim.fcfs import FcfsIndex, MinTree
from gq.sim.replay import gq_policy
from gq.sim.trace import TraceOptions
from gq.sched.types import PendingJob

REFSIM = trace_mod.shared_traces().parent / "refsim" / "refsim.py"

#: (submit_time_s, gpus, runtime_s[, limit_s]) per job; ids 1, 2, ... in this order.
Row = tuple


def write(tmp_path: Path, rows: list[Row], name: str = "trace.csv") -> Path:
    path = tmp_path / name
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["job_id", "vc", "submit_time_s", "gpus", "runtime_s", "limit_s"])
        for i, (s, g, r, *limit) in enumerate(rows):
            out.writerow([f"j{i}", "v", s, g, r, limit[0] if limit else r])
    return path


def replay(tmp_path: Path, rows: list[Row], policy, nodes: int = 1) -> SimResult:
    jobs = trace_mod.load(write(tmp_path, rows), TraceOptions(limits="trace"))
    return simulate(jobs, Cluster(nodes), policy, gq_policy())


def starts(result: SimResult) -> dict[int, tuple[float | None, tuple[str, ...]]]:
    return {o.job.id: (o.start, o.nodes) for o in result.outcomes}


# ---------------------------------------------------------------- the rules


@pytest.mark.parametrize("policy", [fifo, firstfit, easy, conservative])
def test_every_baseline_places_best_fit(tmp_path, policy):
    # Job 1 leaves n001 4 GPUs free, job 2 (too big for those) leaves n002 2: job 3 goes where
    # it leaves the fewest free, n002, so n001 can still take a 4-GPU job (first fit by name
    # would have broken n001).
    rows = [(0, 4, 100), (0, 6, 100), (1, 2, 50)]
    assert starts(replay(tmp_path, rows, policy, nodes=2))[3] == (1, ("n002",))


def test_easy_reserves_a_gang_on_the_nodes_that_free_first(tmp_path):
    # By limits n001 frees at 1000, n002 at 100, n003 at 200: the 16-GPU head is reserved on
    # n002 + n003 from 200 (the first nodes by name would have meant 1000), and while it waits
    # nothing long may take n002, free from 100.
    rows = [(0, 8, 1000), (0, 8, 100), (0, 8, 200), (1, 16, 10), (2, 8, 500), (3, 1, 500)]
    got = starts(replay(tmp_path, rows, easy, nodes=3))
    assert got[4] == (200, ("n002", "n003"))
    assert got[5] == (210, ("n002",)) and got[6] == (210, ("n003",))


def test_easy_short_job_backfills_anywhere_long_one_only_off_the_reservation(tmp_path):
    # Job 3 (whole node) is reserved at 100 on n001. Job 4 (ends by 52) backfills there; job 5
    # (runs to 203) may not take n001's GPUs, and n002 has none free.
    rows = [(0, 4, 100), (0, 8, 1000), (1, 8, 10), (2, 1, 50), (3, 1, 200)]
    got = starts(replay(tmp_path, rows, easy, nodes=2))
    assert got[3] == (100, ("n001",)) and got[4] == (2, ("n001",)) and got[5] == (110, ("n001",))


def test_easy_long_jobs_share_the_reserved_nodes_spare_gpus(tmp_path):
    # At 100 the node will have 7 GPUs free and the head (job 3) needs 6: one spare GPU may go
    # to a long job now (job 4); job 5, as long, must wait though a GPU is free; job 6 ends by
    # 100 and takes it.
    rows = [(0, 5, 100), (0, 1, 1000), (1, 6, 10), (2, 1, 500), (2, 1, 500), (2, 1, 50)]
    got = starts(replay(tmp_path, rows, easy))
    assert [got[i][0] for i in range(1, 7)] == [0, 0, 100, 2, 110, 2]


def test_conservative_protects_every_queued_job_where_easy_protects_the_head(tmp_path):
    # Job 3 is reserved on n001 at 100; job 4 (whole node) could have n002 at 300. Job 5 (4
    # GPUs for 1000 s) fits n002's free half now: EASY starts it (it keeps off the head's
    # node), which pushes job 4 to 600; conservative keeps job 4's start and runs job 5 after.
    rows = [(0, 8, 100), (0, 4, 300), (1, 8, 500), (1, 8, 50), (2, 4, 1000)]
    cons = starts(replay(tmp_path, rows, conservative, nodes=2))
    assert [cons[i][0] for i in range(1, 6)] == [0, 0, 100, 300, 350]
    e = starts(replay(tmp_path, rows, easy, nodes=2))
    assert [e[i][0] for i in range(1, 6)] == [0, 0, 100, 600, 2]


def test_fed_and_unfed_baselines_make_the_same_schedules(tmp_path):
    # The engine feeds a baseline its queue as jobs come and go (BASELINES[name]()); the
    # module-level functions index each snapshot's queue afresh. Same schedules.
    rng = random.Random(5)
    rows = [(rng.randrange(0, 4000), rng.choice([1, 1, 2, 4, 8, 16, 24]), rng.randrange(1, 900))
            for _ in range(300)]
    rows = [(s, g, r, r * rng.uniform(1, 5)) for s, g, r in rows]
    jobs = trace_mod.load(write(tmp_path, rows), TraceOptions(limits="trace"))
    for name, plain in (("fifo", fifo), ("firstfit", firstfit), ("easy", easy),
                        ("conservative", conservative)):
        fed = simulate(jobs, Cluster(4), BASELINES[name](), gq_policy())
        unfed = simulate(jobs, Cluster(4), plain, gq_policy())
        assert [(o.start, o.nodes) for o in fed.outcomes] \
            == [(o.start, o.nodes) for o in unfed.outcomes], name


# ---------------------------------------------------------------- the indexed queue


def test_min_tree_finds_the_first_slot_at_most_x_and_grows():
    rng = random.Random(1)
    tree, values = MinTree(), {}
    for _ in range(2000):
        slot = rng.randrange(0, 300)
        value = rng.choice([math.inf, rng.randrange(0, 50)])
        tree.set(slot, value)
        values[slot] = value
        x = rng.randrange(0, 60)
        want = min((s for s, v in values.items() if v <= x), default=-1)
        assert tree.first_at_most(x) == want


def test_fcfs_index_orders_by_submit_then_id_and_renumbers_a_late_job():
    def job(i, submit, gpus=1, limit=100):
        return PendingJob(id=i, qos="normal", submit_time=submit, gpus=gpus, time_limit_s=limit)
    index = FcfsIndex([job(1, 0), job(2, 5, limit=10), job(3, 5, gpus=4)])
    assert index.oldest().id == 1
    assert index.queues()[(1, 1)].oldest_within(50).id == 2
    index.remove(1)
    index.add(job(4, -1))  # a requeued job keeps its old submit time: it goes first
    assert [j.id for j in index.in_order()] == [4, 2, 3]
    assert index.queues()[(1, 1)].oldest().id == 4
    assert index.queues()[(1, 1)].oldest_within(50).id == 2
    unlimited = job(5, 9, limit=0)
    index.add(unlimited)
    assert index.queues()[(1, 1)].oldest_within(10 ** 9).id == 4  # 5 never counts as short


# ---------------------------------------------------------------- against the reference


def _random_rows(seed: int, jobs: int) -> list[Row]:
    rng = random.Random(seed)
    rows, t = [], 0
    for _ in range(jobs):
        t += rng.choice([0, 0, 1, 5, 30, 200])  # ties at one instant, bursts and lulls
        g = rng.choice([1, 1, 1, 2, 4, 8, 8, 12, 16, 32])
        run = rng.choice([1, 10, 60, 300, 3000, 20000])
        limit = math.ceil(run * rng.choice([1, 1, 1.5, 3, 5]))
        rows.append((t, g, run, limit))
    return rows


@pytest.mark.skipif(not REFSIM.exists(), reason=f"no reference simulator at {REFSIM}")
@pytest.mark.parametrize("name", ["easy", "conservative", "fifo", "firstfit"])
def test_baselines_agree_with_the_reference_simulator_job_by_job(tmp_path, name):
    for seed, nodes in ((1, 4), (2, 5), (3, 6)):
        rows = _random_rows(seed, 400)
        path = write(tmp_path, rows, f"t{seed}.csv")
        ref_out = tmp_path / f"ref{seed}.csv"
        done = subprocess.run([sys.executable, str(REFSIM), "--trace", str(path), "--nodes",
                               str(nodes), "--policy", name, "--limit-model", "trace", "--json",
                               "--schedule-out", str(ref_out)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["metrics"]["dropped"] == 0
        with open(ref_out, newline="") as fh:
            ref = {r["job_id"]: r for r in csv.DictReader(fh)}
        jobs = trace_mod.load(path, TraceOptions(limits="trace"))
        result = simulate(jobs, Cluster(nodes), BASELINES[name](), gq_policy())
        names = Cluster(nodes).names()
        for o in result.outcomes:
            r = ref[o.job.name]
            assert o.start == float(r["start_s"]), (seed, o.job.name)
            assert sorted(names.index(n) for n in o.nodes) == sorted(map(int, r["nodes"].split()))
