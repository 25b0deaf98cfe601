"""Multifactor priority (v1: QOS weight and age); higher runs first."""

from __future__ import annotations

from gq.sched.types import PendingJob, Policy


def priority(job: PendingJob, now: float, policy: Policy) -> int:
    age = max(0.0, now - job.submit_time)
    # Age grows linearly to its cap so that every job eventually outranks newer work.
    age_factor = min(age / policy.max_age_s, 1.0) if policy.max_age_s else 0.0
    qos = policy.qos_priority.get(job.qos, 0)
    return int(qos * policy.weight_qos + age_factor * policy.weight_age) + job.nice


def order(jobs: tuple[PendingJob, ...], now: float, policy: Policy) -> list[tuple[int, PendingJob]]:
    """Jobs with their priority, highest first; ties go to the older submission."""
    ranked = [(priority(j, now, policy), j) for j in jobs]
    ranked.sort(key=lambda pj: (-pj[0], pj[1].submit_time, pj[1].id))
    return ranked
