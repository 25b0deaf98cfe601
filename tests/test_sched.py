"""Unit tests for the pure scheduler (gq.sched): priority order, best-fit placement, gang starts."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gq
from gq.model import Gpu
from gq.sched import RunningJob, NodeView, PendingJob, Plan, Policy, Snapshot, Start, plan
from gq.sched.plan import NEVER_FITS, PRIORITY, RESOURCES
from gq.sched.priority import order, priority

GiB = 1024**3
NOW = 1_000_000.0
POLICY = Policy(qos_priority={"free": 1, "normal": 10, "pro": 100})


def node(name: str, n: int = 8, used: tuple[int, ...] = (), gtype: str = "h100",
         mem: int = 80 * GiB, cpus_free: int = 64, mem_free: int = 512 * GiB,
         schedulable: bool = True, gpus: tuple[Gpu, ...] | None = None) -> NodeView:
    gpus = gpus if gpus is not None else tuple(Gpu(index=i, type=gtype, memory=mem)
                                               for i in range(n))
    free = frozenset(g.index for g in gpus) - set(used)
    return NodeView(name=name, gpus=gpus, free=free, cpus_free=cpus_free, mem_free=mem_free,
                    schedulable=schedulable)


def job(job_id: int, gpus: int = 1, *, qos: str = "normal", age: float = 0.0, **kw) -> PendingJob:
    return PendingJob(id=job_id, qos=qos, submit_time=NOW - age + job_id * 1e-3, gpus=gpus, **kw)


def run(nodes: list[NodeView], jobs: list[PendingJob], policy: Policy = POLICY) -> Plan:
    """The plan, with `reasons` filled in for every job that did not start (`Plan.reason`, as
    the head reads them)."""
    return completed(plan(Snapshot(nodes=tuple(nodes), pending=tuple(jobs)), NOW, policy), jobs)


def completed(p: Plan, jobs: Iterable[PendingJob]) -> Plan:
    started = {s.job_id for s in p.starts}
    for j in jobs:
        if j.id not in started and (reason := p.reason(j)) is not None:
            p.reasons[j.id] = reason
    return p


def starts(p: Plan) -> dict[int, dict[str, tuple[int, ...]]]:
    return {s.job_id: s.alloc for s in p.starts}


# ---------------------------------------------------------------- placement


def test_one_gpu_job_goes_to_busiest_node_that_fits():
    nodes = [node("idle"), node("half", used=(0, 1, 2, 3)), node("busy", used=(0, 1, 2, 3, 4, 5)),
             node("full", used=tuple(range(8)))]
    p = run(nodes, [job(1)])
    assert starts(p) == {1: {"busy": (6,)}}
    assert p.reasons == {}


def test_small_jobs_pack_and_leave_idle_node_whole():
    nodes = [node("a"), node("b", used=(0,))]
    p = run(nodes, [job(i) for i in range(1, 8)] + [job(100, 8)])
    got = starts(p)
    assert all(list(got[i]) == ["b"] for i in range(1, 8))
    assert got[100] == {"a": tuple(range(8))}
    assert sorted(g for i in range(1, 8) for g in got[i]["b"]) == list(range(1, 8))


def test_eight_gpu_job_gets_whole_idle_node():
    nodes = [node("busy", used=(3,)), node("idle")]
    p = run(nodes, [job(1, 8)])
    assert p.starts == [Start(job_id=1, alloc={"idle": (0, 1, 2, 3, 4, 5, 6, 7)})]


def test_best_fit_ties_broken_by_name():
    p = run([node("b"), node("a")], [job(1)])
    assert starts(p) == {1: {"a": (0,)}}


# ---------------------------------------------------------------- reasons


def test_resources_then_priority_for_blocked_jobs():
    nodes = [node("n1", used=(0, 1, 2, 3)), node("n2", used=(0, 1, 2, 3, 4))]
    jobs = [job(1, 8, age=300), job(2, 6, age=200), job(3, 5, age=100)]
    p = run(nodes, jobs)
    assert p.starts == []
    assert p.reasons == {1: RESOURCES, 2: PRIORITY, 3: PRIORITY}
    assert RESOURCES == "Resources" and PRIORITY == "Priority"


def test_job_that_fits_after_a_blocked_one_starts_only_if_it_delays_no_reservation():
    # GPUs 0-3 are held by a job that ends in an hour: job 1 (8 GPUs) reserves the node then.
    running = (RunningJob(id=9, qos="normal", alloc={"n1": (0, 1, 2, 3)}, start_time=NOW,
                          time_limit_s=3600),)
    short, long_ = job(2, 2, time_limit_s=600), job(3, 2, time_limit_s=7200)
    p = plan(Snapshot(nodes=(node("n1", used=(0, 1, 2, 3)),),
                      pending=(job(1, 8, age=100, time_limit_s=3600), short, long_),
                      running=running), NOW, POLICY)
    assert starts(p) == {2: {"n1": (4, 5)}}
    assert p.reasons == {1: RESOURCES, 3: PRIORITY}
    assert p.reservations[1].start == NOW + 3600


@pytest.mark.parametrize("kw", [
    {"gpus": 9},
    {"gpus": 1, "gpu_type": "b200"},
    {"gpus": 1, "gpu_mem": 81 * GiB},
    {"gpus": 8, "gpu_type": "a100"},  # only 4 a100s on the mixed node
    {"gpus": 1, "nodes": 4},  # three nodes in all
])
def test_never_fitting_job_gets_req_node_not_avail(kw):
    mixed = tuple(Gpu(index=i, type="a100", memory=40 * GiB) for i in range(4)) + tuple(
        Gpu(index=i, type="l4", memory=24 * GiB) for i in range(4, 8))
    nodes = [node("n1"), node("n2", used=(0,)), node("mixed", gpus=mixed)]
    p = run(nodes, [PendingJob(id=1, qos="normal", submit_time=NOW, **kw)])
    assert p.starts == []
    assert p.reasons == {1: NEVER_FITS}
    assert NEVER_FITS == "ReqNodeNotAvail"


def test_never_fitting_job_does_not_make_later_jobs_wait_for_priority():
    nodes = [node("n1", used=tuple(range(8)))]
    p = run(nodes, [job(1, 9, age=100), job(2, 1)])
    assert p.reasons == {1: NEVER_FITS, 2: RESOURCES}


def test_empty_cluster_and_empty_queue():
    assert run([], []).starts == []
    p = run([], [job(1)])
    assert p.reasons == {1: NEVER_FITS}


# ---------------------------------------------------------------- priority


def test_higher_qos_starts_first_when_one_slot_is_free():
    nodes = [node("n1", used=tuple(range(7)))]
    jobs = [job(1, qos="free", age=3600), job(2, qos="normal", age=1800), job(3, qos="pro")]
    p = run(nodes, jobs)
    assert starts(p) == {3: {"n1": (7,)}}
    assert p.reasons == {2: RESOURCES, 1: PRIORITY}
    assert priority(jobs[2], NOW, POLICY) > priority(jobs[1], NOW, POLICY) \
        > priority(jobs[0], NOW, POLICY)


def test_older_job_wins_among_equal_qos():
    nodes = [node("n1", used=tuple(range(7)))]
    young = PendingJob(id=1, qos="normal", submit_time=NOW - 10)
    old = PendingJob(id=2, qos="normal", submit_time=NOW - 86400)
    p = run(nodes, [young, old])
    assert starts(p) == {2: {"n1": (7,)}}
    assert p.reasons == {1: RESOURCES}
    assert priority(old, NOW, POLICY) > priority(young, NOW, POLICY)


def test_exact_tie_goes_to_earlier_submission_then_lower_id():
    a = PendingJob(id=5, qos="normal", submit_time=NOW - 1)
    b = PendingJob(id=4, qos="normal", submit_time=NOW - 1)
    c = PendingJob(id=3, qos="normal", submit_time=NOW)
    assert [j.id for _, j in order((c, a, b), NOW, POLICY)] == [4, 5, 3]


def test_age_factor_is_linear_and_capped():
    policy = Policy(qos_priority={"normal": 10}, weight_qos=1000, weight_age=1000, max_age_s=100,
                    weight_ratio=0)
    at = lambda age: priority(PendingJob(id=1, qos="normal", submit_time=NOW - age),  # noqa: E731
                              NOW, policy)
    assert at(0) == 10_000
    assert at(50) == 10_500
    assert at(100) == 11_000
    assert at(10_000) == 11_000  # capped
    assert at(-500) == 10_000  # submitted "in the future" (clock skew): no negative age


def test_capped_age_cannot_beat_higher_qos():
    policy = Policy(qos_priority={"free": 1, "pro": 100}, max_age_s=100)
    ancient = PendingJob(id=1, qos="free", submit_time=NOW - 10**9)
    fresh = PendingJob(id=2, qos="pro", submit_time=NOW)
    assert priority(fresh, NOW, policy) > priority(ancient, NOW, policy)
    p = run([node("n1", used=tuple(range(7)))], [ancient, fresh], policy)
    assert set(starts(p)) == {2}


def test_unknown_qos_and_nice():
    policy = Policy(qos_priority={"normal": 10}, weight_age=0)
    assert priority(PendingJob(id=1, qos="mystery", submit_time=NOW), NOW, policy) == 0
    assert priority(PendingJob(id=1, qos="normal", submit_time=NOW, nice=-3), NOW, policy) == 9997
    assert priority(PendingJob(id=1, qos="normal", submit_time=NOW, nice=5), NOW, policy) == 10005


def test_max_age_zero_disables_age():
    policy = Policy(qos_priority={"normal": 1}, max_age_s=0, weight_ratio=0)
    assert priority(PendingJob(id=1, qos="normal", submit_time=0), NOW, policy) == 1000


# ---------------------------------------------------------------- filters


def test_gpu_type_filter_beats_best_fit():
    nodes = [node("a100s", gtype="a100", mem=40 * GiB, used=(0, 1, 2, 3, 4, 5, 6)),
             node("h100s", gtype="h100")]
    p = run(nodes, [job(1, gpu_type="h100"), job(2, gpu_type="H100"), job(3)])
    got = starts(p)
    assert list(got[1]) == ["h100s"] and list(got[2]) == ["h100s"]
    assert got[3] == {"a100s": (7,)}


def test_gpu_mem_filter():
    nodes = [node("small", gtype="l4", mem=24 * GiB, used=(0, 1)), node("big", mem=80 * GiB)]
    p = run(nodes, [job(1, gpu_mem=40 * GiB), job(2, gpu_mem=24 * GiB)])
    assert list(starts(p)[1]) == ["big"]
    assert list(starts(p)[2]) == ["small"]  # exactly enough VRAM is enough


def test_mixed_node_gives_only_matching_gpus():
    mixed = tuple(Gpu(index=i, type="a100", memory=40 * GiB) for i in range(4)) + tuple(
        Gpu(index=i, type="l4", memory=24 * GiB) for i in range(4, 8))
    nodes = [NodeView(name="m", gpus=mixed, free=frozenset({0, 2, 4, 5, 6, 7}), cpus_free=8,
                      mem_free=GiB)]
    p = run(nodes, [job(1, 3, gpu_type="l4"), job(2, 2, gpu_type="a100"), job(3, 1, gpu_type="l4"),
                    job(4, 1, gpu_type="a100")])
    assert starts(p) == {1: {"m": (4, 5, 6)}, 2: {"m": (0, 2)}, 3: {"m": (7,)}}
    assert p.reasons == {4: RESOURCES}


# ---------------------------------------------------------------- gang, drain, cpus/mem


def test_gang_job_gets_distinct_nodes():
    nodes = [node("n1"), node("n2", used=(0,)), node("n3")]
    p = run(nodes, [job(1, 8, nodes=2)])
    alloc = starts(p)[1]
    assert sorted(alloc) == ["n1", "n3"]
    assert all(g == tuple(range(8)) for g in alloc.values())


def test_gang_job_gets_all_nodes_or_nothing():
    nodes = [node("n1"), node("n2", used=(0,))]
    running = (RunningJob(id=9, qos="normal", alloc={"n2": (0,)}, start_time=NOW,
                          time_limit_s=3600),)
    p = plan(Snapshot(nodes=tuple(nodes), pending=(job(1, 8, nodes=2, age=100, time_limit_s=60),
                                                   job(2, 8, time_limit_s=60)),
                      running=running), NOW, POLICY)
    # The gang job cannot start; its partial fit does not hold n1 now, and job 2 ends (by its
    # limit) long before the gang job's reservation, so it may use n1 meanwhile.
    assert p.reasons == {1: RESOURCES}
    assert starts(p) == {2: {"n1": tuple(range(8))}}
    assert set(p.reservations[1].alloc) == {"n1", "n2"}


def test_gang_job_of_one_gpu_per_node():
    nodes = [node("n1", used=(0, 1)), node("n2", used=(0, 1, 2, 3, 4, 5, 6)), node("n3")]
    alloc = starts(run(nodes, [job(1, 1, nodes=2)]))[1]
    assert alloc == {"n2": (7,), "n1": (2,)}
    assert list(alloc) == ["n2", "n1"]  # best fit per rank, busiest first


def test_non_schedulable_nodes_are_never_used():
    nodes = [node("drained", schedulable=False), node("down", schedulable=False, used=(0,)),
             node("up", used=(0, 1, 2, 3, 4, 5))]
    p = run(nodes, [job(2), job(3), job(4)])
    used = {n for alloc in starts(p).values() for n in alloc}
    assert used == {"up"}
    assert len(starts(p)) == 2


def test_cpu_and_memory_requests_are_respected():
    fewcpu = node("fewcpu", cpus_free=2, used=tuple(range(7)))
    lowmem = node("lowmem", mem_free=4 * GiB, used=tuple(range(6)))
    roomy = node("roomy", cpus_free=64, mem_free=512 * GiB)
    # Best fit would pick the busy node; its CPUs or memory rule it out.
    assert starts(run([fewcpu, roomy], [job(1, cpus=4)])) == {1: {"roomy": (0,)}}
    assert starts(run([lowmem, roomy], [job(1, mem=8 * GiB)])) == {1: {"roomy": (0,)}}
    # Exactly enough is enough.
    assert starts(run([fewcpu, roomy], [job(1, cpus=2)])) == {1: {"fewcpu": (7,)}}
    assert starts(run([lowmem, roomy], [job(1, mem=4 * GiB)])) == {1: {"lowmem": (6,)}}
    # A gang job needs the CPUs on every node.
    p = run([fewcpu, roomy], [job(1, cpus=4, nodes=2)])
    assert p.starts == [] and p.reasons == {1: RESOURCES}


def test_cpu_and_memory_are_consumed_across_jobs():
    nodes = [node("n1", cpus_free=6, mem_free=10 * GiB)]
    p = run(nodes, [job(1, cpus=4, age=20), job(2, cpus=4, age=10), job(3, mem=11 * GiB),
                    job(4, cpus=2, mem=10 * GiB)])
    assert set(starts(p)) == {1, 4}
    assert set(p.reasons) == {2, 3}



@pytest.mark.parametrize("explain", [True, False])
@pytest.mark.parametrize("age", [0.0, 3 * 86400.0])
def test_gpuless_job_starts_on_free_cpus_while_every_gpu_is_busy(explain, age):
    """A CPU-only job behind GPU jobs that wait for GPUs takes the free CPUs at once, young or
    aged, in gqd's pass and in gq sim's (an idle CPU must not wait for a GPU)."""
    full = node("n1", used=tuple(range(8)), cpus_free=8)
    policy = dataclasses.replace(POLICY, explain=explain)
    p = run([full], [job(1, age=age), job(2, gpus=0, cpus=4, age=age),
                     job(3, gpus=0, cpus=8, age=age)], policy)
    assert starts(p) == {2: {"n1": ()}}
    assert p.reasons[1] == RESOURCES and 3 in p.reasons  # job 3 needs more CPUs than are left

# ---------------------------------------------------------------- GPU sharing (--share)


def shared_run(job_id: int, gpus: tuple[int, ...], mem: int, name: str = "n1",
               qos: str = "normal") -> RunningJob:
    return RunningJob(id=job_id, qos=qos, alloc={name: gpus}, start_time=NOW - 100,
                      time_limit_s=3600, share_mem=mem)


def test_sharing_jobs_fill_one_gpu_while_their_vram_fits():
    # 80 GiB GPUs: three 20 GiB sharers and a 20 GiB one fit on GPU 0; the fifth goes next door.
    p = run([node("n1", n=2)], [job(i, share=True, gpu_mem=20 * GiB, time_limit_s=600)
                                for i in range(1, 6)])
    assert starts(p) == {1: {"n1": (0,)}, 2: {"n1": (0,)}, 3: {"n1": (0,)}, 4: {"n1": (0,)},
                         5: {"n1": (1,)}}


def test_sharing_job_joins_a_running_sharer_and_respects_its_vram():
    # GPU 0 holds a 60 GiB sharer: a 20 GiB sharer joins it, a 30 GiB one cannot and takes GPU 1.
    nodes = [node("n1", n=2, used=(0,))]
    state = Snapshot(nodes=tuple(nodes), running=(shared_run(50, (0,), 60 * GiB),),
                     pending=(job(1, share=True, gpu_mem=20 * GiB, time_limit_s=60),
                              job(2, share=True, gpu_mem=30 * GiB, time_limit_s=60)))
    p = plan(state, NOW, POLICY)
    assert starts(p) == {1: {"n1": (0,)}, 2: {"n1": (1,)}}


def test_sharing_needs_no_free_gpu():
    # Every GPU is held, GPU 1 only by a sharer: a sharing job still starts there.
    nodes = [node("n1", n=2, used=(0, 1))]
    running = (RunningJob(id=50, qos="normal", alloc={"n1": (0,)}, start_time=NOW - 10,
                          time_limit_s=3600), shared_run(51, (1,), 10 * GiB))
    state = Snapshot(nodes=tuple(nodes), running=running,
                     pending=(job(1, 2), job(2, share=True, gpu_mem=10 * GiB, time_limit_s=60)))
    p = plan(state, NOW, POLICY)
    assert starts(p) == {2: {"n1": (1,)}}


def test_sharing_and_exclusive_jobs_never_mix_on_a_gpu():
    nodes = [node("n1", n=2, used=(0, 1))]
    # GPU 0 exclusive, GPU 1 shared: the exclusive job gets neither, the sharer only GPU 1.
    running = (RunningJob(id=50, qos="normal", alloc={"n1": (0,)}, start_time=NOW - 10,
                          time_limit_s=3600), shared_run(51, (1,), 10 * GiB))
    state = Snapshot(nodes=tuple(nodes), running=running,
                     pending=(job(1), job(2, share=True, gpu_mem=10 * GiB, time_limit_s=60)))
    p = plan(state, NOW, POLICY)
    assert starts(p) == {2: {"n1": (1,)}}
    assert p.reasons == {1: RESOURCES}
    # And on a free GPU taken by a sharer in this pass, a later exclusive job does not land.
    p = run([node("n2", n=1)], [job(1, share=True, gpu_mem=10 * GiB, time_limit_s=60, age=10),
                                job(2, time_limit_s=60)])
    assert starts(p) == {1: {"n2": (0,)}}
    assert 2 in p.reasons


def test_sharing_job_too_big_for_any_gpu_never_fits():
    p = run([node("n1", mem=24 * GiB)], [job(1, share=True, gpu_mem=40 * GiB)])
    assert p.reasons == {1: NEVER_FITS}


def test_sharing_jobs_are_not_preemption_victims():
    policy = Policy(qos_priority={"free": 1, "pro": 100}, preempts={"pro": ("free",)},
                    preempt_exempt_s=0)
    state = Snapshot(nodes=(node("n1", n=1, used=(0,)),),
                     running=(shared_run(50, (0,), 10 * GiB, qos="free"),),
                     pending=(job(1, qos="pro"),))
    assert plan(state, NOW, policy).preemptions == []


# ---------------------------------------------------------------- pools (guaranteed nodes per QOS)

POOLS = Policy(qos_priority={"free": 1, "normal": 10, "pro": 100}, preempt_exempt_s=0,
               pools={"pro": frozenset({"pool1"})})


def test_other_qos_borrow_a_pool_only_when_nothing_else_fits():
    nodes = [node("pool1"), node("general", used=(0, 1, 2, 3, 4, 5))]
    # Two 1-GPU jobs fit on the general node; the third must borrow the pool.
    p = run(nodes, [job(i) for i in (1, 2, 3)], POOLS)
    assert {j: next(iter(a)) for j, a in starts(p).items()} == {1: "general", 2: "general",
                                                               3: "pool1"}


def test_owner_jobs_prefer_their_pool():
    nodes = [node("general", used=(0,)), node("pool1", used=(0,))]
    p = run(nodes, [job(1, qos="pro")], POOLS)
    assert starts(p) == {1: {"pool1": (1,)}}


def test_a_pool_is_not_lent_while_its_owner_waits():
    # The owner's 8-GPU job waits for pool1 (held); a 1-GPU normal job may not borrow pool1's
    # last free GPU meanwhile.
    nodes = [node("pool1", used=(0,)), node("general", used=tuple(range(8)))]
    p = run(nodes, [job(1, 8, qos="pro", age=10), job(2)], POOLS)
    assert starts(p) == {}
    assert set(p.reasons) == {1, 2}


def test_owner_takes_back_borrowed_nodes_from_any_qos():
    # normal jobs (which no QOS "preempts") borrowed pool1; a pro job needing it back gets
    # them preempted, and only those on its pool: the general node's job is left alone.
    running = (RunningJob(id=50, qos="normal", alloc={"pool1": tuple(range(8))},
                          start_time=NOW - 1000, time_limit_s=86400),
               RunningJob(id=51, qos="normal", alloc={"general": tuple(range(8))},
                          start_time=NOW - 10, time_limit_s=86400))
    nodes = (node("pool1", used=tuple(range(8))), node("general", used=tuple(range(8))))
    state = Snapshot(nodes=nodes, running=running, pending=(job(1, 8, qos="pro"),))
    p = plan(state, NOW, POOLS)
    assert [(x.victim, x.for_job) for x in p.preemptions] == [(50, 1)]
    # Without the pool, pro may preempt nobody here.
    no_pool = Policy(qos_priority=POOLS.qos_priority, preempt_exempt_s=0)
    assert plan(state, NOW, no_pool).preemptions == []


def test_owner_does_not_preempt_its_own_qos_on_its_pool():
    running = (RunningJob(id=50, qos="pro", alloc={"pool1": tuple(range(8))},
                          start_time=NOW - 1000, time_limit_s=86400),)
    state = Snapshot(nodes=(node("pool1", used=tuple(range(8))),), running=running,
                     pending=(job(1, 8, qos="pro"),))
    assert plan(state, NOW, POOLS).preemptions == []


# ---------------------------------------------------------------- properties

_TYPES = ["h100", "a100", "l4"]


@st.composite
def snapshots(draw) -> Snapshot:
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        n = draw(st.integers(1, 8))
        gpus = tuple(Gpu(index=g, type=draw(st.sampled_from(_TYPES)),
                         memory=draw(st.sampled_from([24, 40, 80])) * GiB) for g in range(n))
        free = frozenset(draw(st.sets(st.integers(0, n - 1))))
        nodes.append(NodeView(name=f"n{i}", gpus=gpus, free=free,
                              cpus_free=draw(st.integers(0, 32)),
                              mem_free=draw(st.integers(0, 64)) * GiB,
                              schedulable=draw(st.booleans() | st.just(True))))
    jobs = [PendingJob(id=j, qos=draw(st.sampled_from(["free", "normal", "pro", "other"])),
                       submit_time=NOW - draw(st.integers(-10, 10**6)),
                       nodes=draw(st.integers(1, 2)), gpus=draw(st.integers(0, 8)),
                       gpu_type=draw(st.none() | st.sampled_from(_TYPES + ["b200"])),
                       gpu_mem=draw(st.none() | st.sampled_from([24 * GiB, 40 * GiB, 80 * GiB])),
                       cpus=draw(st.integers(0, 8)), mem=draw(st.integers(0, 16)) * GiB)
            for j in range(1, draw(st.integers(1, 30)) + 1)]
    # Some jobs share their GPUs (with a VRAM need), and some held GPUs are held by sharers.
    jobs = [PendingJob(**{**j.__dict__, "share": True, "gpu_mem": j.gpu_mem or 8 * GiB,
                          "time_limit_s": 600})
            if draw(st.booleans()) else j for j in jobs]
    running = []
    for n in nodes:
        for g in sorted(set(range(len(n.gpus))) - n.free):
            if draw(st.booleans()):
                running.append(RunningJob(id=1000 + len(running), qos="normal",
                                          alloc={n.name: (g,)}, start_time=NOW - 5,
                                          time_limit_s=draw(st.integers(1, 7200)),
                                          share_mem=draw(st.sampled_from([0, 8, 30])) * GiB))
    return Snapshot(nodes=tuple(nodes), pending=tuple(jobs), running=tuple(running))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_plan_invariants(state: Snapshot):
    p = plan(state, NOW, POLICY)
    nodes = {n.name: n for n in state.nodes}
    jobs = {j.id: j for j in state.pending}
    taken: set[tuple[str, int]] = set()
    # VRAM already taken by sharers on each GPU held only by sharing jobs.
    shared_vram = {(name, g): r.share_mem for r in state.running if r.share_mem
                   for name, gpus in r.alloc.items() for g in gpus}
    cpus = {n.name: 0 for n in state.nodes}
    mem = {n.name: 0 for n in state.nodes}
    started = [s.job_id for s in p.starts]
    assert len(started) == len(set(started))
    for s in p.starts:
        j = jobs[s.job_id]
        assert len(s.alloc) == j.nodes  # distinct nodes (dict keys), exactly job.nodes of them
        for name, gpu_ids in s.alloc.items():
            nv = nodes[name]
            assert nv.schedulable
            assert len(gpu_ids) == j.gpus == len(set(gpu_ids))
            by_index = {g.index: g for g in nv.gpus}
            for g in gpu_ids:
                if j.share:  # a free GPU, or one only sharers hold, while the VRAM sum fits
                    assert g in nv.free or (name, g) in shared_vram, f"{name}:{g} is exclusive"
                    assert (name, g) not in taken, f"sharer {j.id} on exclusive {name}:{g}"
                    shared_vram[(name, g)] = shared_vram.get((name, g), 0) + j.gpu_mem
                    assert shared_vram[(name, g)] <= by_index[g].memory, f"VRAM of {name}:{g}"
                    continue
                assert g in nv.free, f"job {j.id} got busy GPU {name}:{g}"
                assert (name, g) not in taken and (name, g) not in shared_vram, \
                    f"GPU {name}:{g} given twice"
                taken.add((name, g))
                assert j.gpu_type is None or by_index[g].type == j.gpu_type
                assert j.gpu_mem is None or by_index[g].memory >= j.gpu_mem
            cpus[name] += j.cpus
            mem[name] += j.mem
    for name, nv in nodes.items():
        assert cpus[name] <= nv.cpus_free and mem[name] <= nv.mem_free
    # Every pending job either starts or says why not, never both; the priorities the pass
    # worked out are the jobs' own.
    p = completed(p, state.pending)
    assert set(started) | set(p.reasons) == set(jobs)
    assert not set(started) & set(p.reasons)
    assert set(p.reasons.values()) <= {RESOURCES, PRIORITY, NEVER_FITS}
    assert all(p.priorities[j.id] == priority(j, NOW, POLICY)
               for j in state.pending if j.id in p.priorities)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_plan_is_deterministic_and_does_not_mutate_snapshot(state: Snapshot):
    before = repr(state)
    first, second = plan(state, NOW, POLICY), plan(state, NOW, POLICY)
    assert first == second
    assert repr(state) == before
    first = completed(first, state.pending)
    # ReqNodeNotAvail exactly when too few nodes have enough matching GPUs, even all idle.
    for job_id, reason in first.reasons.items():
        j = next(j for j in state.pending if j.id == job_id)
        hosts = sum(1 for n in state.nodes
                    if sum(1 for g in n.gpus if (j.gpu_type is None or g.type == j.gpu_type)
                           and (j.gpu_mem is None or g.memory >= j.gpu_mem)) >= j.gpus)
        assert (reason == NEVER_FITS) == (hosts < j.nodes)


# ---------------------------------------------------------------- purity

FORBIDDEN = {"sqlite3", "zmq", "typer", "rich", "msgpack"}
PKG = Path(gq.__file__).parent
PURE_FILES = sorted(PKG.glob("sched/*.py")) + [PKG / name for name in (
    "model.py", "units.py", "spec.py", "deps.py", "arrays.py", "optvalues.py", "hostlist.py",
    "features.py", "tasks.py")]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node_ in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node_, ast.Import):
            names.update(alias.name for alias in node_.names)
        elif isinstance(node_, ast.ImportFrom) and node_.level == 0 and node_.module:
            names.add(node_.module)
    return names


@pytest.mark.parametrize("path", PURE_FILES, ids=lambda p: str(p.relative_to(PKG)))
def test_pure_core_imports_no_io_libraries(path: Path):
    bad = {n for n in _imports(path) if n.split(".")[0] in FORBIDDEN}
    assert not bad, f"{path.name} imports {sorted(bad)}"
    # And from the package itself, only the other pure modules.
    internal = {n for n in _imports(path) if n.split(".")[0] == "gq"}
    assert all(n in {"gq.model", "gq.units", "gq.errors", "gq.defaults", "gq.spec", "gq.deps",
                     "gq.arrays", "gq.optvalues", "gq.hostlist", "gq.features", "gq.tasks"}
               or n.startswith("gq.sched")
               for n in internal), internal


def test_pure_core_files_found():
    names = {str(p.relative_to(PKG)) for p in PURE_FILES}
    assert {"model.py", "sched/plan.py", "sched/placement.py", "sched/priority.py"} <= names


def test_importing_sched_loads_no_io_library():
    code = ("import sys, gq.sched, gq.model; "
            f"print(sorted(m for m in {sorted(FORBIDDEN)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    assert out == "[]"


def test_response_ratio_favours_short_jobs_and_grows_with_waiting():
    policy = Policy(qos_priority={"normal": 10}, weight_age=0)
    short = PendingJob(id=1, qos="normal", submit_time=NOW - 600, time_limit_s=600)
    long_ = PendingJob(id=2, qos="normal", submit_time=NOW - 600, time_limit_s=36_000)
    assert priority(short, NOW, policy) > priority(long_, NOW, policy)
    waited = PendingJob(id=3, qos="normal", submit_time=NOW - 10 * 36_000, time_limit_s=36_000)
    assert priority(waited, NOW, policy) > priority(short, NOW, policy)
