"""What the scheduler sees (a snapshot) and what it decides (a plan)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple, Protocol

from gq.defaults import BIG_JOB_GPUS, EXEMPT_LIMIT_SHARE, PREEMPT_AFTER_S
from gq.model import Gpu

#: Node name -> GPU indices on it, in node rank order.
Alloc = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class NodeView:
    """A node as the scheduler sees it: what it has and what is free now."""

    name: str
    gpus: tuple[Gpu, ...]
    #: Indices of GPUs no job holds.
    free: frozenset[int]
    cpus_free: int = 0
    mem_free: int = 0
    #: False for DOWN and DRAIN nodes: they take no new work.
    schedulable: bool = True
    #: From the node's fresh telemetry (gqd's; the simulator has none, so nothing is skipped):
    #: GPU index -> the VRAM processes that are not gq's jobs leave free on it (a GPU left out:
    #: its total), and the GPUs too hot for new jobs. Placement offers a job only GPUs with
    #: its --gpu-mem free that are not hot (`placement.offered`).
    vram_free: Mapping[int, int] = field(default_factory=dict)
    hot: frozenset[int] = frozenset()
    #: GPU index -> the cache keys warm on it (model affinity, gq/sched/affinity.py): the keys
    #: of its recent jobs and of the node's cache directories.
    warm: Mapping[int, frozenset[str]] = field(default_factory=dict)


class Shape(NamedTuple):
    """A pending job's request apart from its time limit (`PendingJob.shape`)."""

    nodes: int
    gpus: int
    gpu_type: str | None
    gpu_mem: int | None
    cpus: int
    mem: int
    share: bool
    allowed: frozenset[str] | None = None


@dataclass(frozen=True)
class PendingJob:
    id: int
    qos: str
    submit_time: float
    nodes: int = 1
    gpus: int = 1
    gpu_type: str | None = None
    gpu_mem: int | None = None
    cpus: int = 0
    mem: int = 0
    #: Seconds; 0 means no limit (the job can then never be planned around, only started).
    time_limit_s: int = 0
    #: Admin adjustment added to the computed priority.
    nice: int = 0
    user: str = ""
    account: str = ""
    #: Shares its GPUs with other sharing jobs while their VRAM (`gpu_mem` each) fits; never
    #: with an exclusive job.
    share: bool = False
    #: The nodes it may run on (its partition, -w, -x, --constraint); None: any node.
    allowed: frozenset[str] | None = None
    #: `--cache-key`: placement prefers GPUs where it is warm (gq/sched/affinity.py).
    cache_key: str | None = None
    #: Before this time (its eligibility + `--cold-wait`) it takes only GPUs where its key is
    #: warm; 0: any GPU.
    cold_wait_until: float = 0.0

    # Computed once per job object (the simulator keeps its objects between passes): a pass
    # reads them for every queued job.
    @cached_property
    def shape(self) -> Shape:
        """What placement depends on besides the time limit: jobs of one shape fit alike."""
        return Shape(self.nodes, self.gpus, self.gpu_type, self.gpu_mem, self.cpus, self.mem,
                     self.share, self.allowed)

    @cached_property
    def area(self) -> float:
        """GPU-seconds by its limit (an unlimited job is infinitely large)."""
        return self.nodes * max(self.gpus, 1) * (self.time_limit_s or math.inf)


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs now; it is planned to hold them until start + limit."""

    id: int
    qos: str
    alloc: Alloc
    start_time: float
    time_limit_s: int = 0
    cpus: int = 0
    mem: int = 0
    user: str = ""
    #: VRAM it takes on each of its GPUs when it shares them (0: it holds them exclusively).
    share_mem: int = 0
    #: Being stopped (cancelled or preempted): never chosen again, and its GPUs are as good
    #: as free for planning.
    ending: bool = False
    #: When it last saved its progress (a checkpoint it reported), if it did: a preemption
    #: throws away only the work done since.
    checkpoint_time: float | None = None

    @property
    def end_estimate(self) -> float:
        return self.start_time + self.time_limit_s if self.time_limit_s else math.inf


#: (-QOS tier, GPUs x limit, id, job): backfill order before priority breaks a tie.
SizeKey = tuple[int, float, int, "PendingJob"]
#: (-QOS tier, submit time, id, job): the order aged jobs are taken in.
AgeKey = tuple[int, float, int, "PendingJob"]


class QueueOrder(Protocol):
    """The pending jobs kept in the orders a pass takes them, by a caller that sees them come
    and go (gq/sched/queue.py's QueueIndex), so that a pass need not sort the queue. A pass
    only reads it; the caller must not change it during one."""

    @property
    def by_size(self) -> Sequence[SizeKey]: ...

    @property
    def by_age(self) -> Sequence[AgeKey]: ...

    @property
    def big_by_age(self) -> Sequence[AgeKey]:
        """The keys of `by_age` of the jobs of BIG_JOB_GPUS or more."""

    @property
    def by_class(self) -> Mapping[tuple[int, str, int, int, str, bool], Sequence[AgeKey]]:
        """The keys of `by_age` by class (gq/sched/merge.py's ClassKey), each in that order."""

    @property
    def qos(self) -> Mapping[str, int]:
        """QOS -> pending jobs of it."""

    @property
    def sharing(self) -> int:
        """Pending jobs that share GPUs."""

    @property
    def gpuless(self) -> int:
        """Pending jobs that need no GPU."""

    @property
    def keyed(self) -> int:
        """Pending jobs with a cache key (which a --cold-wait may keep off cold GPUs)."""


class HeldGpus(Protocol):
    """The running jobs' bookings kept by a caller that sees jobs start and end
    (gq/sched/held.py's HeldIndex), so that a pass need not rebuild them. A pass only reads
    them (it copies a GPU's list before booking it); the caller must not change them during
    one."""

    @property
    def busy(self) -> Mapping[str, dict[int, list[tuple[float, float]]]]:
        """Node -> GPU index -> sorted (start, end) bookings of running jobs."""

    @property
    def shared(self) -> Mapping[str, dict[int, list[tuple[float, float, int]]]]:
        """Node -> GPU index -> sorted (start, end, VRAM) bookings of sharing running jobs."""

    def usable(self, now: float) -> bool:
        """Whether a pass at `now` may take the bookings as they are (else it builds them)."""

    def firsts(self, node: str) -> dict[tuple[object, ...], tuple[list[int], int, list[float]]]:
        """What passes work out from `node`'s bookings, kept until they change
        (Profile._held_bound)."""


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    #: (Sequences that do not change during the pass: gqd hands tuples; the simulator views
    #: of its own collections that it copies only if someone holds them when they change.)
    pending: Sequence[PendingJob]
    running: Sequence[RunningJob] = ()
    #: Decayed GPU-seconds used per user, for fair share (the caller keeps the decay).
    usage: dict[str, float] = field(default_factory=dict)
    #: Optional: the pending jobs kept in order by a caller that sees them come and go (the
    #: simulator; gqd syncs one each pass), so that a pass need not order the queue
    #: (gq/sched/queue.py). It must hold exactly `pending`, under the same policy.
    queue: QueueOrder | None = None
    #: Optional: the running jobs' bookings kept by a caller that sees them start and end (the
    #: simulator; gqd syncs one each pass), so that a pass need not rebuild them
    #: (gq/sched/held.py). It must hold exactly `running`.
    held: HeldGpus | None = None


@dataclass(frozen=True)
class Policy:
    """The scheduler's knobs, built by the head from its config (or by the simulator)."""

    qos_priority: dict[str, int] = field(default_factory=dict)
    weight_qos: int = 1000
    weight_age: int = 1000
    max_age_s: int = 7 * 86400
    #: Priority points of a user with no recent usage (fewer as their share of usage grows).
    weight_fairshare: int = 0
    #: Priority points per doubling of the response ratio (wait + limit) / limit.
    weight_ratio: int = 1000
    #: How many blocked jobs (in order) get a reservation; chosen by simulation (SCHEDULING.md).
    reserve_depth: int = 1
    #: Jobs waiting longer than this go first and always get a reservation (seconds).
    reserve_age_s: int = 96 * 3600
    #: The same for big jobs (BIG_JOB_GPUS or more), if set (0: reserve_age_s): they wait
    #: longest for room, so they may need to come first sooner.
    reserve_age_big_s: int = 0
    #: How many blocked big jobs (BIG_JOB_GPUS or more), first come first, get a reservation
    #: besides, so that however small jobs are ordered they cannot push those back.
    big_reserve_depth: int = 4
    #: Aged jobs are all taken in their order (oldest first), each blocked one reserving, before
    #: the younger ones are backfilled smallest first.
    aged_in_order: bool = False
    #: Jobs behind the reserved ones are tried smallest first (GPUs x limit), not by priority.
    backfill_smallest_first: bool = True
    #: QOS -> the QOS it may preempt.
    preempts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: A job started less than this long ago is not preempted (seconds), nor one that has run
    #: less than EXEMPT_LIMIT_SHARE of its limit: a 2-minute inference job may be preempted
    #: after 30 s, a training job after this long. `qos_exempt_s` overrides it per QOS.
    preempt_exempt_s: int = 600
    qos_exempt_s: dict[str, int] = field(default_factory=dict)
    #: QOS -> seconds a blocked job of it waits rather than preempt: it preempts only when its
    #: reservation is further off, and never a job that ends (by its limit) sooner
    #: (PREEMPT_AFTER_S when not given).
    preempt_after_s: dict[str, float] = field(default_factory=dict)
    #: QOS -> the share of the GPUs its pending work may always claim: while it holds less, its
    #: jobs go first, and its jobs within that share are never preempted.
    min_share: dict[str, float] = field(default_factory=dict)
    #: Job choice by warmth (gq/sched/affinity.py `swap_warm`): a cold start of a job with a
    #: cache key that has waited less than this (seconds) gives its GPUs to a queued job whose
    #: key is warm on them; 0: never. On by default: it changes nothing for jobs without a key,
    #: and with the default cold wait it meets issue 20's target (docs/SCHEDULING.md).
    warm_swap_s: float = 300.0
    #: Seconds a job with a cache key and no --cold-wait of its own waits for a warm GPU
    #: (`affinity.cold_wait_s`): half of a typical 30 s model load, so that waiting it out and
    #: then starting cold costs the job at most half again of a cold start. 0: no wait.
    cold_wait_s: float = 15.0
    #: QOS -> the nodes it owns (its guaranteed pool). Jobs of other QOS may borrow them while
    #: no job of the owner waits, and are preempted when one needs them back.
    pools: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Work done only to tell users about their jobs: reserve when nothing is free now (when
    #: jobs should start), and give every pending job its priority and reason. The daemon wants
    #: that for `gq show`; decisions are the same either way, so the simulator turns it off and
    #: gets only the priorities and reasons the pass needed.
    explain: bool = True

    @cached_property
    def preemptors(self) -> frozenset[str]:
        """QOS whose blocked jobs may preempt: those with victims, and pool owners."""
        return frozenset(self.preempts) | frozenset(self.pools)

    def aged_test(self, now: float) -> Callable[[PendingJob], bool]:
        """Whether a job has waited its `reserve_age_s` (or `reserve_age_big_s`) at `now`."""
        small_before = now - self.reserve_age_s
        if not self.reserve_age_big_s:
            return lambda j: j.submit_time <= small_before
        big_before = now - self.reserve_age_big_s
        return lambda j: j.submit_time <= (big_before if j.nodes * j.gpus >= BIG_JOB_GPUS
                                           else small_before)

    def aged_bounds(self, now: float) -> tuple[float, float]:
        """Submit times at or before which every job is aged, and some (of one size) are."""
        cuts = (now - self.reserve_age_s, now - (self.reserve_age_big_s or self.reserve_age_s))
        return min(cuts), max(cuts)

    def exempt_s(self, qos: str, limit_s: int) -> float:
        """How long a job of `qos` with this limit runs before it may be preempted."""
        base = self.qos_exempt_s.get(qos, self.preempt_exempt_s)
        return min(base, limit_s * EXEMPT_LIMIT_SHARE) if limit_s else base

    def after_s(self, qos: str) -> float:
        """How long a blocked job of `qos` waits rather than preempt (see `preempt_after_s`)."""
        return self.preempt_after_s.get(qos, PREEMPT_AFTER_S)

    @cached_property
    def owner(self) -> dict[str, str]:
        """Node name -> the QOS whose pool it is in."""
        return {node: qos for qos, nodes in self.pools.items() for node in nodes}


@dataclass(frozen=True)
class Start:
    job_id: int
    alloc: Alloc


@dataclass(frozen=True)
class Reservation:
    """Where and when a blocked job is planned to start; nothing may delay it."""

    job_id: int
    start: float
    alloc: Alloc


@dataclass(frozen=True)
class Preempt:
    """Stop `victim` (signal, grace, kill, requeue) so that `for_job` can start."""

    victim: int
    for_job: int


@dataclass
class Plan:
    starts: list[Start] = field(default_factory=list)
    #: Pending job id -> why it is still pending (Slurm's reason names), for the jobs the pass
    #: looked at. `reason` tells every job's.
    reasons: dict[int, str] = field(default_factory=dict)
    #: Priorities the pass computed (those that decided an order); `gq show` computes them
    #: when asked (gq.sched.priority), as they depend only on the job, time and usage.
    priorities: dict[int, int] = field(default_factory=dict)
    reservations: dict[int, Reservation] = field(default_factory=dict)
    preemptions: list[Preempt] = field(default_factory=list)
    #: With `Policy.explain`: the reason of a job the pass left out, which waits behind those
    #: it looked at (see `reason`); the same for every job of one shape.
    behind: Callable[[PendingJob], str] | None = field(default=None, compare=False, repr=False)

    def reason(self, job: PendingJob) -> str | None:
        """Why a pending job of the snapshot that did not start still waits: its entry in
        `reasons`, else (with explain) Priority, or ReqNodeNotAvail when no node could ever
        hold it. A long queue behind a full cluster is mostly such jobs; naming each one's
        reason would cost the pass a look at every job."""
        found = self.reasons.get(job.id)
        if found is None and self.behind is not None:
            found = self.behind(job)
        return found
