"""The trace simulator (gq.sim): trace loading, limits, the engine's mechanics, baselines, metrics."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from gq.errors import UsageError
from gq.sched.types import Plan, Policy, Preempt, Reservation, Snapshot, Start
from gq.sim import trace as trace_mod
from gq.sim.baselines import easy, fifo, firstfit
from gq.sim.engine import Cluster, SimInvariantError, SimResult, Simulator, Usage, simulate
from gq.sim.metrics import TAU_S, bounded_slowdown, jain, percentile, summarize
from gq.sim.replay import POLICY_NAMES, gq_policy, parse_policies, policy_fn
from gq.sim.trace import TraceOptions

REPO = Path(__file__).resolve().parent.parent
PHILLY = trace_mod.shared_traces() / "philly" / "jobs.csv"

#: (submit_time_s, gpus, runtime_s) per job, in the order job ids are given (1, 2, ...).
Row = tuple[float, int, float]


def philly(tmp_path: Path, rows: Sequence[Row], vc: str = "v1") -> Path:
    path = tmp_path / "trace.csv"
    lines = ["job_id,vc,submit_time_s,gpus,runtime_s"]
    lines += [f"{vc}-{i},{vc},{s},{g},{r}" for i, (s, g, r) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def replay(tmp_path: Path, rows: Sequence[Row], policy, nodes: int = 1, **opts) -> SimResult:
    jobs = trace_mod.load(philly(tmp_path, rows), TraceOptions(**opts))
    return simulate(jobs, Cluster(nodes), policy, gq_policy())


def starts(result: SimResult) -> dict[int, float | None]:
    return {o.job.id: o.start for o in result.outcomes}


# ---------------------------------------------------------------- trace and limits


def test_big_jobs_become_whole_nodes_and_cpu_rows_are_skipped(tmp_path):
    jobs = trace_mod.load(philly(tmp_path, [(0, 16, 10), (1, 0, 10), (2, 12, 10), (3, 4, 10)]),
                          TraceOptions())
    assert [(j.name, j.nodes, j.gpus) for j in jobs] == [("v1-0", 2, 8), ("v1-2", 2, 8), ("v1-3", 1, 4)]
    assert [j.total_gpus for j in jobs] == [16, 16, 4]


def test_vc_selects_rows_and_needs_a_vc_column(tmp_path):
    path = philly(tmp_path, [(0, 1, 10), (5, 1, 10)])
    assert len(trace_mod.load(path, TraceOptions(vc="v1"))) == 2
    with pytest.raises(UsageError, match="no GPU jobs in VC other"):
        trace_mod.load(path, TraceOptions(vc="other"))
    plain = tmp_path / "plain.csv"
    plain.write_text("job_id,submit_time_s,gpus,runtime_s\na,0,1,5\n")
    with pytest.raises(UsageError, match="no vc column"):
        trace_mod.load(plain, TraceOptions(vc="v1"))


def test_limit_models(tmp_path):
    rows = [(i, 1, 100 + 7 * i) for i in range(200)]
    path = philly(tmp_path, rows)
    exact = trace_mod.load(path, TraceOptions(limits="exact"))
    assert [j.time_limit_s for j in exact] == [100 + 7 * i for i in range(200)]
    x2 = trace_mod.load(path, TraceOptions(limits="x2"))
    assert [j.time_limit_s for j in x2] == [2 * (100 + 7 * i) for i in range(200)]
    first = trace_mod.load(path, TraceOptions(limits="random", seed=1))
    again = trace_mod.load(path, TraceOptions(limits="random", seed=1))
    other = trace_mod.load(path, TraceOptions(limits="random", seed=2))
    assert [j.time_limit_s for j in first] == [j.time_limit_s for j in again]
    assert [j.time_limit_s for j in first] != [j.time_limit_s for j in other]
    ks = [j.time_limit_s / j.runtime_s for j in first]
    assert all(1.0 <= k <= 5.0 + 1 / j.runtime_s for k, j in zip(ks, first))
    # Spread over the whole range, not stuck at one end: k is U[1,5] per job.
    assert min(ks) < 1.3 and max(ks) > 4.7 and 2.6 < sum(ks) / len(ks) < 3.4
    with pytest.raises(UsageError, match="bad --limits"):
        trace_mod.load(path, TraceOptions(limits="x3"))


def test_random_limits_draw_as_the_reference_simulator_does(tmp_path):
    # k per job in submit order from random.Random(seed): "seed 1" means the same limits to gq
    # and ../shared/refsim, but for gq's rounding up to whole seconds.
    import math
    import random
    rows = [(5 - i % 3, 1, 100 + 7 * i) for i in range(50)]  # not in submit order in the file
    jobs = trace_mod.load(philly(tmp_path, rows), TraceOptions(limits="random", seed=1))
    rng = random.Random(1)
    ordered = sorted(enumerate(rows), key=lambda r: (r[1][0], r[0]))
    assert [j.time_limit_s for j in jobs] == [math.ceil(r * rng.uniform(1, 5))
                                              for _, (_, _, r) in ordered]


def test_trace_limits_come_from_the_limit_s_column(tmp_path):
    path = tmp_path / "limits.csv"
    path.write_text("job_id,submit_time_s,gpus,runtime_s,limit_s\n"
                    "a,0,1,100,250\nb,1,1,100,50\nc,2,1,100.5,\n")
    with pytest.raises(UsageError, match="job c: --limits trace needs a limit_s"):
        trace_mod.load(path, TraceOptions(limits="trace"))
    path.write_text("job_id,submit_time_s,gpus,runtime_s,limit_s\n"
                    "a,0,1,100,250\nb,1,1,100,50\nc,2,1,100.5,100.5\n")
    # Never below the runtime, in whole seconds (up).
    assert [j.time_limit_s for j in trace_mod.load(path, TraceOptions(limits="trace"))] \
        == [250, 100, 101]
    assert "limit_s" in trace_mod.describe_limits(TraceOptions(limits="trace"))


def test_qos_mix_is_seeded_and_does_not_change_limits(tmp_path):
    path = philly(tmp_path, [(i, 1, 100) for i in range(400)])
    mix = trace_mod.parse_qos_mix("pro=1,free=4")
    assert mix == (("pro", 0.2), ("free", 0.8))
    jobs = trace_mod.load(path, TraceOptions(limits="random", seed=3, qos_mix=mix))
    assert [j.qos for j in jobs] == [j.qos for j in trace_mod.load(path, TraceOptions(limits="random", seed=3, qos_mix=mix))]
    pro = sum(j.qos == "pro" for j in jobs)
    assert 50 < pro < 110 and pro + sum(j.qos == "free" for j in jobs) == 400
    plain = trace_mod.load(path, TraceOptions(limits="random", seed=3))
    assert {j.qos for j in plain} == {"normal"}
    assert [j.time_limit_s for j in plain] == [j.time_limit_s for j in jobs]
    for bad in ("pro", "pro=x", "pro=-1", "pro=0"):
        with pytest.raises(UsageError):
            trace_mod.parse_qos_mix(bad)


def test_alibaba_rows_users_and_skips(tmp_path):
    path = tmp_path / "ali.csv"
    path.write_text(
        "job_id,submit_time_s,gpus,runtime_s,user,group,gpu_milli\n"
        "p0,0,1,100,alice,LS,500\n"     # a fraction of a GPU still holds one here
        "p1,5,0,100,bob,BE,0\n"         # CPU-only
        "p2,6,2,,bob,BE,1000\n"         # never ran
        "p3,7,8,50,bob,LS,1000\n")
    jobs = trace_mod.load(path, TraceOptions())
    assert [(j.name, j.user, j.gpus) for j in jobs] == [("p0", "alice", 1), ("p3", "bob", 8)]
    m = summarize(simulate(jobs, Cluster(1), fifo))
    assert (m.jain_over, m.jain_groups) == ("user", 2)


# ---------------------------------------------------------------- metrics


def test_metrics_of_a_two_job_trace_by_hand(tmp_path):
    # A holds the whole node 0..100; B (1 GPU, 5 s) waits 90 s, runs 100..105.
    m = summarize(replay(tmp_path, [(0, 8, 100), (10, 1, 5)], fifo))
    assert (m.jobs, m.unfinished, m.makespan_s) == (2, 0, 105)
    assert m.utilization == pytest.approx((8 * 100 + 1 * 5) / (8 * 105))
    assert (m.wait.avg, m.wait.p50, m.wait.max) == (45, 45, 90)
    assert m.wait.p99 == pytest.approx(89.1)
    assert (m.wait_1gpu.count, m.wait_1gpu.avg, m.wait_big.count, m.wait_big.avg) == (1, 90, 1, 0)
    assert m.avg_jct_s == (100 + 95) / 2
    # A: 100/100 = 1; B: (90 + 5) / max(5, tau=10) = 9.5.
    assert m.avg_bounded_slowdown == pytest.approx((1 + 9.5) / 2)
    assert (m.jain, m.jain_over, m.jain_groups) == (1.0, "qos", 1)
    assert (m.preemptions, m.lost_gpu_h, m.timeouts) == (0, 0, 0)


def test_metric_helpers():
    assert percentile([0, 10], 50) == 5 and percentile([7], 99) == 7 and percentile([], 50) == 0
    assert bounded_slowdown(0, 1) == 1.0 and bounded_slowdown(30, 1) == (30 + 1) / TAU_S
    assert jain([2, 2, 2]) == 1.0 and jain([1, 0, 0, 0]) == pytest.approx(0.25)


def test_usage_decays_by_half_life():
    usage = Usage(half_life_s=100)
    usage.add("alice", 80, at=0)
    usage.add("bob", 10, at=100)
    assert usage.at(100) == pytest.approx({"alice": 40, "bob": 10})
    usage.add("alice", 1, at=100 * 600)  # far enough to move the reference: no overflow
    assert usage.at(100 * 600)["alice"] == pytest.approx(1)


# ---------------------------------------------------------------- baselines


def test_fifo_blocks_behind_a_big_job_where_firstfit_starts_the_small_one(tmp_path):
    rows = [(0, 4, 100), (1, 8, 10), (2, 1, 10)]
    assert starts(replay(tmp_path, rows, fifo)) == {1: 0, 2: 100, 3: 110}
    assert starts(replay(tmp_path, rows, firstfit)) == {1: 0, 2: 100, 3: 2}


def test_easy_backfills_a_short_job_before_the_reservation_but_not_a_long_one(tmp_path):
    # Job 2 (whole node) is reserved for t=100, when job 1's limit ends. Job 3 ends by 52 and
    # backfills; job 4 would run past 100 on the reserved GPUs, so it waits for job 2.
    rows = [(0, 4, 100), (1, 8, 10), (2, 1, 50), (3, 1, 200)]
    assert starts(replay(tmp_path, rows, easy)) == {1: 0, 2: 100, 3: 2, 4: 110}
    # Greedy first fit starts the long one too, and the whole-node job waits for it.
    assert starts(replay(tmp_path, rows, firstfit)) == {1: 0, 2: 203, 3: 2, 4: 3}


def test_easy_lets_a_long_job_start_off_the_reserved_gpus(tmp_path):
    # n001 frees at 100 (job 1), n002 only at 1000 (job 2 holds half of it): job 3 is reserved
    # on n001 at 100; job 4 runs past 100 but fits on n002's free half, so it starts now.
    rows = [(0, 8, 100), (0, 4, 1000), (1, 8, 10), (2, 1, 500)]
    result = replay(tmp_path, rows, easy, nodes=2)
    assert starts(result) == {1: 0, 2: 0, 3: 100, 4: 2}
    jobs = trace_mod.load(philly(tmp_path, rows), TraceOptions())
    sim = Simulator(jobs, Cluster(2), easy)
    seen: list[Plan] = []

    def spy(state: Snapshot, now: float, policy: Policy) -> Plan:
        decided = easy(state, now, policy)
        seen.append(decided)
        return decided
    sim.policy_fn = spy
    sim.run()
    at_2 = [p for p in seen if any(s.job_id == 4 for s in p.starts)][0]
    assert at_2.reservations[3].start == 100 and set(at_2.reservations[3].alloc) == {"n001"}
    assert [s.alloc for s in at_2.starts if s.job_id == 4] == [{"n002": (4,)}]


# ---------------------------------------------------------------- engine


def test_gang_job_takes_whole_nodes(tmp_path):
    jobs = trace_mod.load(philly(tmp_path, [(0, 16, 100), (0, 1, 100), (1, 1, 10)]), TraceOptions())
    snapshots: list[Snapshot] = []

    def spy(state: Snapshot, now: float, policy: Policy) -> Plan:
        snapshots.append(state)
        return firstfit(state, now, policy)
    result = simulate(jobs, Cluster(3), spy)
    assert starts(result) == {1: 0, 2: 0, 3: 1}
    at_1 = [s for s in snapshots if any(j.id == 3 for j in s.pending)][0]
    assert {n.name: len(n.free) for n in at_1.nodes} == {"n001": 0, "n002": 0, "n003": 7}
    running = {r.id: r.alloc for r in at_1.running}
    assert running[1] == {"n001": tuple(range(8)), "n002": tuple(range(8))}
    assert running[2] == {"n003": (0,)}


def test_jobs_end_at_their_runtime_or_their_limit(tmp_path):
    jobs = trace_mod.load(philly(tmp_path, [(0, 1, 100), (0, 1, 50)]), TraceOptions())
    jobs[1] = dataclasses.replace(jobs[1], time_limit_s=20)
    result = simulate(jobs, Cluster(1), firstfit)
    assert [(o.end, o.timed_out) for o in result.outcomes] == [(100, False), (20, True)]


def pro_first(state: Snapshot, now: float, policy: Policy) -> Plan:
    """A fake policy: job 2 takes the node, preempting job 1 if it must; job 1 runs otherwise."""
    decided = Plan()
    pending = {j.id for j in state.pending}
    whole = {"n001": tuple(range(8))}
    idle = len(state.nodes[0].free) == 8
    if 2 in pending and not idle and any(r.id == 1 for r in state.running):
        decided.preemptions.append(Preempt(victim=1, for_job=2))
    for job_id in (2, 1):
        if job_id in pending and idle:
            decided.starts.append(Start(job_id, whole))
            break
    return decided


def test_preemption_requeues_the_victim_with_its_submit_time(tmp_path):
    loaded = trace_mod.load(philly(tmp_path, [(0, 8, 100), (10, 8, 30)]), TraceOptions())
    # The engine skips passes where no start fits and no pending QOS may preempt a running one
    # (by Policy.preempts), so the fake policy's victims are `free` and its winner `pro`.
    jobs = [dataclasses.replace(j, qos=q) for j, q in zip(loaded, ("free", "pro"))]
    seen: list[tuple[float, Snapshot]] = []

    def spy(state: Snapshot, now: float, policy: Policy) -> Plan:
        seen.append((now, state))
        return pro_first(state, now, policy)
    result = simulate(jobs, Cluster(1), spy, Policy(preempts={"pro": ("free",)}))
    victim, winner = result.outcomes
    # Preempted at 10 (its 10 s on 8 GPUs are lost), job 2 runs 10..40, job 1 reruns 40..140.
    assert (winner.start, winner.end) == (10, 40)
    assert (victim.start, victim.end, victim.restarts, victim.lost_gpu_s) == (40, 140, 1, 80)
    # The engine planned again at once at 10 (the victim's exit), with job 1 back in the queue.
    assert [now for now, _ in seen] == [0, 10, 10, 40]
    requeued = [j for now, s in seen if now > 0 for j in s.pending if j.id == 1]
    assert len(requeued) == 2 and all(j.submit_time == 0 for j in requeued)
    m = summarize(result)
    assert (m.preemptions, m.lost_gpu_h, m.jobs) == (1, pytest.approx(80 / 3600), 2)
    # The victim's wait is its time pending: 0 before its first run, 30 s before its second
    # (its first run is no waiting; its lost work is counted apart).
    assert m.wait.max == 30


def test_victim_leaving_its_exempt_time_wakes_the_engine(tmp_path):
    # Job 2 (pro) waits from 10; job 1 (free) may be preempted only after 600 s of running.
    # No job event falls at 600: the engine must wake there by itself.
    loaded = trace_mod.load(philly(tmp_path, [(0, 8, 5000), (10, 8, 30)]), TraceOptions())
    jobs = [dataclasses.replace(j, qos=q) for j, q in zip(loaded, ("free", "pro"))]

    def exempt_first(state: Snapshot, now: float, policy: Policy) -> Plan:
        young = any(r.id == 1 and now - r.start_time < policy.preempt_exempt_s for r in state.running)
        return Plan() if young else pro_first(state, now, policy)
    policy = Policy(preempts={"pro": ("free",)}, preempt_exempt_s=600)
    result = simulate(jobs, Cluster(1), exempt_first, policy)
    assert [(o.start, o.end) for o in result.outcomes] == [(630, 5630), (600, 630)]
    assert result.outcomes[0].lost_gpu_s == 600 * 8


def test_engine_refuses_over_allocation_and_bad_decisions(tmp_path):
    jobs = trace_mod.load(philly(tmp_path, [(0, 4, 100), (0, 4, 100)]), TraceOptions())

    def same_gpus(state: Snapshot, now: float, policy: Policy) -> Plan:
        return Plan(starts=[Start(j.id, {"n001": (0, 1, 2, 3)}) for j in state.pending])
    with pytest.raises(SimInvariantError, match="over-allocates n001"):
        simulate(jobs, Cluster(1), same_gpus)

    def ghost_victim(state: Snapshot, now: float, policy: Policy) -> Plan:
        return Plan(preemptions=[Preempt(victim=99, for_job=1)])
    with pytest.raises(SimInvariantError, match="not running"):
        simulate(jobs, Cluster(1), ghost_victim)

    def wrong_size(state: Snapshot, now: float, policy: Policy) -> Plan:
        return Plan(starts=[Start(state.pending[0].id, {"n001": (0,)})])
    with pytest.raises(SimInvariantError, match="needs 4 GPU"):
        simulate(jobs, Cluster(1), wrong_size)


def test_jobs_larger_than_the_cluster_are_rejected(tmp_path):
    m = summarize(replay(tmp_path, [(0, 32, 10), (0, 1, 10)], firstfit, nodes=2))
    assert (m.jobs, m.rejected, m.unfinished) == (1, 1, 0)


def test_reservation_start_wakes_the_engine(tmp_path):
    jobs = trace_mod.load(philly(tmp_path, [(0, 1, 10)]), TraceOptions())
    calls: list[float] = []

    def late(state: Snapshot, now: float, policy: Policy) -> Plan:
        calls.append(now)
        decided = Plan()
        if now < 50:  # hold the job back, promising it a start at 50
            decided.reservations = {1: _reservation(1, 50)}
        else:
            decided.starts = [Start(1, {"n001": (0,)})]
        return decided
    result = simulate(jobs, Cluster(1), late)
    # No job event falls at 50: only the wake-up brings the pass that starts the job.
    assert calls == [0, 50] and starts(result) == {1: 50}


def _reservation(job_id: int, at: float) -> Reservation:
    return Reservation(job_id=job_id, start=at, alloc={"n001": (0,)})


# ---------------------------------------------------------------- the real trace


@pytest.fixture(scope="module")
def smoke_jobs():
    if not PHILLY.exists():
        pytest.skip(f"no trace at {PHILLY}")
    return trace_mod.load(PHILLY, TraceOptions(vc="51b7ef", limits="random", seed=1))


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_smoke_replay_of_vc_51b7ef_finishes_every_job(smoke_jobs, name):
    assert len(smoke_jobs) == 63
    # The engine raises SimInvariantError on any over-allocation, so finishing is the check.
    result = simulate(smoke_jobs, Cluster(1), policy_fn(name), gq_policy())
    assert result.unfinished == [] and result.rejected == []
    for o in result.outcomes:
        assert o.start >= o.job.submit_time
        assert o.end - o.start == o.job.runtime_s  # random limits are >= runtime: no timeouts
    m = summarize(result)
    assert m.jobs == 63 and 0 < m.utilization <= 1


@pytest.mark.parametrize("name", ["fifo", "firstfit", "easy"])
def test_skipping_futile_passes_changes_nothing(smoke_jobs, name):
    def outcomes(skip: bool) -> list[tuple[float | None, float | None]]:
        sim = Simulator(smoke_jobs, Cluster(1), policy_fn(name), gq_policy(), skip_futile=skip)
        result = sim.run()
        return [(o.start, o.end) for o in result.outcomes], result.plan_calls
    (skipped, calls_skipped), (full, calls_full) = outcomes(True), outcomes(False)
    assert skipped == full and calls_skipped < calls_full


# ---------------------------------------------------------------- the command


def test_policies_parse_from_repeats_and_commas():
    assert parse_policies(["easy,fifo", "gq", "fifo"]) == ["easy", "fifo", "gq"]
    with pytest.raises(UsageError, match="unknown policy"):
        parse_policies(["sjf"])


def test_gq_sim_json_side_by_side(tmp_path, capsys):
    from gq.cli.main import main
    path = philly(tmp_path, [(0, 4, 100), (1, 8, 10), (2, 1, 10)])
    assert main(["sim", str(path), "--nodes", "1", "--policy", "fifo", "--policy", "firstfit",
                 "--limits", "x2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["policy"] for r in doc["results"]] == ["fifo", "firstfit"]
    assert doc["limits"] == "x2" and doc["limits_model"] == "limit = runtime x 2"
    fifo_r, ff_r = doc["results"]
    assert fifo_r["wait"]["max"] == 108 and ff_r["wait"]["max"] == 99


def test_gq_sim_writes_each_jobs_schedule(tmp_path, capsys):
    from gq.cli.main import main
    path = philly(tmp_path, [(0, 4, 100), (1, 8, 10), (2, 1, 10)])
    out = tmp_path / "schedule.csv"
    assert main(["sim", str(path), "--nodes", "1", "--policy", "fifo,firstfit",
                 "--schedule-out", str(out)]) == 0
    import csv
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    got = {(r["policy"], r["job_id"]): (float(r["start_s"]), r["nodes"]) for r in rows}
    assert got[("fifo", "v1-2")] == (110, "n001") and got[("firstfit", "v1-2")] == (2, "n001")
    assert len(rows) == 6


def test_gq_sim_table_and_usage_errors(tmp_path, capsys):
    from gq.cli.main import main
    path = philly(tmp_path, [(0, 1, 100)])
    assert main(["sim", str(path), "--nodes", "1", "--policy", "easy,gq"]) == 0
    out = capsys.readouterr().out
    assert "limit = runtime;" in out
    header = out.splitlines()[1].split()
    assert header == ["METRIC", "EASY", "GQ"]
    assert main(["sim", str(path), "--nodes", "1", "--policy", "nope"]) == 2
    assert main(["sim", str(tmp_path / "missing.csv"), "--nodes", "1"]) == 2


def test_simulator_stays_pure_and_out_of_other_commands():
    code = ("import sys, gq.sim.engine, gq.sim.baselines, gq.sim.metrics, gq.sim.replay\n"
            "bad = [m for m in ('sqlite3', 'zmq', 'typer', 'rich') if m in sys.modules]\n"
            "from gq.cli import app; app.register()\n"
            "print(bad, 'gq.sim' in sys.modules)\n")
    pure = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert pure.stdout.split("\n")[0] == "[] True", pure.stderr
    cli = subprocess.run([sys.executable, "-c", "import sys; from gq.cli import app; app.register();"
                          " print('gq.sim' in sys.modules)"], capture_output=True, text=True, cwd=REPO)
    assert cli.stdout.strip() == "False", cli.stderr
