"""Behind a full cluster, a backlog of only preemptors' jobs goes to the lazy tail (issue 17):
the pass must decide exactly what the pass that considers each of them does, and visit only
what _preempt asks for."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gq.sched import NodeView, PendingJob, Policy, RunningJob, Snapshot, plan
from gq.sched.priority import Ranking
from gq.sched.queue import QueueIndex

# gq.sched exports the function `plan` under the module's name.
plan_module = importlib.import_module("gq.sched.plan")

from tests.test_sched_backfill import NOW, gpus  # noqa: E402

NAMES = ("n1", "n2", "n3")
POLICY = Policy(qos_priority={"normal": 10, "pro": 100, "free": 1}, reserve_depth=1,
                preempts={"pro": ("free",)}, preempt_exempt_s=0, reserve_age_s=100_000)


class _Considering(Ranking):
    """A Ranking that reports a keyed job, which keeps the pass on its one-by-one walk."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.keyed = True


@st.composite
def full_states(draw: st.DrawFn) -> Snapshot:
    """Every GPU taken (by normal and free jobs), a queue of GPU jobs of mixed QOS and ages."""
    runs = []
    for i, name in enumerate(NAMES):
        at = 0
        while at < 8:
            k = draw(st.sampled_from([1, 2, 4, 8 - at]))
            k = min(k, 8 - at)
            runs.append(RunningJob(id=1000 + len(runs), qos=draw(st.sampled_from(["normal", "free"])),
                                   alloc={name: tuple(range(at, at + k))},
                                   start_time=NOW - draw(st.integers(0, 9000)),
                                   time_limit_s=draw(st.sampled_from([0, 600, 3600, 20000]))))
            at += k
    jobs = tuple(PendingJob(id=i, qos=draw(st.sampled_from(["normal", "pro", "pro", "free"])),
                            submit_time=NOW - draw(st.sampled_from([0, 10, 5000, 200_000])) - i,
                            gpus=draw(st.sampled_from([1, 1, 2, 4, 8, 16])),
                            nodes=draw(st.sampled_from([1, 1, 2])),
                            time_limit_s=draw(st.sampled_from([0, 300, 3600])))
                 for i in range(draw(st.integers(1, 40))))
    nodes = tuple(NodeView(name=n, gpus=gpus(), free=frozenset(), cpus_free=64,
                           mem_free=1 << 40) for n in NAMES)
    return Snapshot(nodes=nodes, pending=jobs, running=tuple(runs))


@settings(max_examples=200, deadline=None)
@given(full_states(), st.booleans(), st.booleans(), st.sampled_from([1, 4]))
def test_the_lazy_tail_decides_as_considering_each_preemptor(
        state: Snapshot, explain: bool, indexed: bool, depth: int) -> None:
    policy = dataclasses.replace(POLICY, explain=explain, reserve_depth=depth)
    if indexed:
        index = QueueIndex(policy)
        index.sync(state.pending)
        state = dataclasses.replace(state, queue=index)
    lazy = plan(state, NOW, policy)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan_module, "Ranking", _Considering)
        walked = plan(state, NOW, policy)
    assert lazy.starts == walked.starts
    assert lazy.preemptions == walked.preemptions
    assert lazy.reservations == walked.reservations
    if explain:  # what gqd shows for every job
        assert [lazy.reason(j) for j in state.pending] == [walked.reason(j) for j in state.pending]


def test_a_full_cluster_does_not_visit_every_queued_preemptor(monkeypatch) -> None:
    """2,000 young pro jobs behind a full cluster of normal jobs (none preemptible): the pass
    considers a handful, not all of them; considering each (the walk kept for keyed jobs)
    visits them all."""
    runs = tuple(RunningJob(id=10_000 + i, qos="normal", alloc={n: tuple(range(8))},
                            start_time=NOW - 100, time_limit_s=3600) for i, n in enumerate(NAMES))
    jobs = tuple(PendingJob(id=i, qos="pro", submit_time=NOW - 10 - i, gpus=1 + i % 2,
                            time_limit_s=600 * (1 + i % 3)) for i in range(2000))
    nodes = tuple(NodeView(name=n, gpus=gpus(), free=frozenset(), cpus_free=64,
                           mem_free=1 << 40) for n in NAMES)
    state = Snapshot(nodes=nodes, pending=jobs, running=runs)
    calls = []
    consider = plan_module._Pass.consider
    monkeypatch.setattr(plan_module._Pass, "consider",
                        lambda self, job, may_reserve: (calls.append(job.id),
                                                        consider(self, job, may_reserve))[1])
    lazy = plan(state, NOW, POLICY)
    lazy_calls = len(calls)
    calls.clear()
    monkeypatch.setattr(plan_module, "Ranking", _Considering)
    walked = plan(state, NOW, POLICY)
    assert lazy.preemptions == walked.preemptions == []
    assert len(calls) >= 2000
    assert lazy_calls <= 10, lazy_calls
