"""One scheduling pass: priority order, backfill around reservations, then preemption.

Jobs are taken in priority order. A job starts now if its GPUs are free for its whole time limit
(so it delays no reservation made before it); otherwise the first `reserve_depth` blocked jobs,
and any job older than `reserve_age_s`, get a reservation at their earliest feasible start, which
later jobs must respect. Blocked jobs of a QOS that may preempt take GPUs from preemptible work
when their own reservation is not imminent.
"""

from __future__ import annotations

import math

from gq.sched import placement
from gq.sched.preempt import MAX_PREEMPTORS, Victims
from gq.sched.priority import order
from gq.sched.profile import Profile
from gq.sched.types import PendingJob, Plan, Policy, Preempt, Reservation, Snapshot, Start

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"
#: Most reservations one pass makes, whatever the ages, so a pass stays cheap on a long queue.
MAX_RESERVATIONS = 32
#: A reservation this close (seconds) is left to come rather than preempting for it.
IMMINENT_S = 60.0


def _shape(job: PendingJob) -> tuple[object, ...]:
    return (job.nodes, job.gpus, job.gpu_type, job.gpu_mem, job.cpus, job.mem)


class _Pass:
    """The working state of one pass: the profile and what has been decided so far."""

    def __init__(self, state: Snapshot, now: float, policy: Policy):
        self.state, self.now, self.policy = state, now, policy
        self.profile = Profile(state.nodes, state.running, now)
        self.result = Plan()
        # Shape -> smallest time limit that could not start now: a longer or equal one cannot
        # either, since bookings only grow during a pass. Jobs of one shape are tried once.
        self.failed_now: dict[tuple[object, ...], float] = {}
        self.never: dict[tuple[object, ...], bool] = {}
        self.blocked: list[PendingJob] = []

    def consider(self, job: PendingJob, may_reserve: bool) -> None:
        """Start `job` now if that delays no reservation; else give its reason (and maybe a
        reservation)."""
        shape = _shape(job)
        if shape not in self.never:
            self.never[shape] = sum(placement.could_ever_fit(n, job)
                                    for n in self.state.nodes) < job.nodes
        if self.never[shape]:
            self.result.reasons[job.id] = NEVER_FITS
            return
        if not self.profile.any_free_now() and not self._needs_work(job, may_reserve):
            # Nothing is free: nothing more can start in this pass, so only the reason is left.
            self.result.reasons[job.id] = PRIORITY if self.blocked else RESOURCES
            self.blocked.append(job)
            return
        limit = job.time_limit_s or math.inf
        if shape not in self.failed_now or self.failed_now[shape] > limit:
            alloc = self.profile.place(job, self.now)
            if alloc is not None:
                self.profile.book(job, alloc, self.now)
                self.result.starts.append(Start(job_id=job.id, alloc=alloc))
                return
            self.failed_now[shape] = min(self.failed_now.get(shape, limit), limit)
        self.result.reasons[job.id] = PRIORITY if self.blocked else RESOURCES
        self.blocked.append(job)
        aged = self.now - job.submit_time >= self.policy.reserve_age_s
        # A reservation only matters while something could still start in this pass (or to
        # judge whether preempting is worth it, or to tell the user when the job should start).
        useful = self.policy.explain or self.profile.any_free_now() \
            or job.qos in self.policy.preempts
        if (may_reserve or aged) and useful and len(self.result.reservations) < MAX_RESERVATIONS:
            reservation = _reserve(self.profile, job)
            if reservation is not None:
                self.profile.book(job, reservation.alloc, reservation.start)
                self.result.reservations[job.id] = reservation


    def _needs_work(self, job: PendingJob, may_reserve: bool) -> bool:
        """Whether a job must be looked at although no GPU is free: to reserve it for display,
        or because it may preempt."""
        aged = self.now - job.submit_time >= self.policy.reserve_age_s
        return (self.policy.explain and (may_reserve or aged)) or job.qos in self.policy.preempts


def plan(state: Snapshot, now: float, policy: Policy) -> Plan:
    run = _Pass(state, now, policy)
    ranked = order(state.pending, now, policy, state.usage)
    for prio, job in ranked:
        run.result.priorities[job.id] = prio
    # In priority order until `reserve_depth` jobs are blocked: those hold reservations, so
    # whatever the order of the rest, nothing can push them back (no starvation).
    rest: list[PendingJob] = []
    for i, (_, job) in enumerate(ranked):
        if len(run.blocked) >= policy.reserve_depth and policy.backfill_smallest_first:
            rest = [j for _, j in ranked[i:]]
            break
        run.consider(job, may_reserve=len(run.blocked) < policy.reserve_depth)
    # The rest fill the gaps smallest first (GPU-seconds by their limits), tier by tier: many
    # short jobs finish sooner for every hour a long one would have held the gap.
    tier, prios = policy.qos_priority, run.result.priorities
    keyed = sorted((-tier.get(j.qos, 0), _area(j), -prios[j.id], j.id) for j in rest)
    by_id = {j.id: j for j in rest}
    for *_, job_id in keyed:
        run.consider(by_id[job_id], may_reserve=False)
    if policy.preempts:
        _preempt(state, now, policy, run.blocked, run.result)
    return run.result


def _area(job: PendingJob) -> float:
    return job.nodes * max(job.gpus, 1) * (job.time_limit_s or math.inf)


def _reserve(profile: Profile, job: PendingJob) -> Reservation | None:
    """The earliest time and GPUs where the job fits for its whole limit, or None."""
    found = profile.earliest(job)
    if found is None:
        return None
    return Reservation(job_id=job.id, start=found[0], alloc=found[1])


def _preempt(state: Snapshot, now: float, policy: Policy, blocked: list[PendingJob],
             result: Plan) -> None:
    victims = Victims(state, now, policy)
    tried = 0
    hopeless: set[tuple[object, ...]] = set()  # (shape, QOS) that found no victims this pass
    for job in blocked:
        victim_qos = policy.preempts.get(job.qos)
        if not victim_qos or result.reasons.get(job.id) == NEVER_FITS:
            continue
        reservation = result.reservations.get(job.id)
        if reservation is not None and reservation.start - now <= IMMINENT_S:
            continue
        key = (_shape(job), job.qos)
        if key in hopeless:
            continue
        tried += 1
        if tried > MAX_PREEMPTORS:
            return
        chosen = victims.choose(job, set(victim_qos))
        if chosen:
            result.preemptions.extend(Preempt(victim=v, for_job=job.id) for v in chosen)
        else:
            hopeless.add(key)
