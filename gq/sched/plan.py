"""One scheduling pass: priority order, backfill around reservations, then preemption.

Jobs are taken in priority order. A job starts now if its GPUs are free for its whole time limit
(so it delays no reservation made before it); otherwise the first `reserve_depth` blocked jobs,
and any job older than `reserve_age_s`, get a reservation at their earliest feasible start, which
later jobs must respect. Blocked jobs of a QOS that may preempt take GPUs from preemptible work
when their own reservation is not imminent.
"""

from __future__ import annotations

import heapq
import math
from functools import cached_property
from collections.abc import Callable, Iterable, Iterator, Sequence

from gq.defaults import BIG_JOB_GPUS
from gq.model import Gpu
from gq.sched import affinity, placement, share
from gq.sched.preempt import MAX_PREEMPTORS, Victims
from gq.sched.priority import Ranking, priorities
from gq.sched.profile import Profile
from gq.sched.types import (PendingJob, Plan, Policy, Preempt, Reservation, Shape, SizeKey,
                             Snapshot, Start)

#: Pending reasons, Slurm's names.
RESOURCES = "Resources"
PRIORITY = "Priority"
NEVER_FITS = "ReqNodeNotAvail"
#: Most reservations one pass makes, whatever the ages, so a pass stays cheap on a long queue.
MAX_RESERVATIONS = 32
#: Most jobs of a QOS under its guaranteed share a pass takes ahead of the others.
MAX_SHARE_JOBS = 64


class _Pass:
    """The working state of one pass: the profile and what has been decided so far."""

    def __init__(self, state: Snapshot, now: float, policy: Policy):
        self.state, self.now, self.policy = state, now, policy
        # A pool is lent out only while no job of its owner waits.
        closed = {j.qos for j in state.pending if j.qos in policy.pools} if policy.pools else set()
        self.profile = Profile(state.nodes, state.running, now, policy.owner, closed, state.held)
        self.result = Plan()
        # Shape -> smallest time limit that could not start now: a longer or equal one cannot
        # either, since bookings only grow during a pass. Jobs of one shape are tried once.
        self.failed_now: dict[Shape, float] = {}
        self.never: dict[Shape, bool] = {}
        # Nodes grouped by what placement reads of their GPUs (type and VRAM), so "could any
        # node ever hold this shape" is asked once per kind of node: a real cluster's GPU tuples
        # all differ (by UUID), and the head makes them anew every pass. A tuple shared by many
        # nodes (the simulator's) is read once.
        by_tuple: dict[int, tuple[tuple[Gpu, ...], int]] = {}
        for n in state.nodes:
            by_tuple[id(n.gpus)] = (n.gpus, by_tuple.get(id(n.gpus), (n.gpus, 0))[1] + 1)
        self.kinds: dict[tuple[tuple[str, int], ...], tuple[tuple[Gpu, ...], int]] = {}
        for gpus, count in by_tuple.values():
            kind = tuple((g.type, g.memory) for g in gpus)
            self.kinds[kind] = (gpus, self.kinds.get(kind, (gpus, 0))[1] + count)
        self.blocked: list[PendingJob] = []
        #: Blocked preemptors' jobs after `blocked`, in order, not yet listed (see backfill).
        self.tail: _Backlog | None = None
        #: QOS of the pending jobs, whether any shares GPUs and whether any needs none (set by
        #: plan()).
        self.queued_qos: set[str] = set()
        self.sharing = True
        self.gpuless = True
        #: Whether any pending job has a cache key, or is aged (set by plan()).
        self.keyed = True
        self.aged_any = True
        #: Reserve as a pass with `explain` would, for now (_reserve_big, for _preempt).
        self.as_explained = False
        #: Ids of the jobs taken in priority order (before backfill).
        self.considered: set[int] = set()

    def consider(self, job: PendingJob, may_reserve: bool) -> None:
        """Start `job` now if that delays no reservation; else give its reason (and maybe a
        reservation). Runs for most of the queue every pass, so the cheap tests come first."""
        shape = job.shape
        if self._never_fits(job, shape):
            self.result.reasons[job.id] = NEVER_FITS
            return
        if affinity.warm_only(job, self.now):
            self._wait_warm(job)
            return
        limit = job.time_limit_s or math.inf
        failed = self.failed_now.get(shape)
        # A shape that failed at a shorter limit fails again (bookings only grow in a pass); with
        # nothing free, only a job that must be looked at anyway is (see _needs_work).
        # (A sharing or GPU-less job needs no free GPU to start.)
        if (failed is None or failed > limit) and (self.profile.any_free_now() or job.share
                                                   or not job.gpus
                                                   or self._needs_work(job, may_reserve)):
            alloc = self.profile.place(job, self.now)
            if alloc is not None:
                self.profile.book(job, alloc, self.now)
                self.result.starts.append(Start(job_id=job.id, alloc=alloc))
                return
            self.failed_now[shape] = limit
        self._wait(job)
        # A reservation only matters while something could still start in this pass (or to
        # judge whether preempting is worth it, or to tell the user when the job should start).
        if (may_reserve or self._aged(job)) and len(self.result.reservations) < MAX_RESERVATIONS \
                and (self.reserving or self.profile.any_free_now()
                     or job.qos in self.policy.preemptors):
            reservation = _reserve(self.profile, job)
            if reservation is not None:
                self.profile.book(job, reservation.alloc, reservation.start)
                self.result.reservations[job.id] = reservation

    def backfill(self, rest: list[PendingJob] | None) -> None:
        """The jobs behind the reserved ones fill the gaps smallest first (GPU-seconds by their
        limits), tier by tier: many short jobs finish sooner for every hour a long one would
        have held the gap.

        On a long queue behind a busy cluster most jobs can only wait, so each costs a lookup:
        only jobs that could start now (enough nodes with enough free GPUs for their shape;
        free GPUs only get fewer in a pass), are old enough to reserve, or may preempt are
        ordered, and only until no GPU is free; after that, only those that must be looked at
        anyway (`_needs_work`) are."""
        if not self.blocked:  # the first to wait is told Resources, the rest Priority: in order
            if rest is None:
                assert self.state.queue is not None
                rest = [k[-1] for k in self.state.queue.by_size if k[2] not in self.considered]
            for *_, first in sorted(self._keyed(rest)):
                self.consider(first, may_reserve=False)
            return
        fits = _FitsNow(self.profile.room_now())
        aged = self.policy.aged_test(self.now)
        # (Only preemptors with jobs in the queue: most passes have none, and then the jobs
        # left once nothing is free need no second look.)
        preempts = self.policy.preemptors & self.queued_qos
        reserving = self.reserving

        def looked_at(j: PendingJob) -> bool:
            # Could start now, or aged (_needs_work(job, False): an aged job may reserve while
            # GPUs are free), or may preempt.
            return fits[j.shape] or aged(j) or j.qos in preempts

        backlog = _Backlog(self, rest, self.state.queue.by_size if self.state.queue else None,
                           looked_at)
        while self.profile.any_free_now() and (job := backlog.next()) is not None:
            self.consider(job, may_reserve=False)
        if not (reserving or preempts or self.sharing):
            return  # nothing left could start, reserve or preempt; nobody reads reasons
        # A sharing or GPU-less job needs no free GPU to start; the others as in
        # _needs_work(job, False).
        # Once no reservation is left to make, an aged job that needs a GPU could only be given
        # its reason, which is the one every job left out gets (`behind`): it is left out (with
        # explain, most of a long queue is aged). The backlog goes on with only these (which it
        # looked at anyway), in the same order: nothing is re-sorted.
        full = len(self.result.reservations) >= MAX_RESERVATIONS
        backlog.narrow(lambda j: j.share or not j.gpus or j.qos in preempts or (
            reserving and aged(j) and not full))
        # Nothing is free from here on (else the backlog would have been taken to its end).
        # In order while reservations are left to make (ranking only the ties reached)...
        # unless the backlog holds only preemptors' jobs that need a GPU and none of them can
        # reserve (none is aged: an aged preemptor reserves even without `reserving`) or waits
        # for a warm GPU: consider() would block each, in order, for _preempt, which the tail
        # below does as it asks (a pass behind a full cluster would otherwise walk every
        # queued preemptor's job).
        only_blocked = not (self.sharing or self.gpuless or self.keyed) \
            and (full or not self.aged_any)
        while not only_blocked and len(self.result.reservations) < MAX_RESERVATIONS \
                and (job := backlog.next()) is not None:
            self.consider(job, may_reserve=False)
        # ... then the rest of those that can still do something, in order. A job that needs a
        # GPU and shares none can now neither start (nothing is free, and sharing or GPU-less
        # jobs starting frees none) nor reserve: consider() would give it `behind`'s reason and
        # file it as blocked for _preempt, which is all done here.
        rest = [j for j in backlog.left() if j.share or not j.gpus] \
            if self.sharing or self.gpuless else []
        if not rest:
            # Only preemptors' jobs that need a GPU are left (most passes): they just wait, in
            # order, for _preempt, which looks at up to MAX_PREEMPTORS of thousands; so they are
            # taken as it asks for them (`tail`), ranking only the ties it reaches.
            backlog.narrow(lambda j: j.qos in preempts)
            self.tail = backlog
            return
        left = backlog.rest()
        rest += [j for j in left if j.gpus and not j.share and j.qos in preempts]
        for *_, job in sorted(self._keyed(rest)):
            if job.gpus and not job.share:
                if not self._never_fits(job, job.shape):
                    self.blocked.append(job)
                continue
            self.consider(job, may_reserve=False)
        # The jobs left out wait: they are not first (self.blocked holds the reserved job), so
        # Priority, unless no node could ever hold them (`behind`, which Plan.reason asks). None
        # of them may preempt, so _preempt need not see them.

    def waiting_preemptors(self) -> Iterator[PendingJob]:
        """The blocked jobs of QOS that may preempt, in order (`blocked`, then `tail`)."""
        preemptors = self.policy.preemptors
        yield from [j for j in self.blocked if j.qos in preemptors]
        if self.tail is not None:
            while (job := self.tail.next()) is not None:
                if not self._never_fits(job, job.shape):
                    yield job

    def behind(self, job: PendingJob) -> str:
        """The reason of a job the pass left out, behind the blocked ones: see Plan.reason."""
        return NEVER_FITS if self._never_fits(job, job.shape) else PRIORITY

    def _keyed(self, jobs: list[PendingJob]) -> list[_Keyed]:
        """Sort keys of the backfill order, each ending with its job (ids are unique, so a
        comparison never reaches the job itself)."""
        tier, prios = self.policy.qos_priority, self.rank(jobs)
        return [(-tier.get(j.qos, 0), j.area, -prios[j.id], j.id, j) for j in jobs]

    def rank(self, jobs: list[PendingJob]) -> dict[int, int]:
        """Priorities of `jobs` (and all computed before), computing the missing ones."""
        prios = self.result.priorities
        missing = [j for j in jobs if j.id not in prios]
        if missing:
            prios.update(zip([j.id for j in missing],
                             priorities(missing, self.now, self.policy, self.state.usage)))
        return prios

    def _wait_warm(self, job: PendingJob) -> None:
        """A job in its --cold-wait starts now on warm GPUs, else waits for them: it neither
        reserves nor counts as blocked (it chose to wait), and its shape is not marked failed,
        since jobs of that shape without its key may still take cold GPUs."""
        if self.profile.any_free_now() or job.share or not job.gpus:
            alloc = self.profile.place(job, self.now)
            if alloc is not None:
                self.profile.book(job, alloc, self.now)
                self.result.starts.append(Start(job_id=job.id, alloc=alloc))
                return
        self.result.reasons[job.id] = affinity.WAITING_WARM

    def _wait(self, job: PendingJob) -> None:
        self.result.reasons[job.id] = PRIORITY if self.blocked else RESOURCES
        self.blocked.append(job)

    def _never_fits(self, job: PendingJob, shape: Shape) -> bool:
        never = self.never.get(shape)
        if never is None:
            never = self.never[shape] = (sum(
                count for gpus, count in self.kinds.values()
                if placement.could_ever_fit(gpus, job)) if job.allowed is None else sum(
                1 for n in self.state.nodes
                if n.name in job.allowed and placement.could_ever_fit(n.gpus, job))) < job.nodes
        return never

    @property
    def reserving(self) -> bool:
        """Whether reservations are made although no GPU is free: to show them (explain), or
        because a GPU-less job can still start and must keep off the nodes they reserve (so
        gq sim places it where gqd would), or, while `as_explained`, as a pass that shows
        them would."""
        return self.policy.explain or self.gpuless or self.as_explained

    def _aged(self, job: PendingJob) -> bool:
        return self._is_aged(job)

    @cached_property
    def _is_aged(self) -> Callable[[PendingJob], bool]:
        return self.policy.aged_test(self.now)

    def _needs_work(self, job: PendingJob, may_reserve: bool) -> bool:
        """Whether a job must be looked at although no GPU is free: to reserve it for display,
        or because it may preempt."""
        return (self.reserving and (may_reserve or self._aged(job))) \
            or job.qos in self.policy.preemptors


#: A backfill sort key ending with its job: (-tier, area, -priority, id, job).
_Keyed = tuple[int, float, int, int, PendingJob]


class _Backlog:
    """The jobs behind the reserved ones in backfill order (tier, then size by limit, then
    priority where those tie, then id), one at a time, limited to those `looked_at`.

    Either from `rest`, ordered here with a heap, or walked from the `by_size` keys of the
    snapshot's QueueIndex, which a caller that sees jobs come and go keeps sorted: then a pass
    touches only the jobs it takes, not the whole queue. Jobs the pass has already considered (not in
    `rest`) are skipped there."""

    def __init__(self, run: _Pass, rest: list[PendingJob] | None,
                 by_size: Sequence[SizeKey] | None,
                 looked_at: Callable[[PendingJob], bool]) -> None:
        self.run, self.looked_at = run, looked_at
        self.ties: list[PendingJob] = []  # a run of equal (tier, area), best last
        #: Without the caller's keys, a heap of the jobs' (also `keys`).
        self.heap: list[SizeKey] = []
        if rest is None:
            assert by_size is not None
            self.keys: Sequence[SizeKey] = by_size
            self.at, self.sorted = 0, True
            self.skip = run.considered
        else:
            # queue.size_key, written out (a call per job costs as much as the rest of the key).
            tier = run.policy.qos_priority
            self.heap = [(-tier.get(j.qos, 0), j.area, j.id, j) for j in rest if looked_at(j)]
            heapq.heapify(self.heap)
            self.keys, self.sorted = self.heap, False

    def next(self) -> PendingJob | None:
        if self.ties:
            return self.ties.pop()
        first = self._take()
        if first is None:
            return None
        following = self._peek()
        if following is None or following[:2] != first[:2]:
            return first[-1]
        run = [first]
        while (following := self._peek()) is not None and following[:2] == first[:2]:
            run.append(following)
            self._take()
        # The priority that breaks a tie is computed only for jobs that tie.
        self.ties.extend(key[-1] for key in sorted(self.run._keyed([key[-1] for key in run]),
                                                   reverse=True))
        return self.ties.pop()

    def rest(self) -> list[PendingJob]:
        """The jobs looked at and not taken yet, in no particular order."""
        if self.sorted:
            left = [k[-1] for k in self.keys[self.at:]
                    if k[2] not in self.skip and self.looked_at(k[-1])]
        else:
            left = [k[-1] for k in self.keys]
        return [*self.ties, *left]

    def narrow(self, looked_at: Callable[[PendingJob], bool]) -> None:
        """From now on look only at the jobs `looked_at` too: a test that implies the one
        before (those it drops were never looked at). The order of the rest stays."""
        self.looked_at = looked_at
        self.ties = [j for j in self.ties if looked_at(j)]
        if not self.sorted:
            self.heap = [k for k in self.heap if looked_at(k[-1])]
            heapq.heapify(self.heap)
            self.keys = self.heap

    def left(self) -> list[PendingJob]:
        """The jobs not taken yet, in no particular order, and, walking the caller's keys, also
        those not looked at: for a caller that filters them with a test implying `looked_at`
        (one call a job less)."""
        if self.sorted:
            return [*self.ties, *(k[-1] for k in self.keys[self.at:] if k[2] not in self.skip)]
        return self.rest()

    def _peek(self) -> SizeKey | None:
        keys = self.keys
        if not self.sorted:
            return keys[0] if keys else None
        while self.at < len(keys):
            key = keys[self.at]
            if key[2] not in self.skip and self.looked_at(key[-1]):
                return key
            self.at += 1
        return None

    def _take(self) -> SizeKey | None:
        if not self.sorted:
            return heapq.heappop(self.heap) if self.heap else None
        key = self._peek()
        if key is not None:
            self.at += 1
        return key


class _FitsNow(dict[Shape, bool]):
    """Shape -> whether enough nodes have enough free GPUs for it to start now (a sharing job
    needs none free): necessary, not sufficient. Filled on first lookup, so a pass over the
    queue pays one dict lookup per job; free GPUs only get fewer in a pass."""

    def __init__(self, room: list[int]) -> None:
        super().__init__()
        self.room = room  # free GPUs per schedulable node, most first

    def __missing__(self, shape: Shape) -> bool:
        room = self.room
        fits = self[shape] = shape.share or (shape.nodes <= len(room)
                                             and room[shape.nodes - 1] >= shape.gpus)
        return fits


def plan(state: Snapshot, now: float, policy: Policy) -> Plan:
    run = _Pass(state, now, policy)
    if policy.explain:
        run.result.behind = run.behind
    ranked = Ranking(state.pending, now, policy, run.rank, state.queue)
    run.queued_qos, run.sharing, run.gpuless = ranked.qos, ranked.sharing, ranked.gpuless
    run.keyed, run.aged_any = ranked.keyed, ranked.aged_any
    # QOS under their guaranteed share first, up to it; their blocked jobs hold reservations
    # of their own, apart from reserve_depth.
    claimed = _claim_shares(run, ranked.qos) if policy.min_share else 0
    # In priority order until `reserve_depth` jobs are blocked: those hold reservations, so
    # whatever the order of the rest, nothing can push them back (no starvation).
    rest: list[PendingJob] | None = []
    while (job := ranked.next()) is not None:
        if job.id in run.considered:
            continue
        if len(run.blocked) - claimed >= policy.reserve_depth and policy.backfill_smallest_first \
                and not (policy.aged_in_order and run._aged(job)
                         and len(run.result.reservations) < MAX_RESERVATIONS):
            # With the caller's size order, backfill walks it, skipping the jobs taken here.
            rest = None if state.queue is not None else [
                j for j in (job, *ranked.rest()) if j.id not in run.considered]
            break
        run.considered.add(job.id)
        run.consider(job, may_reserve=len(run.blocked) - claimed < policy.reserve_depth)
    if policy.big_reserve_depth and _reserve_big(run) and rest:
        rest = [j for j in rest if j.id not in run.considered]
    run.backfill(rest)
    if policy.preemptors:
        _preempt(state, now, policy, run)
    if policy.warm_swap_s and run.result.starts:
        affinity.swap_warm(run.result, state.pending, state.nodes, now, policy.warm_swap_s)
    return run.result


def _claim_shares(run: _Pass, pending_qos: set[str]) -> int:
    """Consider the jobs of each QOS under its min_share first, in their order, until they
    would fill it (gq/sched/share.py); the first of them that waits gets a reservation.
    Returns how many are blocked (they hold their own reservations, apart from
    reserve_depth)."""
    state, policy = run.state, run.policy
    for qos, room in share.claims(policy, state, pending_qos).items():
        ranked = Ranking([j for j in state.pending if j.qos == qos], run.now, policy, run.rank)
        reserved, taken = False, 0
        while room > 0 and taken < MAX_SHARE_JOBS and (job := ranked.next()) is not None:
            taken += 1
            run.considered.add(job.id)
            blocked = len(run.blocked)
            run.consider(job, may_reserve=not reserved)
            reserved |= len(run.blocked) > blocked
            room -= job.nodes * job.gpus
    return len(run.blocked)


def _reserve_big(run: _Pass) -> bool:
    """The first `big_reserve_depth` blocked jobs of BIG_JOB_GPUS or more, first come first, hold
    reservations too, so that backfill cannot push them back however small jobs are ordered.
    Returns whether it considered any job.

    With nothing free and no reservation to show, only a queued QOS that may preempt still
    reads this: _preempt serves the blocked jobs in the order they were blocked, so a pass
    without `explain` must block the same big jobs here as one with it, and so reserves as it
    would (which also ends the walk after `big_reserve_depth` reservations, not at the end of
    the queue's big jobs)."""
    if not (run.profile.any_free_now() or run.reserving):
        if not run.policy.preemptors & run.queued_qos:
            return False
        run.as_explained = True
        try:
            return _reserve_big(run)
        finally:
            run.as_explained = False
    if run.state.queue is not None:
        jobs: Iterable[PendingJob] = (k[-1] for k in run.state.queue.big_by_age)
    else:
        tier = run.policy.qos_priority
        jobs = sorted((j for j in run.state.pending if j.nodes * j.gpus >= BIG_JOB_GPUS),
                      key=lambda j: (-tier.get(j.qos, 0), j.submit_time, j.id))
    found = looked = 0
    for job in jobs:
        if not (run.profile.any_free_now() or run.reserving) \
                or len(run.result.reservations) >= MAX_RESERVATIONS:
            break  # no longer changes what starts, what is shown or whom _preempt serves
        if job.id in run.considered:
            found += job.id in run.result.reservations
        else:
            looked += 1
            run.considered.add(job.id)
            run.consider(job, may_reserve=True)
            found += job.id in run.result.reservations
        if found >= run.policy.big_reserve_depth:
            break
    return looked > 0


def _reserve(profile: Profile, job: PendingJob) -> Reservation | None:
    """The earliest time and GPUs where the job fits for its whole limit, or None."""
    found = profile.earliest(job)
    if found is None:
        return None
    return Reservation(job_id=job.id, start=found[0], alloc=found[1])


def _preempt(state: Snapshot, now: float, policy: Policy, run: _Pass) -> None:
    result, profile = run.result, run.profile
    victims: Victims | None = None  # built on first need: most passes have no preemptor
    tried = 0
    hopeless: set[tuple[object, ...]] = set()  # (shape, QOS) that found no victims this pass
    for job in run.waiting_preemptors():
        victim_qos = policy.preempts.get(job.qos, ())
        pool = policy.pools.get(job.qos, frozenset())
        if not (victim_qos or pool) or result.reasons.get(job.id) == NEVER_FITS:
            continue
        # A reservation due within the QOS's preempt_after_s is waited for.
        reservation = result.reservations.get(job.id)
        if reservation is not None and reservation.start - now <= policy.after_s(job.qos):
            continue
        key = (job.shape, job.qos)
        if key in hopeless:
            continue
        tried += 1
        if tried > MAX_PREEMPTORS:
            return
        if victims is None:
            victims = Victims(state, now, policy, result.starts)
        chosen = victims.choose(job, set(victim_qos), pool,
                                (lambda name: profile.pool_rank(name, job) is not None)
                                if policy.pools or job.allowed is not None
                                else None,  # (without pools or a node set every node is usable)
                                policy.after_s(job.qos))
        if chosen:
            result.preemptions.extend(Preempt(victim=v, for_job=job.id) for v in chosen)
        else:
            hopeless.add(key)
