"""Multifactor priority, and the order a pass takes jobs in.

Priority (shown by `gq show`) = QOS tier + age + fair share + response ratio + admin nice.
The response ratio, (wait + limit) / limit, favours short jobs but rises for every job as it
waits (HRRN); it is counted in log2 so a long wait cannot outgrow a QOS tier.

Order: QOS tiers are strict (as in Slurm). Within a tier, jobs that have waited `reserve_age_s`
go first, oldest first, which bounds every job's wait, 8-GPU jobs included; the rest go by
priority.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gq.sched.types import PendingJob, Policy

#: The length an unlimited job counts as in its response ratio (seconds): a week.
UNLIMITED_AS_S = 7 * 86400


def factors(job: PendingJob, now: float, policy: Policy, usage: Mapping[str, float],
            total_usage: float, users: int) -> dict[str, int]:
    """Each factor's points, so `gq show` can say why a job ranks where it does."""
    wait = max(0.0, now - job.submit_time)
    # Age grows linearly to its cap so that every job eventually outranks newer work.
    age_factor = min(wait / policy.max_age_s, 1.0) if policy.max_age_s else 0.0
    fair = 1.0
    if policy.weight_fairshare and total_usage > 0 and users > 0:
        # Slurm's classic 2^(-usage/share), with equal shares among users who have usage.
        share = 1.0 / users
        fair = 2.0 ** (-(usage.get(job.user, 0.0) / total_usage) / share)
    limit = job.time_limit_s or UNLIMITED_AS_S
    ratio = math.log2((wait + limit) / limit)
    return {"qos": policy.qos_priority.get(job.qos, 0) * policy.weight_qos,
            "age": int(age_factor * policy.weight_age),
            "fairshare": int(fair * policy.weight_fairshare),
            "ratio": int(ratio * policy.weight_ratio), "nice": job.nice}


def priority(job: PendingJob, now: float, policy: Policy,
             usage: Mapping[str, float] | None = None) -> int:
    usage = usage or {}
    return sum(factors(job, now, policy, usage, sum(usage.values()), len(usage)).values())


def order(jobs: tuple[PendingJob, ...], now: float, policy: Policy,
          usage: Mapping[str, float] | None = None) -> list[tuple[int, PendingJob]]:
    """Jobs with their priority, in the order a pass considers them (module docstring)."""
    usage = usage or {}
    total, users = sum(usage.values()), len(usage)
    if policy.weight_fairshare and total > 0:
        prios = [sum(factors(j, now, policy, usage, total, users).values()) for j in jobs]
    else:  # the common case, without a dict per job: this runs for the whole queue every pass
        prios = _fast_priorities(jobs, now, policy)
    tier = policy.qos_priority
    aged_before = now - policy.reserve_age_s
    # Sort plain tuples: tier, aged-first (oldest first), then priority. Ids are unique, so a
    # comparison never reaches the job itself, and no key function is needed.
    keyed = [(-tier.get(j.qos, 0), 0, j.submit_time, j.id, p, j) if j.submit_time <= aged_before
             else (-tier.get(j.qos, 0), 1, -p, j.submit_time, j.id, p, j)
             for p, j in zip(prios, jobs)]
    keyed.sort()
    return [(k[-2], k[-1]) for k in keyed]


def _fast_priorities(jobs: tuple[PendingJob, ...], now: float, policy: Policy) -> list[int]:
    """`priority` of every job when fair share contributes its full weight to everyone (no usage
    yet): the same sum, computed in one loop with the policy's figures in locals."""
    qos_points = {q: p * policy.weight_qos for q, p in policy.qos_priority.items()}
    max_age, w_age, w_ratio = policy.max_age_s, policy.weight_age, policy.weight_ratio
    fair, log2 = policy.weight_fairshare, math.log2
    # Per job: the age factor grows linearly to 1 at max_age, the ratio is log2 of
    # (wait + limit) / limit. Written out (not a call per job): it runs for every queued job.
    return [qos_points.get(j.qos, 0) + fair + j.nice
            + (int((w / max_age if w < max_age else 1.0) * w_age) if max_age else 0)
            + int(log2((w + (j.time_limit_s or UNLIMITED_AS_S)) / (j.time_limit_s or UNLIMITED_AS_S))
                  * w_ratio)
            for j in jobs for w in (max(now - j.submit_time, 0.0),)]
