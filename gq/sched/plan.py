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
from gq.sched.preempt import choose_victims
from gq.sched.priority import order
from gq.sched.profile import Profile
from gq.sched.types import PendingJob, Plan, Policy, Preempt, Reservation, Snapshot, Start

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"
#: Most reservations one pass makes, whatever the ages, so a pass stays cheap on a long queue.
MAX_RESERVATIONS = 64
#: A reservation this close (seconds) is left to come rather than preempting for it.
IMMINENT_S = 60.0


def _shape(job: PendingJob) -> tuple[object, ...]:
    return (job.nodes, job.gpus, job.gpu_type, job.gpu_mem, job.cpus, job.mem)


def plan(state: Snapshot, now: float, policy: Policy) -> Plan:
    profile = Profile(state.nodes, state.running, now)
    result = Plan()
    # Shape -> smallest time limit that could not start now: a longer or equal one cannot either,
    # since bookings only grow during a pass. Jobs of one shape are thus tried once, not N times.
    failed_now: dict[tuple[object, ...], float] = {}
    never: dict[tuple[object, ...], bool] = {}
    blocked: list[PendingJob] = []
    for prio, job in order(state.pending, now, policy, state.usage):
        result.priorities[job.id] = prio
        shape = _shape(job)
        if shape not in never:
            never[shape] = sum(placement.could_ever_fit(n, job) for n in state.nodes) < job.nodes
        if never[shape]:
            result.reasons[job.id] = NEVER_FITS
            continue
        limit = job.time_limit_s or math.inf
        if shape not in failed_now or failed_now[shape] > limit:
            alloc = profile.place(job, now)
            if alloc is not None:
                profile.book(job, alloc, now)
                result.starts.append(Start(job_id=job.id, alloc=alloc))
                continue
            failed_now[shape] = min(failed_now.get(shape, limit), limit)
        result.reasons[job.id] = PRIORITY if blocked else RESOURCES
        blocked.append(job)
        if len(result.reservations) < MAX_RESERVATIONS and (
                len(result.reservations) < policy.reserve_depth
                or now - job.submit_time >= policy.reserve_age_s):
            reservation = _reserve(profile, job)
            if reservation is not None:
                profile.book(job, reservation.alloc, reservation.start)
                result.reservations[job.id] = reservation
    if policy.preempts:
        _preempt(state, now, policy, blocked, result)
    return result


def _reserve(profile: Profile, job: PendingJob) -> Reservation | None:
    """The earliest time and GPUs where the job fits for its whole limit, or None."""
    for start in profile.end_times():
        alloc = profile.place(job, start)
        if alloc is not None:
            return Reservation(job_id=job.id, start=start, alloc=alloc)
    return None


def _preempt(state: Snapshot, now: float, policy: Policy, blocked: list[PendingJob],
             result: Plan) -> None:
    taken: set[int] = set()
    for job in blocked:
        victims_qos = policy.preempts.get(job.qos)
        if not victims_qos or result.reasons.get(job.id) == NEVER_FITS:
            continue
        reservation = result.reservations.get(job.id)
        if reservation is not None and reservation.start - now <= IMMINENT_S:
            continue
        victims = choose_victims(state, job, now, policy, set(victims_qos), taken)
        if victims:
            taken.update(victims)
            result.preemptions.extend(Preempt(victim=v, for_job=job.id) for v in victims)
