"""Multifactor priority, and the order a pass takes jobs in.

Priority (shown by `gq show`) = QOS tier + age + fair share + response ratio + admin nice.
The response ratio, (wait + limit) / limit, favours short jobs but rises for every job as it
waits (HRRN); it is counted in log2 so a long wait cannot outgrow a QOS tier.

Order: QOS tiers are strict (as in Slurm). Within a tier, jobs that have waited `reserve_age_s`
go first, oldest first, which bounds every job's wait, 8-GPU jobs included; the rest go by
priority.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_right
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from gq.sched.merge import ClassKey, YoungMerge
from gq.sched.types import AgeKey, PendingJob, Policy, QueueOrder

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


def priorities(jobs: Sequence[PendingJob], now: float, policy: Policy,
               usage: Mapping[str, float] | None = None) -> list[int]:
    """`priority` of each job, in one loop."""
    usage = usage or {}
    total, users = sum(usage.values()), len(usage)
    if policy.weight_fairshare and total > 0:
        return [sum(factors(j, now, policy, usage, total, users).values()) for j in jobs]
    # The common case, without a dict per job.
    return _fast_priorities(jobs, now, policy)


def priority_of(now: float, policy: Policy, usage: Mapping[str, float] | None = None
                ) -> Callable[[PendingJob], int]:
    """`priority` at `now` as a function of the job, with what all jobs share worked out once
    (for listings that show many jobs' priorities)."""
    usage = usage or {}
    total, users = sum(usage.values()), len(usage)
    if policy.weight_fairshare and total > 0:
        return lambda job: sum(factors(job, now, policy, usage, total, users).values())
    return _fast_priority(now, policy)


def order(jobs: tuple[PendingJob, ...], now: float, policy: Policy,
          usage: Mapping[str, float] | None = None) -> list[tuple[int, PendingJob]]:
    """Jobs with their priority, in the order a pass considers them (module docstring)."""
    prios = priorities(jobs, now, policy, usage)
    tier = policy.qos_priority
    aged = policy.aged_test(now)
    # Sort plain tuples: tier, aged-first (oldest first), then priority. Ids are unique, so a
    # comparison never reaches the job itself, and no key function is needed.
    keyed = [(-tier.get(j.qos, 0), 0, j.submit_time, j.id, p, j) if aged(j)
             else (-tier.get(j.qos, 0), 1, -p, j.submit_time, j.id, p, j)
             for p, j in zip(prios, jobs)]
    keyed.sort()
    return [(k[-2], k[-1]) for k in keyed]


_by_age = attrgetter("submit_time", "id")
_qos = attrgetter("qos")
_share = attrgetter("share")
_gpus = attrgetter("gpus")


class Ranking:
    """The jobs of `order`, in its order, with priorities computed only where they decide it.

    A pass usually takes only the first few jobs in this order (until `reserve_depth` are
    blocked); the rest are backfilled in an order of their own. Aged jobs go oldest first, so a
    tier's younger jobs are ranked by priority only once the pass reaches them. Priorities
    come from `rank`, which returns a mapping from job id to priority that covers the jobs given.
    With a QueueOrder (the same jobs, kept sorted by the caller) nothing is sorted here and a
    tier's younger jobs are not even listed until they are reached.
    """

    def __init__(self, jobs: Sequence[PendingJob], now: float, policy: Policy,
                 rank: Callable[[list[PendingJob]], Mapping[int, int]],
                 index: QueueOrder | None = None) -> None:
        self.rank = rank
        aged = policy.aged_test(now)
        #: Per tier, highest first: its aged jobs (oldest first), then its young ones (ranked
        #: when reached; until then a function that lists them; with a QueueOrder, merged from
        #: its classes one job at a time, gq/sched/merge.py).
        self.parts: list[list[PendingJob] | Callable[[], list[PendingJob]] | YoungMerge] = []
        if index is not None:
            #: The QOS of the jobs, and whether any of them shares GPUs, or needs none.
            self.qos, self.sharing = set(index.qos), index.sharing > 0
            self.gpuless = index.gpuless > 0
            self.keyed = index.keyed > 0
            cuts = (now - policy.reserve_age_s,
                    now - (policy.reserve_age_big_s or policy.reserve_age_s))
            self._split(index.by_age, policy.aged_bounds(now), aged, _by_tier(index.by_class),
                        cuts)
        else:
            self.qos, self.sharing = set(map(_qos, jobs)), any(map(_share, jobs))
            self.gpuless = not all(map(_gpus, jobs))
            self.keyed = any(j.cache_key is not None for j in jobs)
            tier = policy.qos_priority
            tiers = sorted({tier.get(q, 0) for q in self.qos}, reverse=True)
            for t in tiers:
                members = jobs if len(tiers) == 1 else [j for j in jobs if tier.get(j.qos, 0) == t]
                old = [j for j in members if aged(j)]
                old.sort(key=_by_age)
                young = [j for j in members if not aged(j)]
                self.parts += [old, functools.partial(list, young)]
        self.part, self.at = 0, 0
        #: Whether any job is aged (its tier's first part is not empty): without one, no job
        #: behind the first `reserve_depth` may reserve.
        self.aged_any = any(self.parts[i] for i in range(0, len(self.parts), 2))

    def _split(self, by_age: Sequence[AgeKey], bounds: tuple[float, float],
               aged: Callable[[PendingJob], bool],
               classes: Mapping[int, list[Sequence[AgeKey]]], cuts: tuple[float, float]
               ) -> None:
        """Parts from keys sorted by (-tier, submit time, id): each tier a run, aged jobs first.
        Jobs submitted by the first bound are all aged, after the second none; between them
        (when big jobs age sooner) `aged` tells, and the run stays in age order. A tier's young
        jobs are merged from its `classes` as they are taken (gq/sched/merge.py)."""
        lo = 0
        while lo < len(by_age):
            tier = by_age[lo][0]
            hi = bisect_right(by_age, (tier, math.inf), lo)
            mid = bisect_right(by_age, (tier, bounds[0], math.inf), lo, hi)
            end = bisect_right(by_age, (tier, bounds[1], math.inf), mid, hi)
            between = [k[-1] for k in by_age[mid:end]]
            self.parts += [[k[-1] for k in by_age[lo:mid]] + [j for j in between if aged(j)],
                           YoungMerge(classes[tier], cuts, self.rank)]
            lo = hi

    def next(self) -> PendingJob | None:
        """The next job in order, or None when all have been taken."""
        while self.part < len(self.parts):
            merged = self.parts[self.part]
            if isinstance(merged, YoungMerge):
                if (job := merged.next()) is not None:
                    return job
                self.part, self.at = self.part + 1, 0
                continue
            part = self._listed(self.part)
            if self.at < len(part):
                self.at += 1
                return part[self.at - 1]
            self.part, self.at = self.part + 1, 0
        return None

    def rest(self) -> list[PendingJob]:
        """The jobs not taken yet, in no particular order."""
        if self.part >= len(self.parts):
            return []
        first = self.parts[self.part]
        rest = first.rest() if isinstance(first, YoungMerge) else self._listed(self.part)[self.at:]
        for part in self.parts[self.part + 1:]:
            rest += part if isinstance(part, list) else part.rest() \
                if isinstance(part, YoungMerge) else part()
        return rest

    def _listed(self, i: int) -> list[PendingJob]:
        """Part i, in order: a young part is listed and ranked when first reached."""
        part = self.parts[i]
        assert not isinstance(part, YoungMerge)
        if not isinstance(part, list):
            part = self.parts[i] = part()
            if part:
                prios = self.rank(part)
                part.sort(key=lambda j: (-prios[j.id], j.submit_time, j.id))
        return part


def _by_tier(by_class: Mapping[ClassKey, Sequence[AgeKey]]) -> dict[int, list[Sequence[AgeKey]]]:
    """The classes' keys grouped by their tier (the first item of a class's key)."""
    tiers: dict[int, list[Sequence[AgeKey]]] = {}
    for key, keys in by_class.items():
        tiers.setdefault(key[0], []).append(keys)
    return tiers


def _fast_priorities(jobs: Sequence[PendingJob], now: float, policy: Policy) -> list[int]:
    """`priority` of every job when fair share contributes its full weight to everyone (no usage
    yet): the same sum, with the policy's figures worked out once."""
    return list(map(_fast_priority(now, policy), jobs))


def _fast_priority(now: float, policy: Policy) -> Callable[[PendingJob], int]:
    qos_points = {q: p * policy.weight_qos for q, p in policy.qos_priority.items()}
    max_age, w_age, w_ratio = policy.max_age_s, policy.weight_age, policy.weight_ratio
    fair, log2 = policy.weight_fairshare, math.log2

    def prio(j: PendingJob) -> int:
        # The age factor grows linearly to 1 at max_age, the ratio is log2 of
        # (wait + limit) / limit. Written out (not `factors`): it runs for every queued job.
        w = max(now - j.submit_time, 0.0)
        limit = j.time_limit_s or UNLIMITED_AS_S
        return (qos_points.get(j.qos, 0) + fair + j.nice
                + (int((w / max_age if w < max_age else 1.0) * w_age) if max_age else 0)
                + int(log2((w + limit) / limit) * w_ratio))
    return prio
