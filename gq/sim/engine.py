"""The discrete-event engine: a simulated clock, submissions and job ends, one policy call per instant.

The policy sees exactly what gqd's scheduler sees (a Snapshot: nodes, pending jobs, running jobs
with their limits, usage) and never a job's true runtime. The engine checks every decision it
applies, so a policy that would over-allocate a GPU fails loudly instead of skewing the results.
"""

from __future__ import annotations

import heapq
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Generic, Protocol, TypeVar, overload, runtime_checkable

from gq.model import FAKE_GPU_MEMORY, Gpu
from gq.sched import affinity
from gq.sched.affinity import WAITING_WARM
from gq.sched.queue import QueueIndex
from gq.sim.affinity import ColdStarts
from gq.sched.types import (NodeView, PendingJob, Plan, Policy, Preempt, RunningJob, Snapshot,
                            Start)
from gq.sched.held import HeldIndex
from gq.sim.trace import TraceJob

PolicyFn = Callable[[Snapshot, float, Policy], Plan]
ProgressFn = Callable[[int, int], None]


T = TypeVar("T")


class _View(Sequence[T], Generic[T]):
    """A snapshot's jobs without a copy per pass: the engine's own dict, until the engine next
    changes it while someone still holds the view (`Frozen.hold`); then a copy. Copying a long
    queue for every pass had been most of a baseline's replay."""

    __slots__ = ("_items", "__weakref__")

    def __init__(self, items: dict[int, T]) -> None:
        self._items: dict[int, T] | tuple[T, ...] = items

    def freeze(self) -> None:
        if isinstance(self._items, dict):
            self._items = tuple(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[T]:
        items = self._items
        return iter(items.values() if isinstance(items, dict) else items)

    @overload
    def __getitem__(self, i: int) -> T: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[T]: ...

    def __getitem__(self, i: int | slice) -> T | Sequence[T]:
        self.freeze()
        assert isinstance(self._items, tuple)
        return self._items[i]


class _Views(Generic[T]):
    """The views handed out for one dict: frozen before the engine changes it."""

    def __init__(self, items: dict[int, T]) -> None:
        self.items = items
        self.handed: weakref.ref[_View[T]] | None = None

    def view(self) -> _View[T]:
        held = self.handed() if self.handed is not None else None
        if held is not None:
            return held  # nothing changed since it was handed out
        view: _View[T] = _View(self.items)
        self.handed = weakref.ref(view)
        return view

    def changing(self) -> None:
        """Called before every change of the dict."""
        if self.handed is not None:
            held = self.handed()
            if held is not None:
                held.freeze()
            self.handed = None


@runtime_checkable
class QueueWatcher(Protocol):
    """A policy that keeps its own index of the queue (the baselines): the engine tells it of
    every job that enters or leaves the queue, as it keeps its QueueIndex."""

    def add(self, job: PendingJob) -> None: ...

    def remove(self, job_id: int) -> object: ...

#: Policy calls allowed at one instant. A preemption frees GPUs, which is an event of its own
#: (the victim exits; the simulator models no grace time), so the engine plans again at once.
MAX_PASSES_PER_INSTANT = 8
#: Half-life of the decayed GPU-seconds per user handed to the policy for fair share (Slurm's
#: PriorityDecayHalfLife default is 7 days).
USAGE_HALF_LIFE_S = 7 * 86400.0
#: Instants between progress reports: often enough for a bar, rare enough to cost nothing.
PROGRESS_EVERY = 512

# Event kinds; at one instant ends are handled before wake-ups (the order does not change
# the outcome, since the policy runs once after the whole batch, but it keeps replays stable).
_END, _WAKE = 0, 1


class SimInvariantError(AssertionError):
    """A decision the engine refuses: a GPU given twice, a job started twice, a bad allocation."""


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int = 8
    gpu_type: str = "fake"

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def names(self) -> list[str]:
        # Zero-padded so that name order is numeric order (baselines place in name order).
        width = max(3, len(str(self.nodes)))
        return [f"n{i:0{width}d}" for i in range(1, self.nodes + 1)]

    def can_ever_hold(self, job: TraceJob) -> bool:
        return job.nodes <= self.nodes and job.gpus <= self.gpus_per_node


@dataclass
class Outcome:
    """What happened to one job; `start` is the start of its last run (the one that finished)."""

    job: TraceJob
    start: float | None = None
    end: float | None = None
    #: Times it was preempted and requeued.
    restarts: int = 0
    #: GPU-seconds of runs that preemption threw away (since each run's last checkpoint).
    lost_gpu_s: float = 0.0
    #: Seconds of its runtime saved by checkpoints of preempted runs (the last run skips them).
    saved_s: float = 0.0
    #: Seconds it spent pending in all: before its first run and after each preemption.
    waited_s: float = 0.0
    #: When it last entered the queue (its submission, or its last preemption).
    queued_at: float | None = None
    #: It ran into its time limit before its trace runtime (TIMEOUT).
    timed_out: bool = False
    #: The nodes of its last run.
    nodes: tuple[str, ...] = ()


@dataclass
class SimResult:
    cluster: Cluster
    outcomes: list[Outcome]
    #: Jobs larger than the cluster: refused at submit, as gqd refuses them.
    rejected: list[TraceJob] = field(default_factory=list)
    preemptions: int = 0
    plan_calls: int = 0
    wall_s: float = 0.0
    #: The cold-start model and its counts (model affinity), if the replay has one.
    loads: ColdStarts | None = None

    @property
    def unfinished(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.end is None]


@dataclass
class _Run:
    job: TraceJob
    view: RunningJob
    #: Bumped on every start, so that the end event of a preempted run is recognised as stale.
    epoch: int


def pending_view(job: TraceJob, policy: Policy | None = None) -> PendingJob:
    wait = affinity.cold_wait_s(job.cache_key, job.cold_wait_s, policy or Policy())
    return PendingJob(id=job.id, qos=job.qos, submit_time=job.submit_time, nodes=job.nodes,
                      gpus=job.gpus, time_limit_s=job.time_limit_s, user=job.user,
                      cache_key=job.cache_key,
                      cold_wait_until=job.submit_time + wait if wait else 0.0)


class Usage:
    """Decayed GPU-seconds per user. Values are stored scaled to a reference time, so decay costs
    nothing per event; the reference moves forward before the scale could overflow."""

    def __init__(self, half_life_s: float = USAGE_HALF_LIFE_S) -> None:
        self.half_life_s = half_life_s
        self.ref = 0.0
        self.scaled: dict[str, float] = {}

    def add(self, user: str, gpu_s: float, at: float) -> None:
        if (at - self.ref) / self.half_life_s > 500:
            self._rebase(at)
        value = gpu_s * 2.0 ** ((at - self.ref) / self.half_life_s)
        self.scaled[user] = self.scaled.get(user, 0.0) + value

    def at(self, now: float) -> dict[str, float]:
        factor = 2.0 ** (-(now - self.ref) / self.half_life_s)
        return {u: v * factor for u, v in self.scaled.items()}

    def _rebase(self, at: float) -> None:
        self.scaled = self.at(at)
        self.ref = at


class Simulator:
    """One replay of `jobs` on `cluster` under `policy_fn`; call `run()` once.

    With `skip_futile` (the default) the engine does not call the policy at instants where it
    could not act: no pending job's shape fits the free GPUs and no pending job's QOS may preempt
    a running job's QOS by `policy.preempts` or owns a pool. That holds for every policy that starts jobs only
    on free GPUs and preempts only as its Policy says; pass False for one that does not.
    """

    def __init__(self, jobs: list[TraceJob], cluster: Cluster, policy_fn: PolicyFn,
                 policy: Policy | None = None, on_progress: ProgressFn | None = None,
                 usage_half_life_s: float = USAGE_HALF_LIFE_S, skip_futile: bool = True,
                 loads: ColdStarts | None = None) -> None:
        self.cluster = cluster
        #: The cold-start model (model affinity), if the replay has one.
        self.loads = loads
        self.skip_futile = skip_futile
        self.policy_fn = policy_fn
        self.policy = policy or Policy()
        self.on_progress = on_progress
        fits = [j for j in jobs if cluster.can_ever_hold(j)]
        self.result = SimResult(cluster=cluster, outcomes=[Outcome(j) for j in fits],
                                rejected=[j for j in jobs if not cluster.can_ever_hold(j)],
                                loads=loads)
        self.outcome = {o.job.id: o for o in self.result.outcomes}
        # Submissions are already in time order: a cursor over them, not heap entries.
        self.arrivals = sorted(fits, key=lambda j: (j.submit_time, j.id))
        self.next_arrival = 0
        self.events: list[tuple[float, int, int, int]] = []  # (time, kind, job id, epoch)
        self.wakes: set[float] = set()
        self.pending: dict[int, PendingJob] = {}
        self.pending_views = _Views(self.pending)
        # The pending jobs in the orders a pass takes them, kept as jobs come and go (by the
        # policy itself when it keeps its own).
        self.queue: QueueIndex | None = None
        self.watchers: list[QueueWatcher] = []
        if isinstance(policy_fn, QueueWatcher):
            self.watchers.append(policy_fn)
        else:
            self.queue = QueueIndex(self.policy)
            self.watchers.append(self.queue)
        # The running jobs' bookings, kept as jobs start and end, for a policy that builds an
        # availability profile (gq's plan(): rebuilding it every pass had been most of a pass).
        self.held: HeldIndex | None = None if self.queue is None else HeldIndex()
        self.running: dict[int, _Run] = {}
        #: The running jobs as policies see them (the same keys as `running`).
        self.running_jobs: dict[int, RunningJob] = {}
        self.running_views = _Views(self.running_jobs)
        self.epochs: dict[int, int] = {}
        self.finished = 0
        self.usage = Usage(usage_half_life_s)
        gpus = tuple(Gpu(index=i, type=cluster.gpu_type, memory=FAKE_GPU_MEMORY)
                     for i in range(cluster.gpus_per_node))
        self.gpus = gpus
        self.free: dict[str, set[int]] = {n: set(range(cluster.gpus_per_node)) for n in cluster.names()}
        self.views: dict[str, NodeView] = {}
        self.dirty: set[str] = set(self.free)
        self.node_tuple: tuple[NodeView, ...] = ()
        # What `_futile` needs, kept up to date as jobs move rather than recounted per instant:
        # nodes by number of free GPUs, pending jobs by shape, pending and running jobs by QOS.
        self.room = [0] * cluster.gpus_per_node + [cluster.nodes]
        self.shapes: Counter[tuple[int, int]] = Counter()
        self.qos_pending: Counter[str] = Counter()
        self.qos_running: Counter[str] = Counter()
        self.preemptible = {v for victims in self.policy.preempts.values() for v in victims}
        self.checkpointing = any(j.checkpoint_s for j in fits)
        #: Some job may wait for a warm GPU (--cold-wait): plan again when such a wait ends.
        self.cold_waits = any(affinity.cold_wait_s(j.cache_key, j.cold_wait_s, self.policy)
                              for j in fits)
        # A job on a pool node of another QOS may be preempted by the owner, whatever its QOS.
        self.anyone_preemptible = bool(self.policy.pools)

    # ------------------------------------------------------------ the loop

    def run(self) -> SimResult:
        began = time.perf_counter()
        instants = 0
        while self.next_arrival < len(self.arrivals) or self.events:
            now = self._next_time()
            if self._take_instant(now):
                self._schedule(now)
            instants += 1
            if self.on_progress and instants % PROGRESS_EVERY == 0:
                self.on_progress(self.finished, len(self.result.outcomes))
        if self.on_progress:
            self.on_progress(self.finished, len(self.result.outcomes))
        self.result.wall_s = time.perf_counter() - began
        return self.result

    def _next_time(self) -> float:
        candidates = []
        if self.next_arrival < len(self.arrivals):
            candidates.append(self.arrivals[self.next_arrival].submit_time)
        if self.events:
            candidates.append(self.events[0][0])
        return min(candidates)

    def _take_instant(self, now: float) -> bool:
        """Apply every event at `now`; True when a pass could decide something new."""
        changed = self._take_events(now)
        return self._take_arrivals(now) or changed

    def _take_events(self, now: float) -> bool:
        changed = False
        while self.events and self.events[0][0] == now:
            _, kind, job_id, epoch = heapq.heappop(self.events)
            if kind == _WAKE:
                self.wakes.discard(now)
                changed = True
            elif self._is_current(job_id, epoch):
                self._finish(job_id, now)
                changed = True
        return changed

    def _take_arrivals(self, now: float) -> bool:
        arrived_preemptor = False
        while self.next_arrival < len(self.arrivals) and self.arrivals[self.next_arrival].submit_time == now:
            job = self.arrivals[self.next_arrival]
            self._enqueue(job)
            self.next_arrival += 1
            arrived_preemptor |= job.qos in self.policy.preemptors
        # Arrivals alone add constraints: jobs blocked before stay blocked, so only a new job
        # could start, and only on a free GPU or by preempting. (A victim that outlives its
        # preempt_exempt_s has a wake-up of its own.)
        return not self.skip_futile or arrived_preemptor or self.room[0] < self.cluster.nodes

    def _is_current(self, job_id: int, epoch: int) -> bool:
        run = self.running.get(job_id)
        return run is not None and run.epoch == epoch

    def _schedule(self, now: float) -> None:
        for _ in range(MAX_PASSES_PER_INSTANT):
            if self.skip_futile and self._futile():
                return
            decided = self.policy_fn(self._snapshot(now), now, self.policy)
            self.result.plan_calls += 1
            preempted = self._apply(decided, now)
            self._wake_for(decided, now)
            if not preempted:
                return

    def _futile(self) -> bool:
        """True when no policy could act now: no pending shape fits the free GPUs (any start
        would over-allocate, which the engine refuses) and no pending QOS may preempt a running
        one. Skipping such a pass changes nothing but its cost, which on a long queue behind a
        full cluster is most of the replay."""
        return not self._some_shape_fits() and not self._may_preempt()

    def _some_shape_fits(self) -> bool:
        at_least = 0
        nodes_with = [0] * len(self.room)  # nodes_with[g]: nodes with >= g free GPUs
        for g in range(len(self.room) - 1, -1, -1):
            at_least += self.room[g]
            nodes_with[g] = at_least
        return any(nodes_with[g] >= n for n, g in self.shapes)

    def _may_preempt(self) -> bool:
        if any(self.qos_pending[q] for q in self.policy.pools):
            return True  # a pool owner may take back borrowed nodes (not worth a closer look)
        return any(self.qos_pending[q] and any(self.qos_running[v] for v in victims)
                   for q, victims in self.policy.preempts.items())

    def _snapshot(self, now: float) -> Snapshot:
        if self.checkpointing and self._may_preempt():
            self._show_checkpoints(now)
        usage = self.usage.at(now) if self.usage.scaled else {}
        return Snapshot(nodes=self._node_views(), pending=self.pending_views.view(),
                        running=self.running_views.view(), usage=usage, queue=self.queue,
                        held=self.held)

    def _show_checkpoints(self, now: float) -> None:
        """Bring the running jobs' views up to date with their last checkpoints, for a policy
        that picks victims by the work they would lose."""
        for job_id, run in self.running.items():
            at = checkpoint_time(run.job, run.view.start_time, now)
            if at != run.view.checkpoint_time:
                self.running_views.changing()
                run.view = self.running_jobs[job_id] = replace(run.view, checkpoint_time=at)

    def _node_views(self) -> tuple[NodeView, ...]:
        # Only nodes whose GPUs changed since the last pass get a new view.
        if self.dirty:
            for name in self.dirty:
                self.views[name] = NodeView(name=name, gpus=self.gpus, free=frozenset(self.free[name])) \
                    if self.loads is None else NodeView(
                        name=name, gpus=self.gpus, free=frozenset(self.free[name]),
                        warm=self.loads.warm_on(name, len(self.gpus)))
            self.dirty.clear()
            self.node_tuple = tuple(self.views[n] for n in self.free)
        return self.node_tuple

    def _wake_for(self, decided: Plan, now: float) -> None:
        """Plan again when the earliest reservation is due, even if no job event falls there."""
        due = [r.start for r in decided.reservations.values() if now < r.start < math.inf]
        if self.cold_waits:
            due += [self.pending[i].cold_wait_until for i, why in decided.reasons.items()
                    if why == WAITING_WARM and i in self.pending]
        if due:
            self._wake_at(min(due))

    def _wake_at(self, at: float) -> None:
        if at not in self.wakes:
            self.wakes.add(at)
            heapq.heappush(self.events, (at, _WAKE, 0, 0))

    # ------------------------------------------------------------ applying decisions

    def _apply(self, decided: Plan, now: float) -> bool:
        """Preemptions first (they free the GPUs a start may need), then starts."""
        for p in decided.preemptions:
            self._preempt(p, now)
        for s in decided.starts:
            self._start(s, now)
        return bool(decided.preemptions)

    def _start(self, start: Start, now: float) -> None:
        job_view = self.pending.get(start.job_id)
        if job_view is None:
            raise SimInvariantError(f"start of job {start.job_id}, which is not pending")
        self._check_alloc(job_view, start.alloc)
        for name, gpus in start.alloc.items():
            self._set_free(name, self.free[name] - set(gpus))
        job = self.outcome[start.job_id].job
        self._dequeue(job)
        self.qos_running[job.qos] += 1
        epoch = self.epochs.get(job.id, 0) + 1
        self.epochs[job.id] = epoch
        view = RunningJob(id=job.id, qos=job.qos, alloc=dict(start.alloc), start_time=now,
                          time_limit_s=job.time_limit_s, user=job.user)
        self.running[job.id] = _Run(job=job, view=view, epoch=epoch)
        self.running_views.changing()
        self.running_jobs[job.id] = view
        if self.held is not None:
            self.held.add(view)
        outcome = self.outcome[job.id]
        outcome.waited_s += now - (job.submit_time if outcome.queued_at is None
                                   else outcome.queued_at)
        outcome.start, outcome.nodes = now, tuple(start.alloc)
        # The job runs what is left of its trace runtime (all of it unless a checkpoint saved
        # some before a preemption), but the limit cuts it short (TIMEOUT).
        left = job.runtime_s - self.outcome[job.id].saved_s
        if self.loads is not None:  # a cold start loads its model first, on the job's GPUs
            left += self.loads.start(job.id, start.alloc)
        end = now + min(left, job.time_limit_s or math.inf)
        heapq.heappush(self.events, (end, _END, job.id, epoch))
        exempt = self.policy.exempt_s(job.qos, job.time_limit_s)
        if (job.qos in self.preemptible or self.anyone_preemptible) and end > now + exempt:
            # From then on a waiting preemptor may take its GPUs, with or without other events.
            self._wake_at(now + exempt)

    def _check_alloc(self, job: PendingJob, alloc: dict[str, tuple[int, ...]]) -> None:
        if len(alloc) != job.nodes:
            raise SimInvariantError(f"job {job.id} needs {job.nodes} node(s), got {sorted(alloc)}")
        for name, gpus in alloc.items():
            if name not in self.free:
                raise SimInvariantError(f"job {job.id} placed on unknown node {name!r}")
            if len(gpus) != job.gpus or len(set(gpus)) != len(gpus):
                raise SimInvariantError(f"job {job.id} needs {job.gpus} GPU(s) on {name}, got {gpus}")
            if not self.free[name].issuperset(gpus):
                busy = sorted(set(gpus) - self.free[name])
                raise SimInvariantError(f"job {job.id} over-allocates {name} GPU(s) {busy}")

    def _preempt(self, p: Preempt, now: float) -> None:
        run = self.running.get(p.victim)
        if run is None:
            raise SimInvariantError(f"preemption of job {p.victim}, which is not running")
        self._release(run, now)
        outcome = self.outcome[p.victim]
        ran = now - run.view.start_time
        saved = _saved(run.job, ran, run.job.runtime_s - outcome.saved_s)
        # Only the work since its last checkpoint is lost; what it saved, the next run skips.
        outcome.lost_gpu_s += (ran - saved) * run.job.total_gpus
        outcome.saved_s += saved
        outcome.restarts += 1
        outcome.start, outcome.queued_at = None, now
        self.result.preemptions += 1
        # Requeued with its original submit time, so it keeps its age (and its place in FCFS).
        self._enqueue(run.job)

    def _finish(self, job_id: int, now: float) -> None:
        run = self.running[job_id]
        self._release(run, now)
        outcome = self.outcome[job_id]
        outcome.end = now
        outcome.timed_out = run.job.runtime_s - outcome.saved_s > (now - run.view.start_time)
        self.finished += 1

    def _release(self, run: _Run, now: float) -> None:
        del self.running[run.job.id]
        self.running_views.changing()
        del self.running_jobs[run.job.id]
        if self.held is not None:
            self.held.remove(run.job.id)
        self.qos_running[run.job.qos] -= 1
        for name, gpus in run.view.alloc.items():
            self._set_free(name, self.free[name] | set(gpus))
        if run.job.user:
            self.usage.add(run.job.user, (now - run.view.start_time) * run.job.total_gpus, now)

    def _set_free(self, name: str, free: set[int]) -> None:
        self.room[len(self.free[name])] -= 1
        self.room[len(free)] += 1
        self.free[name] = free
        self.dirty.add(name)

    def _enqueue(self, job: TraceJob) -> None:
        self.pending_views.changing()
        view = self.pending[job.id] = pending_view(job, self.policy)
        for watcher in self.watchers:
            watcher.add(view)
        self.shapes[(job.nodes, job.gpus)] += 1
        self.qos_pending[job.qos] += 1

    def _dequeue(self, job: TraceJob) -> None:
        self.pending_views.changing()
        del self.pending[job.id]
        for watcher in self.watchers:
            watcher.remove(job.id)
        shape = (job.nodes, job.gpus)
        self.shapes[shape] -= 1
        if not self.shapes[shape]:
            del self.shapes[shape]  # so that _some_shape_fits only looks at shapes still waiting
        self.qos_pending[job.qos] -= 1


def _saved(job: TraceJob, ran: float, left: float) -> float:
    """Seconds of work a run of `ran` seconds saved by its checkpoints (every
    `job.checkpoint_s` of its run; never the whole of what was `left` to do)."""
    if not job.checkpoint_s:
        return 0.0
    return min(math.floor(ran / job.checkpoint_s) * job.checkpoint_s, left)


def checkpoint_time(job: TraceJob, start: float, now: float) -> float | None:
    """When a run started at `start` last checkpointed by `now`, if it has."""
    if not job.checkpoint_s or now - start < job.checkpoint_s:
        return None
    return start + math.floor((now - start) / job.checkpoint_s) * job.checkpoint_s


def simulate(jobs: list[TraceJob], cluster: Cluster, policy_fn: PolicyFn,
             policy: Policy | None = None, on_progress: ProgressFn | None = None,
             loads: ColdStarts | None = None) -> SimResult:
    return Simulator(jobs, cluster, policy_fn, policy, on_progress, loads=loads).run()
