"""Tiers: per-QOS preempt_after_s and preempt_exempt_s, guaranteed shares (min_share), victims
by the work they would lose (checkpoint-aware), in the config, the pure scheduler, gqd's pass
and the simulator; waste in GPU-hours to two significant figures."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gq import protocol
from gq.cli.accounting import gpu_hours
from gq.config import Config, from_dict
from gq.errors import ConfigError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.messages import read as read_message
from gq.model import Gpu
from gq.sched import NodeView, PendingJob, Policy, RunningJob, Snapshot, plan
from gq.sim import trace as trace_mod
from gq.sim.engine import Cluster, simulate
from gq.sim.metrics import summarize
from gq.sim.replay import gq_policy
from gq.sim.trace import TraceOptions
from gq.store import Store
from tests import headkit

NOW = 1_000_000.0
SRC = "test.toml"
TIERS = {"qos": {"normal": {"priority": 10}, "pro": {"priority": 100, "preempts": ["free"]},
                 "free": {"priority": 1}}}


def tiers(**qos: dict) -> dict:
    """TIERS with extra keys per QOS table."""
    data = {"qos": {name: dict(table) for name, table in TIERS["qos"].items()}}
    for name, extra in qos.items():
        data["qos"][name].update(extra)
    return data


# ---------------------------------------------------------------- config


def test_qos_keys_parse_and_reach_the_policy():
    cfg = from_dict({"scheduler": {"preempt_exempt_s": 300},
                     **tiers(pro={"preempt_after_s": 5.0},
                             free={"min_share": 0.3, "preempt_exempt_s": 20})}, SRC)
    assert cfg.qos["pro"].preempt_after_s == 5.0 and cfg.qos["free"].min_share == 0.3
    # A QOS that names no preempt_exempt_s gets [scheduler]'s.
    assert cfg.qos["pro"].preempt_exempt_s == 300 and cfg.qos["free"].preempt_exempt_s == 20
    policy = cfg.policy()
    assert policy.after_s("pro") == 5.0 and policy.after_s("normal") == 60.0
    assert policy.min_share == {"free": 0.3}
    assert policy.exempt_s("free", 3600) == 20 and policy.exempt_s("normal", 36000) == 300
    # At most a quarter of the limit: a 2-minute inference job may go after 30 s.
    assert policy.exempt_s("normal", 120) == 30


def test_built_in_defaults_suit_training_and_inference():
    policy = Config().policy()
    assert policy.after_s("pro") == 60.0 and policy.min_share == {}
    assert policy.exempt_s("free", 24 * 3600) == 600  # a training job keeps its start-up
    assert policy.exempt_s("free", 5) == 1.25 and policy.exempt_s("free", 120) == 30


@pytest.mark.parametrize("bad, message", [
    (tiers(free={"min_share": 1.5}), r"\[qos.free\] min_share must be a fraction"),
    (tiers(free={"min_share": 0.6}, normal={"min_share": 0.5}), "add up to 1.1"),
    (tiers(pro={"preempt_after_s": -1.0}), r"\[qos.pro\] preempt_after_s must be"),
    (tiers(pro={"preempt_after_s": "soon"}), r"\[qos.pro\] preempt_after_s must be a float"),
    (tiers(free={"preempt_exempt_s": -5}), r"\[qos.free\] preempt_exempt_s must be"),
])
def test_bad_tier_keys_are_refused_with_the_key_and_file(bad, message):
    with pytest.raises(ConfigError, match=message):
        from_dict(bad, SRC)


# ---------------------------------------------------------------- the pure scheduler


def gpus(n: int = 8) -> tuple[Gpu, ...]:
    return tuple(Gpu(index=i, type="h100", memory=80 << 30) for i in range(n))


def snapshot(runs: tuple[RunningJob, ...], jobs: tuple[PendingJob, ...], n_nodes: int = 1,
             ) -> Snapshot:
    names = [f"n{i}" for i in range(1, n_nodes + 1)]
    nodes = tuple(NodeView(name=n, gpus=gpus(), cpus_free=64, mem_free=1 << 40,
                           free=frozenset(range(8)) - {g for r in runs for g in r.alloc.get(n, ())})
                  for n in names)
    return Snapshot(nodes=nodes, pending=jobs, running=runs)


def running(job_id: int, gpus_: tuple[int, ...], ran: float, limit: int = 36000,
            qos: str = "free", node: str = "n1", checkpoint: float | None = None) -> RunningJob:
    return RunningJob(id=job_id, qos=qos, alloc={node: gpus_}, start_time=NOW - ran,
                      time_limit_s=limit, checkpoint_time=checkpoint)


def pending(job_id: int, n_gpus: int, qos: str = "pro", limit: int = 3600) -> PendingJob:
    return PendingJob(id=job_id, qos=qos, submit_time=NOW - 10 + job_id * 1e-3, gpus=n_gpus,
                      time_limit_s=limit)


def policy(**kw) -> Policy:
    base = from_dict({"scheduler": {"preempt_exempt_s": 0}, **TIERS}, SRC).policy()
    return dataclasses.replace(base, **kw)


def victims(p) -> list[int]:
    return sorted(x.victim for x in p.preemptions)


def test_a_reservation_due_within_preempt_after_s_is_waited_for():
    # The free job's limit ends in 120 s: the pro job is reserved then.
    runs = (running(1, tuple(range(8)), ran=3480, limit=3600),)
    state = snapshot(runs, (pending(10, 8),))
    assert victims(plan(state, NOW, policy(preempt_after_s={"pro": 60.0}))) == [1]
    assert victims(plan(state, NOW, policy(preempt_after_s={"pro": 300.0}))) == []


def test_a_victim_ending_within_preempt_after_s_is_left_to_end():
    # n1's job ends in 100 s, n2's in hours. Pro job 10 is reserved on n1 in 100 s; job 11 (no
    # reservation) preempts, but not the job that ends within its QOS's preempt_after_s.
    runs = (running(1, tuple(range(8)), ran=600, limit=700),
            running(2, tuple(range(8)), ran=3000, node="n2"))
    state = snapshot(runs, (pending(10, 8), pending(11, 8)), n_nodes=2)
    assert victims(plan(state, NOW, policy(preempt_after_s={"pro": 300.0}))) == [2]
    # Waiting less long, job 10 preempts too, and the cheaper job (fewer GPU-seconds run)
    # goes first.
    p = plan(state, NOW, policy(preempt_after_s={"pro": 10.0}))
    assert [(x.victim, x.for_job) for x in p.preemptions] == [(1, 10), (2, 11)]


def test_victims_are_the_jobs_that_lose_the_least_work_since_their_checkpoint():
    # Job 1 ran 10 h but checkpointed a minute ago; job 2 ran 1 h without one: job 1 loses less.
    runs = (running(1, (0, 1, 2, 3), ran=36000, limit=72000, checkpoint=NOW - 60),
            running(2, (4, 5, 6, 7), ran=3600))
    assert victims(plan(snapshot(runs, (pending(10, 4),)), NOW, policy())) == [1]
    no_checkpoint = (dataclasses.replace(runs[0], checkpoint_time=None), runs[1])
    assert victims(plan(snapshot(no_checkpoint, (pending(10, 4),)), NOW, policy())) == [2]


def test_a_short_job_is_preemptible_after_a_quarter_of_its_limit():
    runs = (running(1, tuple(range(8)), ran=40, limit=120),)
    state = snapshot(runs, (pending(10, 8),))
    exempt = policy(preempt_exempt_s=600, qos_exempt_s={}, preempt_after_s={"pro": 0.0})
    assert victims(plan(state, NOW, exempt)) == [1]  # 40 s run > 120 / 4
    young = snapshot((running(1, tuple(range(8)), ran=20, limit=120),), (pending(10, 8),))
    assert victims(plan(young, NOW, exempt)) == []


def test_jobs_within_their_guaranteed_share_are_not_preempted():
    # Free holds 6 of 8 GPUs with a share of 0.5 (4 GPUs): only 2 GPUs of it may be taken.
    runs = (running(1, (0, 1), ran=100), running(2, (2, 3), ran=200), running(3, (4, 5), ran=300))
    shared = policy(min_share={"free": 0.5})
    assert victims(plan(snapshot(runs, (pending(10, 4),)), NOW, shared)) == [1]  # + 6, 7
    assert victims(plan(snapshot(runs, (pending(10, 6),)), NOW, shared)) == []
    full = runs + (running(4, (6, 7), ran=50, qos="normal"),)
    assert victims(plan(snapshot(full, (pending(10, 2),)), NOW, shared)) == [1]
    assert victims(plan(snapshot(full, (pending(10, 4),)), NOW, shared)) == []
    assert victims(plan(snapshot(full, (pending(10, 4),)), NOW, policy())) == [1, 2]


def test_a_qos_under_its_share_goes_before_higher_tiers():
    # One node, 8 GPUs, all free; a flood of pro work and free work waiting. Free holds nothing
    # and may claim 25 %: its two 1-GPU jobs start first, the pro jobs take the rest.
    jobs = (*(pending(i, 2, "pro") for i in range(1, 5)), pending(20, 1, "free"),
            pending(21, 1, "free"))
    state = snapshot((), jobs)
    started = {s.job_id for s in plan(state, NOW, policy(min_share={"free": 0.25})).starts}
    assert {20, 21} <= started and len(started & {1, 2, 3, 4}) == 3
    # Without a share, strict tiers: the pro jobs fill the node, free waits.
    assert {s.job_id for s in plan(state, NOW, policy()).starts} == {1, 2, 3, 4}


# ---------------------------------------------------------------- gqd passes them through


OWNER = Caller(uid=1000, user="ann", proven=True)


def _head(cfg: Config) -> Head:
    head = Head(cfg, Store(":memory:"), NOW)
    with head.store.tx():
        head.handle_node("n0", read_message({"type": protocol.REGISTER, "node": "n0", "cpus": 8,
                                "mem": 1 << 34, "running": [],
                                "gpus": [{"index": i, "type": "fake", "memory": 1 << 34}
                                         for i in range(2)]}), NOW)
    return head


def _submit(head: Head, now: float, qos: str, gpus_: int = 1) -> int:
    return headkit.submit(head, now, OWNER, gpus=gpus_, qos=qos, time_limit_s=3600)


_pass = headkit.schedule


@pytest.mark.parametrize("share, stopped", [(0.0, 2), (0.5, 0)])
def test_gqd_takes_min_share_and_preempt_after_s_from_its_config(share, stopped):
    cfg = from_dict({"scheduler": {"preempt_exempt_s": 0},
                     **tiers(pro={"preempt_after_s": 1.0}, free={"min_share": share})}, SRC)
    head = _head(cfg)
    assert head.policy.after_s("pro") == 1.0 and head.policy.min_share.get("free", 0) == share
    free = [_submit(head, NOW, "free") for _ in range(2)]
    _pass(head, NOW)
    assert all(head.jobs[j].state.value == "RUNNING" for j in free)
    _submit(head, NOW + 5, "pro", gpus_=2)
    _pass(head, NOW + 5)
    # Without a share both free jobs make room; with half the node guaranteed, one may go,
    # which is not enough for the 2-GPU pro job: none is stopped for nothing.
    assert sum(head.jobs[j].reason == "Preempted" for j in free) == stopped


# ---------------------------------------------------------------- the simulator


def _trace(tmp_path: Path, rows: list[tuple]) -> Path:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time_s,gpus,runtime_s\n"
                    + "".join(f"j{i},{s},{g},{r}\n" for i, (s, g, r) in enumerate(rows)))
    return path


def test_checkpointed_victims_lose_only_the_work_since_and_resume_from_there(tmp_path):
    # A free job (8 GPUs, 10 h, checkpoints hourly) is preempted at 2.5 h by a pro job of 1 h:
    # 0.5 h x 8 GPUs are lost, and its second run needs only 8 h.
    jobs = trace_mod.load(_trace(tmp_path, [(0, 8, 36000), (9000, 8, 3600)]),
                          TraceOptions(checkpoint_every_s=3600))
    jobs = [dataclasses.replace(j, qos=q) for j, q in zip(jobs, ("free", "pro"))]
    result = simulate(jobs, Cluster(1), plan, gq_policy())
    victim, pro = result.outcomes
    assert (pro.start, victim.restarts, victim.lost_gpu_s) == (9000, 1, 0.5 * 3600 * 8)
    assert (victim.start, victim.end) == (12600, 12600 + 8 * 3600)
    m = summarize(result)
    # Its wait is its time pending: not its first run.
    assert m.wait_by_qos["free"].max == 12600 - 9000 and m.wait_by_qos["pro"].max == 0
    assert m.lost_share == pytest.approx(4 / (10 * 8 + 8))


def test_gq_sim_shows_waits_per_qos_and_waste_to_two_figures(tmp_path, capsys):
    from gq.cli.main import main
    path = _trace(tmp_path, [(0, 8, 36000), (9000, 8, 3600)])
    config = tmp_path / "gq.toml"
    config.write_text('[qos.normal]\npriority = 10\n[qos.pro]\npriority = 100\n'
                      'preempts = ["free"]\n[qos.free]\npriority = 1\n')
    assert main(["sim", str(path), "--nodes", "1", "--policy", "gq", "--config", str(config),
                 "--qos-mix", "pro=1,free=1", "--seed", "4", "--checkpoint-every", "1h"]) == 0
    out = capsys.readouterr().out
    assert "checkpoints every 3600 s" in out
    rows = {line.split("  ")[0].strip(): line.split()[-1] for line in out.splitlines()[2:]}
    assert {"wait pro avg", "wait free max", "wait pro p99"} <= set(rows)


def test_waste_shows_two_significant_figures():
    assert [gpu_hours(h) for h in (0, 0.0034, 0.52, 0.999, 9.96, 12.4, 1234)] \
        == ["0", "0.0034", "0.52", "1.0", "10", "12", "1200"]
