"""Telemetry in placement, without daemons: injected fake readings, the head's rule (fresh,
stale, hot, VRAM held outside gq), the scheduler's offer, and the pending reason."""

from __future__ import annotations

from pathlib import Path

from gq.head import reasons, telemetry
from gq.model import Gpu, Job, JobSpec, Node
from gq.node.gpus import open_gpus
from gq.sched import NodeView, Plan, Snapshot, plan
from gq.sched.plan import PRIORITY, RESOURCES
from tests.test_sched import NOW, POLICY, job, node, starts

GiB = 1024**3
RULE = telemetry.Rule(max_temp_c=90, stale_s=10)


def test_fake_gpus_report_what_the_telemetry_file_says(tmp_path: Path) -> None:
    path = tmp_path / "fake-gpu-telemetry"
    source = open_gpus("2", telemetry_file=path)
    assert source.telemetry()[0] == {"util": 0, "mem_used": 0, "temp": 30}
    path.write_text("0 used=30G temp=91\n1 util=50\n")
    assert source.telemetry() == {0: {"util": 0, "mem_used": 30 * GiB, "temp": 91},
                                  1: {"util": 50, "mem_used": 0, "temp": 30}}
    # A bad line is skipped (and logged), never a crash: the good ones still count.
    path.write_text("7 used=1G\n0 used=lots\n1 hot=yes\n0 temp=95\n")
    assert source.telemetry() == {0: {"util": 0, "mem_used": 0, "temp": 95},
                                  1: {"util": 0, "mem_used": 0, "temp": 30}}
    path.unlink()
    assert source.telemetry()[0]["temp"] == 30


def _node(readings: dict[int, dict], at: float = NOW) -> Node:
    return Node(name="n1", gpus=[Gpu(index=i, type="h100", memory=80 * GiB) for i in range(2)],
                telemetry=readings, telemetry_at=at)


def test_rule_rules_out_hot_gpus_and_vram_held_outside_gq() -> None:
    n = _node({0: {"mem_used": 30 * GiB, "temp": 40}, 1: {"mem_used": 0, "temp": 91}})
    assert RULE.limits(n, NOW, frozenset()) == ({0: 50 * GiB}, frozenset({1}))
    # On a GPU a job holds, what is in use may be the job's own: not counted against it.
    assert RULE.limits(n, NOW, frozenset({0})) == ({}, frozenset({1}))
    notes = RULE.notes(n, NOW, frozenset())
    assert notes == {0: "30G used outside gq, 50G free",
                     1: "too hot: 91C over 90C, no new jobs"}


def test_stale_telemetry_rules_nothing_out_and_is_shown_stale() -> None:
    n = _node({0: {"mem_used": 30 * GiB, "temp": 95}}, at=NOW - 11)
    assert not RULE.fresh(n, NOW)
    assert RULE.limits(n, NOW, frozenset()) == ({}, frozenset())
    assert RULE.notes(n, NOW, frozenset()) == {0: telemetry.STALE, 1: telemetry.STALE}
    assert RULE.fresh(n, NOW - 2)


def test_a_pass_is_due_only_when_readings_rule_out_less() -> None:
    hot, cool = ({}, frozenset({1})), ({}, frozenset())
    assert telemetry.eased(hot, cool) and not telemetry.eased(cool, hot)
    assert telemetry.eased(({0: 10 * GiB}, frozenset()), ({0: 40 * GiB}, frozenset()))
    assert telemetry.eased(({0: 10 * GiB}, frozenset()), cool)  # all of it freed
    assert not telemetry.eased(({0: 10 * GiB}, frozenset()), ({0: 10 * GiB + 5}, frozenset()))


def _limited(name: str, vram_free: dict[int, int] | None = None, hot: frozenset[int] = frozenset(),
             **kw) -> NodeView:
    base = node(name, n=2, **kw)
    return NodeView(name=base.name, gpus=base.gpus, free=base.free, cpus_free=base.cpus_free,
                    mem_free=base.mem_free, vram_free=vram_free or {}, hot=hot)


def _plan(nodes: list[NodeView], jobs: list) -> Plan:
    return plan(Snapshot(nodes=tuple(nodes), pending=tuple(jobs)), NOW, POLICY)


def test_a_gpu_short_of_measured_vram_is_not_offered() -> None:
    n = _limited("n1", vram_free={0: 34 * GiB})
    assert starts(_plan([n], [job(1, gpu_mem=40 * GiB)])) == {1: {"n1": (1,)}}
    # A job that fits in what is left (or names no --gpu-mem) may still have GPU 0.
    assert starts(_plan([n], [job(1, gpu_mem=40 * GiB), job(2, gpu_mem=20 * GiB)])) == {
        1: {"n1": (1,)}, 2: {"n1": (0,)}}
    assert starts(_plan([n], [job(1, 2)])) == {1: {"n1": (0, 1)}}


def test_a_hot_gpu_gets_no_job() -> None:
    n = _limited("n1", hot=frozenset({0}))
    assert starts(_plan([n], [job(1)])) == {1: {"n1": (1,)}}
    p = _plan([n], [job(1, 2)])
    assert p.starts == [] and p.reasons[1] == RESOURCES


def test_pending_reason_names_the_gpus_telemetry_skips() -> None:
    # GPU 1 is busy, GPU 0 (64G) has 30G held by a stray process: the 40G job waits, saying why.
    n = _limited("n1", vram_free={0: 34 * GiB}, used=(1,))
    pending = (job(1, gpu_mem=40 * GiB), job(2, gpu_mem=40 * GiB), job(3, gpu_mem=40 * GiB))
    result = _plan([n], list(pending))
    assert result.starts == []
    records = [Job(id=j.id, spec=JobSpec(script="true"), submit_time=NOW) for j in pending]
    got = dict((j.id, r) for j, r in reasons.planned(records, pending, result, (n,)))
    assert got[1] == "Resources (telemetry skips n1:0 VRAM held outside gq)"
    assert got[2] == PRIORITY  # Priority jobs wait behind it, whatever the GPUs
    hot = _limited("n1", hot=frozenset({0}), used=(1,))
    result = _plan([hot], [pending[0]])
    ((_, reason),) = reasons.planned(records[:1], pending[:1], result, (hot,))
    assert reason == "Resources (telemetry skips n1:0 too hot)"
    # Without telemetry limits the reason is plain Resources, as before.
    plain = node("n1", n=2, used=(0, 1))
    result = _plan([plain], [pending[0]])
    assert reasons.planned(records[:1], pending[:1], result, (plain,)) == [(records[0], RESOURCES)]
