"""A tier's young jobs merged from per-class lists (gq/sched/merge.py) come in exactly the order
the Ranking that ranks and sorts them all gives (issue 17), with fair share, nice, limits, users
and big jobs that age sooner."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from gq.sched import PendingJob, Policy
from gq.sched.priority import Ranking, priorities
from gq.sched.queue import QueueIndex

NOW = 1_000_000.0


@st.composite
def queues(draw: st.DrawFn) -> tuple[tuple[PendingJob, ...], dict[str, float], Policy]:
    jobs = tuple(PendingJob(id=i, qos=draw(st.sampled_from(["normal", "pro", "free"])),
                            submit_time=NOW - draw(st.sampled_from([0, 5, 600, 7200, 90_000,
                                                                    400_000])),
                            gpus=draw(st.sampled_from([1, 2, 8])),
                            nodes=draw(st.sampled_from([1, 1, 2])),
                            time_limit_s=draw(st.sampled_from([0, 300, 3600])),
                            nice=draw(st.sampled_from([0, 0, 50])),
                            user=draw(st.sampled_from(["a", "b", "c"])))
                 for i in range(draw(st.integers(0, 60))))
    usage = draw(st.sampled_from([{}, {"a": 500.0, "b": 1.0}]))
    policy = Policy(qos_priority={"normal": 10, "pro": 100, "free": 1},
                    weight_fairshare=draw(st.sampled_from([0, 700])),
                    reserve_age_s=draw(st.sampled_from([3600, 100_000])),
                    reserve_age_big_s=draw(st.sampled_from([0, 1800])),
                    max_age_s=draw(st.sampled_from([0, 86400])))
    return jobs, usage, policy


def _rank(policy: Policy, usage: dict[str, float]):  # type: ignore[no-untyped-def]
    def rank(jobs: list[PendingJob]) -> dict[int, int]:
        return dict(zip([j.id for j in jobs], priorities(jobs, NOW, policy, usage)))
    return rank


@settings(max_examples=300, deadline=None)
@given(queues(), st.integers(0, 70))
def test_merged_classes_give_the_sorted_order(drawn, take: int) -> None:
    jobs, usage, policy = drawn
    index = QueueIndex(policy)
    for job in jobs:  # one at a time, as the simulator's jobs come
        index.add(job)
    sorted_ = Ranking(jobs, NOW, policy, _rank(policy, usage))
    merged = Ranking(jobs, NOW, policy, _rank(policy, usage), index)
    a = [sorted_.next() for _ in range(take)]
    b = [merged.next() for _ in range(take)]
    assert [j and j.id for j in b] == [j and j.id for j in a]
    assert sorted(j.id for j in merged.rest()) == sorted(j.id for j in sorted_.rest())
    assert [j.id for j in iter(merged.next, None)] == [j.id for j in iter(sorted_.next, None)]


@settings(max_examples=100, deadline=None)
@given(queues(), st.lists(st.integers(0, 59), max_size=30))
def test_classes_follow_jobs_leaving_and_changing(drawn, gone: list[int]) -> None:
    """Synced to a changed queue (some jobs gone, some re-niced), the index's classes hold
    exactly the jobs left, each in submit order."""
    jobs, _, policy = drawn
    index = QueueIndex(policy)
    index.sync(jobs)
    left = tuple(dataclasses.replace(j, nice=j.nice + 1) if j.id % 5 == 0 else j
                 for j in jobs if j.id not in gone)
    index.sync(left)
    held = sorted(k[-1].id for keys in index.by_class.values() for k in keys)
    assert held == sorted(j.id for j in left)
    for keys in index.by_class.values():
        assert list(keys) == sorted(keys)
        assert len({(k[-1].qos, k[-1].nice, k[-1].user, k[-1].time_limit_s) for k in keys}) == 1
