"""What a replay is judged by: waits (overall, 1-GPU, >=8-GPU), JCT, slowdown, utilization, fairness.

Definitions, per finished job: wait = the time it spent pending (start - submit; for a
preempted job also each wait to run again), JCT = end - submit, service = the work it did (its trace runtime, or
less if its limit cut it short), bounded slowdown = max(1, JCT / max(service, TAU_S)), as the
reference simulator defines it. Utilization counts finished work only (GPU-seconds lost to
preemption are reported apart, also as a share of that useful work), over the cluster's GPUs
times the makespan (first submission to last end).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gq.defaults import BIG_JOB_GPUS
from gq.sim.engine import Outcome, SimResult

#: Runs shorter than this count as this long in bounded slowdown, so that a 1 s job waiting
#: 10 s is not "11x slowed down" (the usual tau of the batch-scheduling literature).
TAU_S = 10.0


@dataclass(frozen=True)
class WaitStats:
    count: int
    avg: float
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class Metrics:
    jobs: int
    #: Jobs still pending or running when the replay ran out of events (0 unless a policy stalls).
    unfinished: int
    #: Jobs larger than the cluster, refused at submit.
    rejected: int
    makespan_s: float
    utilization: float
    wait: WaitStats
    wait_1gpu: WaitStats
    wait_big: WaitStats
    avg_jct_s: float
    avg_bounded_slowdown: float
    #: Jain's index of mean bounded slowdown per group: 1.0 when every group is slowed alike.
    jain: float
    #: "user" or "qos": what the fairness groups are (the trace has users or it does not).
    jain_over: str
    jain_groups: int
    preemptions: int
    lost_gpu_h: float
    #: GPU-hours of finished work (what utilization counts).
    useful_gpu_h: float
    timeouts: int
    plan_calls: int
    wall_s: float
    #: QOS -> the wait of its jobs.
    wait_by_qos: dict[str, WaitStats] = field(default_factory=dict)
    #: Model affinity (with a cold-start model): runs of jobs with a cache key that started
    #: cold and warm, and the GPU-hours spent loading (counted in useful_gpu_h too).
    cold_starts: int = 0
    warm_starts: int = 0
    load_gpu_h: float = 0.0

    @property
    def lost_share(self) -> float:
        """Work lost to preemption as a share of the useful work."""
        return self.lost_gpu_h / self.useful_gpu_h if self.useful_gpu_h else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "lost_share": self.lost_share}


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, interpolating linearly (numpy's default)."""
    if not ordered:
        return 0.0
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def wait_stats(waits: Sequence[float]) -> WaitStats:
    ordered = sorted(waits)
    avg = sum(ordered) / len(ordered) if ordered else 0.0
    return WaitStats(count=len(ordered), avg=avg, p50=percentile(ordered, 50),
                     p95=percentile(ordered, 95), p99=percentile(ordered, 99),
                     max=ordered[-1] if ordered else 0.0)


def bounded_slowdown(wait: float, run: float, tau: float = TAU_S) -> float:
    return max(1.0, (wait + run) / max(run, tau))


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: (sum x)^2 / (n * sum x^2), 1.0 for equal values, 1/n at worst."""
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _wait(o: Outcome) -> float:
    """Time spent pending: for a preempted job, also each time it waited to run again (its
    runs before are not waiting; their lost work is counted apart)."""
    assert o.start is not None
    return o.waited_s


def _service(o: Outcome) -> float:
    """The work the job did: its runtime, or what its limit let its last run finish."""
    assert o.start is not None and o.end is not None
    return o.saved_s + (o.end - o.start)


def fairness(done: Sequence[Outcome]) -> tuple[float, str, int]:
    """Jain's index over users when the trace names any, else over QOS tiers."""
    by_user = any(o.job.user for o in done)
    groups: dict[str, list[float]] = defaultdict(list)
    for o in done:
        groups[o.job.user if by_user else o.job.qos].append(_slowdown(o))
    return jain([_mean(v) for v in groups.values()]), "user" if by_user else "qos", len(groups)


def _slowdown(o: Outcome) -> float:
    assert o.end is not None
    return max(1.0, (o.end - o.job.submit_time) / max(_service(o), TAU_S))


def summarize(result: SimResult) -> Metrics:
    done = [o for o in result.outcomes if o.end is not None]
    waits = [_wait(o) for o in done]
    first = min((o.job.submit_time for o in result.outcomes), default=0.0)
    makespan = max((o.end for o in done if o.end is not None), default=first) - first
    work = sum(_service(o) * o.job.total_gpus for o in done)
    capacity = result.cluster.total_gpus * makespan
    fair, over, groups = fairness(done)
    loads = result.loads
    by_qos: dict[str, list[float]] = defaultdict(list)
    for w, o in zip(waits, done):
        by_qos[o.job.qos].append(w)
    return Metrics(
        jobs=len(done), unfinished=len(result.outcomes) - len(done), rejected=len(result.rejected),
        makespan_s=makespan, utilization=work / capacity if capacity else 0.0,
        wait=wait_stats(waits),
        wait_1gpu=wait_stats([w for w, o in zip(waits, done) if o.job.total_gpus == 1]),
        wait_big=wait_stats([w for w, o in zip(waits, done) if o.job.total_gpus >= BIG_JOB_GPUS]),
        avg_jct_s=_mean([_end(o) - o.job.submit_time for o in done]),
        avg_bounded_slowdown=_mean([_slowdown(o) for o in done]),
        jain=fair, jain_over=over, jain_groups=groups,
        preemptions=result.preemptions,
        lost_gpu_h=sum(o.lost_gpu_s for o in result.outcomes) / 3600.0,
        useful_gpu_h=work / 3600.0,
        timeouts=sum(o.timed_out for o in done), plan_calls=result.plan_calls, wall_s=result.wall_s,
        wait_by_qos={q: wait_stats(w) for q, w in sorted(by_qos.items())},
        cold_starts=loads.cold if loads else 0, warm_starts=loads.warm if loads else 0,
        load_gpu_h=loads.load_gpu_s / 3600.0 if loads else 0.0)


def _end(o: Outcome) -> float:
    assert o.end is not None
    return o.end
