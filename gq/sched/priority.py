"""Multifactor priority: QOS weight, age (capped), fair share and an admin nudge; higher runs first."""

from __future__ import annotations

from collections.abc import Mapping

from gq.sched.types import PendingJob, Policy


def factors(job: PendingJob, now: float, policy: Policy, usage: Mapping[str, float],
            total_usage: float, users: int) -> dict[str, int]:
    """Each factor's points, so `gq show` can say why a job ranks where it does."""
    age = max(0.0, now - job.submit_time)
    # Age grows linearly to its cap so that every job eventually outranks newer work.
    age_factor = min(age / policy.max_age_s, 1.0) if policy.max_age_s else 0.0
    fair = 1.0
    if policy.weight_fairshare and total_usage > 0 and users > 0:
        # Slurm's classic 2^(-usage/share), with equal shares among users who have usage.
        share = 1.0 / users
        fair = 2.0 ** (-(usage.get(job.user, 0.0) / total_usage) / share)
    return {"qos": policy.qos_priority.get(job.qos, 0) * policy.weight_qos,
            "age": int(age_factor * policy.weight_age),
            "fairshare": int(fair * policy.weight_fairshare), "nice": job.nice}


def priority(job: PendingJob, now: float, policy: Policy,
             usage: Mapping[str, float] | None = None) -> int:
    usage = usage or {}
    return sum(factors(job, now, policy, usage, sum(usage.values()), len(usage)).values())


def order(jobs: tuple[PendingJob, ...], now: float, policy: Policy,
          usage: Mapping[str, float] | None = None) -> list[tuple[int, PendingJob]]:
    """Jobs with their priority, highest first; ties go to the older submission."""
    usage = usage or {}
    total, users = sum(usage.values()), len(usage)
    ranked = [(sum(factors(j, now, policy, usage, total, users).values()), j) for j in jobs]
    ranked.sort(key=lambda pj: (-pj[0], pj[1].submit_time, pj[1].id))
    return ranked
