"""Guaranteed shares (`Policy.min_share`): the GPUs a QOS's pending work may always claim.

While a QOS's running jobs hold less than its share of the schedulable GPUs, its pending jobs
are taken before every tier's, up to the share, so a flood of higher-tier work cannot starve
it; and its jobs within the share are no preemption victims.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gq.sched.types import Policy, RunningJob, Snapshot


def held(running: Iterable[RunningJob]) -> Counter[str]:
    """GPUs held per QOS (jobs being stopped hold none any more)."""
    gpus: Counter[str] = Counter()
    for run in running:
        if not run.ending:
            gpus[run.qos] += sum(len(g) for g in run.alloc.values())
    return gpus


def total_gpus(state: Snapshot) -> int:
    return sum(len(n.gpus) for n in state.nodes if n.schedulable)


def claims(policy: Policy, state: Snapshot, pending_qos: Iterable[str]) -> dict[str, float]:
    """QOS with pending jobs -> GPUs they may still claim under their share (> 0 only)."""
    wanted = [q for q in pending_qos if policy.min_share.get(q, 0) > 0]
    if not wanted:
        return {}
    total, gpus = total_gpus(state), held(state.running)
    room = {q: policy.min_share[q] * total - gpus[q] for q in wanted}
    return {q: r for q, r in room.items() if r > 0}


def preemptible(policy: Policy, state: Snapshot) -> dict[str, float]:
    """QOS with a share -> GPUs of its running jobs that may be preempted (those above it)."""
    if not policy.min_share:
        return {}
    total, gpus = total_gpus(state), held(state.running)
    return {q: max(0.0, gpus[q] - share * total) for q, share in policy.min_share.items()}
