"""Unit tests of model affinity in the pure scheduler (gq/sched/affinity.py): warm GPUs first,
--cold-wait, and no reservation ever paid for it."""

from __future__ import annotations

import dataclasses

from gq.model import Gpu
from gq.sched import NodeView, PendingJob, Policy, RunningJob, Snapshot, plan
from gq.sched.affinity import WAITING_WARM

NOW = 1_000_000.0
POLICY = Policy(qos_priority={"normal": 10})


def node(name: str, n: int = 4, used: tuple[int, ...] = (),
         warm: dict[int, frozenset[str]] | None = None) -> NodeView:
    gpus = tuple(Gpu(index=i, type="h100", memory=80 * 2**30) for i in range(n))
    return NodeView(name=name, gpus=gpus, free=frozenset(range(n)) - set(used), cpus_free=64,
                    mem_free=2**40, warm=warm or {})


def job(job_id: int, **kw) -> PendingJob:
    return PendingJob(id=job_id, qos="normal", submit_time=NOW - 10 + job_id * 1e-3,
                      time_limit_s=600, **kw)


def starts(nodes: list[NodeView], jobs: list[PendingJob], running: tuple[RunningJob, ...] = ()
           ) -> dict[int, dict[str, tuple[int, ...]]]:
    result = plan(Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=running), NOW,
                  POLICY)
    return {s.job_id: s.alloc for s in result.starts}


def test_a_job_goes_to_the_gpu_where_its_key_is_warm() -> None:
    n = node("n1", warm={2: frozenset({"A"}), 3: frozenset({"B"})})
    assert starts([n], [job(1, cache_key="A")]) == {1: {"n1": (2,)}}
    assert starts([n], [job(1, cache_key="B")]) == {1: {"n1": (3,)}}
    # Without a key (or with a key warm nowhere) placement is the plain one: lowest index.
    assert starts([n], [job(1)]) == {1: {"n1": (0,)}}
    assert starts([n], [job(1, cache_key="C")]) == {1: {"n1": (0,)}}


def test_warm_beats_best_fit_between_nodes_but_not_a_pool() -> None:
    # Best fit would pick n1 (fewer free GPUs left); the key is warm on n2.
    n1, n2 = node("n1", used=(0, 1, 2)), node("n2", warm={1: frozenset({"A"})})
    assert starts([n1, n2], [job(1)]) == {1: {"n1": (3,)}}
    assert starts([n1, n2], [job(1, cache_key="A")]) == {1: {"n2": (1,)}}


def test_a_multi_gpu_job_takes_the_warm_gpus_first() -> None:
    n = node("n1", warm={1: frozenset({"A"}), 3: frozenset({"A", "B"})})
    assert starts([n], [job(1, gpus=2, cache_key="A")]) == {1: {"n1": (1, 3)}}
    assert starts([n], [job(1, gpus=2, cache_key="B")]) == {1: {"n1": (0, 3)}}


def test_cold_wait_waits_for_a_warm_gpu_then_takes_a_cold_one() -> None:
    busy = node("n1", used=(2,), warm={2: frozenset({"A"})})
    waiting = job(1, cache_key="A", cold_wait_until=NOW + 30)
    result = plan(Snapshot(nodes=(busy,), pending=(waiting,)), NOW, POLICY)
    assert result.starts == [] and result.reasons[1] == WAITING_WARM
    # Its wait over, it goes cold; with the warm GPU free, it goes warm at once.
    assert starts([busy], [dataclasses.replace(waiting, cold_wait_until=NOW - 1)]) \
        == {1: {"n1": (0,)}}
    assert starts([node("n1", warm={2: frozenset({"A"})})], [waiting]) == {1: {"n1": (2,)}}


def test_a_waiting_job_leaves_cold_gpus_to_others_of_its_shape() -> None:
    busy = node("n1", used=(2,), warm={2: frozenset({"A"})})
    got = starts([busy], [job(1, cache_key="A", cold_wait_until=NOW + 30), job(2), job(3)])
    assert set(got) == {2, 3}


def test_warm_preference_never_takes_a_reserved_gpu() -> None:
    # GPU 1 (warm for A) is free now but reserved for job 1 (4 GPUs) when GPUs 0, 2, 3 free up
    # at NOW + 100; a 600 s job of key A would delay it, so it must not take GPU 1, and may
    # take none of the others either: it waits (Priority), never on the warm GPU.
    running = (RunningJob(id=9, qos="normal", alloc={"n1": (0, 2, 3)}, start_time=NOW - 500,
                          time_limit_s=600),)
    n = node("n1", used=(0, 2, 3), warm={1: frozenset({"A"})})
    big = job(1, gpus=4)
    got = starts([n], [big, job(2, cache_key="A")], running)
    assert got == {}
    # A short one that ends before the reservation may take it, warm.
    assert starts([n], [big, dataclasses.replace(job(2, cache_key="A"), time_limit_s=50)],
                  running) == {2: {"n1": (1,)}}


SWAP = dataclasses.replace(POLICY, warm_swap_s=300)
NO_SWAP = dataclasses.replace(POLICY, warm_swap_s=0)


def test_a_young_cold_start_yields_its_gpu_to_a_queued_job_warm_there() -> None:
    # One GPU free (3), warm for B; the oldest job (key A) would take it cold.
    n = node("n1", used=(0, 1, 2), warm={3: frozenset({"B"})})
    jobs = [job(1, cache_key="A"), job(2, cache_key="B")]
    plain = plan(Snapshot(nodes=(n,), pending=tuple(jobs)), NOW, NO_SWAP)
    assert [s.job_id for s in plain.starts] == [1]
    # On by default (300 s).
    for policy in (SWAP, POLICY):
        swapped = plan(Snapshot(nodes=(n,), pending=tuple(jobs)), NOW, policy)
        assert [(s.job_id, s.alloc) for s in swapped.starts] == [(2, {"n1": (3,)})]
    assert 2 not in swapped.reasons and swapped.reasons[1]
    # Not once the cold job has waited warm_swap_s, nor for a job asking for more (a longer
    # limit than the slot it would take), nor for one of another key.
    old = dataclasses.replace(jobs[0], submit_time=NOW - 301)
    assert [s.job_id for s in plan(Snapshot(nodes=(n,), pending=(old, jobs[1])), NOW,
                                   SWAP).starts] == [1]
    longer = dataclasses.replace(jobs[1], time_limit_s=601)
    assert [s.job_id for s in plan(Snapshot(nodes=(n,), pending=(jobs[0], longer)), NOW,
                                   SWAP).starts] == [1]
    other = dataclasses.replace(jobs[1], cache_key="C")
    assert [s.job_id for s in plan(Snapshot(nodes=(n,), pending=(jobs[0], other)), NOW,
                                   SWAP).starts] == [1]
