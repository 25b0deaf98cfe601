"""The availability profile: for every GPU, the intervals it is taken, now and in the future.

Running jobs hold their GPUs until start + time limit; reservations made earlier in the same
pass hold theirs from their start for their limit. Unlike Slurm, which reserves whole nodes even
for 1-GPU jobs, the profile is kept per GPU, so small jobs can be planned around big ones.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from gq.sched import affinity
from gq.sched.placement import gpu_fits, offered, telemetry_limited
from gq.model import Gpu
from gq.sched.types import Alloc, HeldGpus, NodeView, PendingJob, RunningJob


@dataclass
class NodeProfile:
    view: NodeView
    #: GPU index -> sorted (start, end) intervals during which it is taken.
    busy: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    #: CPUs and memory taken by jobs started in this pass (the view's free figures already
    #: leave out running jobs; reservations do not count, being later).
    cpus_started: int = 0
    mem_started: int = 0
    #: GPU index -> (start, end, VRAM) bookings of sharing jobs, each also in `busy`.
    shared: dict[int, list[tuple[float, float, int]]] = field(default_factory=dict)
    #: GPU filter -> the first time each matching GPU is free, ascending (until the next take).
    firsts: dict[tuple[object, ...], list[float]] = field(default_factory=dict)
    #: The caller's `busy` and `shared` for this node (Snapshot.held), or None: they are the
    #: node's own until a booking copies the dict, and the lists in them until a booking
    #: copies that GPU's; the caller's are never changed.
    lent: dict[int, list[tuple[float, float]]] | None = None
    lent_shared: dict[int, list[tuple[float, float, int]]] | None = None
    #: Its bookings are the caller's index's, untouched by this pass (Profile._held_bound).
    as_held: bool = False
    #: GPU index -> the first time it is free (_first_free), until a booking takes it.
    first_free: dict[int, float] = field(default_factory=dict)

    def free_over(self, gpu: int, start: float, end: float) -> bool:
        for b_start, b_end in self.busy.get(gpu, ()):
            if b_start >= end:
                return True  # sorted: nothing later can overlap
            if b_end > start:
                return False
        return True

    def share_room(self, gpu: int, start: float, end: float) -> int:
        """VRAM left over [start, end) for one more sharing job on `gpu`; -1 when an exclusive
        booking overlaps. Every overlapping sharing booking counts, concurrent or not: a bound
        that can only be too low, so VRAM is never over-committed."""
        bookings = sum(1 for b_start, b_end in self.busy.get(gpu, ())
                       if b_start < end and b_end > start)
        sharing = [mem for b_start, b_end, mem in self.shared.get(gpu, ())
                   if b_start < end and b_end > start]
        if bookings > len(sharing):
            return -1
        return self.memory[gpu] - sum(sharing)

    def held_now(self, gpu: int, now: float) -> bool:
        return any(b_start <= now < b_end for b_start, b_end in self.busy.get(gpu, ()))

    @cached_property
    def memory(self) -> dict[int, int]:
        return {g.index: g.memory for g in self.view.gpus}

    def take_shared(self, gpus: tuple[int, ...], start: float, end: float, mem: int) -> None:
        self.take(gpus, start, end)
        shared, lent, booking = self.shared, self.lent_shared, (start, end, mem)
        if lent is None:
            lent = {}
        elif shared is lent:
            shared = self.shared = dict(lent)
        for gpu in gpus:
            bookings = shared.get(gpu)
            if bookings is None:
                shared[gpu] = [booking]
            else:
                if bookings is lent.get(gpu):
                    shared[gpu] = bookings = bookings.copy()  # the caller's: never changed
                insort(bookings, booking)

    def take(self, gpus: tuple[int, ...], start: float, end: float) -> None:
        self.as_held = False
        if self.firsts:
            self.firsts.clear()
        if self.first_free:
            for gpu in gpus:
                self.first_free.pop(gpu, None)
        busy, lent, interval = self.busy, self.lent, (start, end)
        if lent is None:
            lent = _NONE_LENT
        elif busy is lent:
            busy = self.busy = dict(lent)
        for gpu in gpus:
            intervals = busy.get(gpu)
            if intervals is None:
                busy[gpu] = [interval]
            else:
                if intervals is lent.get(gpu):
                    busy[gpu] = intervals = intervals.copy()  # the caller's: never changed
                insort(intervals, interval)


#: Lent to the nodes of no running job (never changed: a booking copies what is lent).
_NONE_HELD: dict[int, list[tuple[float, float]]] = {}
_NONE_SHARED: dict[int, list[tuple[float, float, int]]] = {}
#: What a node that borrowed nothing compares its lists with: none is lent.
_NONE_LENT: dict[int, list[tuple[float, float]]] = {}


def _fits(view: NodeView, gpu: Gpu, job: PendingJob) -> bool:
    return gpu_fits(gpu, job)


class Profile:
    def __init__(self, nodes: tuple[NodeView, ...], running: Sequence[RunningJob], now: float,
                 owner: dict[str, str] | None = None, closed: set[str] | None = None,
                 held: HeldGpus | None = None):
        self.now = now
        #: Node -> the QOS whose pool it is in; the owners whose pools are not lent out now.
        self.owner, self.closed = owner or {}, closed or set()
        self._match_cache: dict[tuple[object, ...], list[int]] = {}
        self._open_cache: dict[tuple[object, ...], list[tuple[int, NodeProfile, list[int]]]] = {}
        self._bound_cache: dict[tuple[object, ...], _Bounds] = {}
        self._fit_cache: dict[tuple[object, ...], _Fits] = {}
        #: Names of the nodes booked in this pass, in order (they invalidate kept bounds).
        self._booked: list[str] = []
        #: The caller's index of the running jobs' bookings, when this pass took them from it.
        self._held = held if held is not None and held.usable(now) else None
        if self._held is not None:
            self.nodes = self._borrow(nodes, self._held)
        else:
            self.nodes = {n.name: NodeProfile(view=n) for n in nodes}
            self._book_running(running, now)
        self._explain_taken(nodes, now)
        #: Free-now GPU count per node, kept up to date as jobs start in this pass.
        self.free_now = {n.name: len(n.free) for n in nodes}
        self._free_total = sum(len(n.free) for n in nodes if n.schedulable)

    def _borrow(self, nodes: tuple[NodeView, ...], held: HeldGpus) -> dict[str, NodeProfile]:
        """The running jobs' bookings from the caller's index: each node's lists as they are
        (a pass copies a list only to book that GPU), which is what `_book_running` would
        build (gq/sched/held.py says why starts before now change nothing)."""
        busy, shared = held.busy, held.shared
        out = {}
        for view in nodes:
            kept = busy.get(view.name) or _NONE_HELD
            kept_shared = shared.get(view.name) or _NONE_SHARED
            out[view.name] = NodeProfile(view=view, busy=kept, shared=kept_shared, lent=kept,
                                         lent_shared=kept_shared, as_held=True)
        return out

    def _book_running(self, running: Sequence[RunningJob], now: float) -> None:
        soon = now + 1.0
        for job in running:
            # An overdue job still holds its GPUs; a job being stopped frees them any moment.
            end = soon if job.ending else max(job.end_estimate, soon)
            for name, gpus in job.alloc.items():
                node = self.nodes.get(name)
                if node is None:
                    continue
                if job.share_mem:
                    node.take_shared(gpus, now, end, job.share_mem)
                else:
                    node.take(gpus, now, end)

    def _explain_taken(self, nodes: tuple[NodeView, ...], now: float) -> None:
        for view in nodes:
            # A GPU the snapshot says is taken but no running job explains (a job still being
            # stopped) is taken now, and free soon after. (When as many GPUs have bookings as
            # are taken, and none of them is free, every taken GPU is explained.)
            node = self.nodes[view.name]
            if len(node.busy) == len(view.gpus) - len(view.free) \
                    and view.free.isdisjoint(node.busy):
                continue
            for gpu in view.gpus:
                if gpu.index not in view.free and not node.busy.get(gpu.index):
                    node.take((gpu.index,), now, now + 1.0)

    def any_free_now(self) -> bool:
        return self._free_total > 0

    def room_now(self) -> list[int]:
        """Free GPUs per schedulable node, most first: a job needing g GPUs on each of n nodes
        can start now only if room[n - 1] >= g (needed, not sufficient, for `place`)."""
        return sorted((free for name, free in self.free_now.items()
                       if self.nodes[name].view.schedulable), reverse=True)

    def end_times(self) -> list[float]:
        """Every time some GPU frees up, ascending: the candidate start times of a reservation."""
        times = {end for node in self.nodes.values() for ivs in node.busy.values()
                 for _, end in ivs if end > self.now and end != math.inf}
        return sorted(times)

    def earliest(self, job: PendingJob) -> tuple[float, Alloc] | None:
        """The earliest time after now, and the GPUs, where the job fits for its whole limit
        (ties to the node that comes first)."""
        if job.nodes > 1:
            return self._earliest_gang(job)
        length = job.time_limit_s or math.inf
        # No node can start the job before its `gpus`-th GPU first comes free: visit nodes by
        # that bound and stop once it cannot beat the best start found.
        bounds = self._bounds(job)
        best: tuple[float, int, NodeProfile, list[int]] | None = None
        for bound, rank, node, matching in bounds:
            if best is not None and (bound, rank) >= best[:2]:
                break
            starts = sorted({end for g in matching for _, end in node.busy.get(g, ())
                             if end >= bound and self.now < end < math.inf})
            for t in starts:
                if best is not None and (t, rank) >= best[:2]:
                    break
                free = [g for g in matching if node.free_over(g, t, t + length)]
                if len(free) >= job.gpus:
                    best = (t, rank, node, free)
                    break
        if best is None:
            return None
        t, _, node, free = best
        return t, {node.view.name: tuple(self._prefer_unreserved(node, free, job.gpus, t))}

    def _earliest_gang(self, job: PendingJob) -> tuple[float, Alloc] | None:
        bounds = sorted(bound for bound, *_ in self._bounds(job))
        if len(bounds) < job.nodes:
            return None
        # Not before `nodes` nodes could each hold a rank.
        for start in self.end_times():
            if start < bounds[job.nodes - 1]:
                continue
            alloc = self.place(job, start)
            if alloc is not None:
                return start, alloc
        return None

    def _bounds(self, job: PendingJob) -> list[tuple[float, int, NodeProfile, list[int]]]:
        """Per node that could take a rank of `job`, the earliest time it could: when its
        `gpus`-th matching GPU first comes free (a lower bound: it may be booked again later);
        with the node's rank in order and its matching GPUs. Sorted by bound, then rank (unique,
        so a comparison never reaches the node). Do not change the list: it is kept for the
        pass, and only the entries of nodes booked since it was last asked for are redone
        (a pass reserves for up to MAX_RESERVATIONS jobs, mostly of a few shapes)."""
        key = (job.gpu_type, job.gpu_mem, job.qos, job.gpus, job.allowed)
        kept = self._bound_cache.get(key)
        if kept is None:
            kept = self._bound_cache[key] = _Bounds(
                {node.view.name: (rank, node, matching)
                 for rank, node, matching in self._open_nodes(job) if len(matching) >= job.gpus},
                len(self._booked))
            for name in kept.nodes:
                kept.put(name, self._bound(kept, name, job), in_order=False)
            kept.entries.sort()
            return kept.entries
        for name in self._booked_since(kept):
            if name in kept.nodes:
                kept.remove(name)
                kept.put(name, self._bound(kept, name, job))
        return kept.entries

    def _booked_since(self, kept: _Bounds | _Fits) -> list[str]:
        """The nodes booked since `kept` was last brought up to date (each once, in order of
        first booking), which it is now to redo."""
        names = list(dict.fromkeys(self._booked[kept.synced:]))
        kept.synced = len(self._booked)
        return names

    def _bound(self, kept: _Bounds, name: str, job: PendingJob) -> float:
        _, node, matching = kept.nodes[name]
        key = (job.gpu_type, job.gpu_mem)
        firsts = node.firsts.get(key)
        if firsts is None:
            if node.as_held and self._held is not None and job.gpus:
                return self._held_bound(node, key, matching, job.gpus)
            # Each GPU's first free time is kept until a booking takes that GPU: a reservation
            # books a few GPUs of a node, and the node's list is then redone from the others'.
            known, busy, now = node.first_free, node.busy, self.now
            firsts = []
            for g in matching:
                t = known.get(g)
                if t is None:
                    t = known[g] = _first_free(busy.get(g, []), now)
                firsts.append(t)
            firsts.sort()
            node.firsts[key] = firsts
        return firsts[job.gpus - 1] if job.gpus else self.now

    def _held_bound(self, node: NodeProfile, key: tuple[object, ...], matching: list[int],
                    gpus: int) -> float:
        """`_bound` of a node this pass has not booked, from what the caller's index keeps
        for it until its running jobs change: its bookings then all begin by now and end after
        (HeldGpus.usable), so a GPU is first free when its last one ends, or now."""
        assert self._held is not None
        memo = self._held.firsts(node.view.name)
        kept = memo.get(key)
        if kept is None or kept[0] != matching:  # (a node's telemetry may change what matches)
            busy = node.busy
            ends = sorted(max(end for _, end in busy[g]) for g in matching if g in busy)
            kept = memo[key] = (list(matching), len(matching) - len(ends), ends)
        _, free, ends = kept
        return self.now if gpus <= free else ends[gpus - 1 - free]

    def _open_nodes(self, job: PendingJob) -> list[tuple[int, NodeProfile, list[int]]]:
        """Schedulable nodes the job's QOS may use, in order, with their GPUs matching the
        job's filters (fixed for the pass, so kept per filter and QOS)."""
        key = (job.gpu_type, job.gpu_mem, job.qos, job.allowed)
        found = self._open_cache.get(key)
        if found is None:
            found = self._open_cache[key] = [
                (rank, node, self._matching(node, job))
                for rank, node in enumerate(self.nodes.values())
                if node.view.schedulable and self.pool_rank(node.view.name, job) is not None]
        return found

    def _matching(self, node: NodeProfile, job: PendingJob) -> list[int]:
        # Keyed by the GPU tuple's identity: nodes of one kind may share one (the simulator's
        # do), and the snapshot keeps it alive for the pass. A node whose telemetry rules GPUs
        # out has its own entry.
        view = node.view
        limited = telemetry_limited(view)
        key = (view.name if limited else id(view.gpus), job.gpu_type, job.gpu_mem)
        found = self._match_cache.get(key)
        if found is None:
            fits = offered if limited else _fits
            found = self._match_cache[key] = [g.index for g in view.gpus if fits(view, g, job)]
        return found

    def candidates(self, node: NodeProfile, job: PendingJob, start: float) -> list[int]:
        """GPUs of `node` that match the job and are free from `start` for its whole limit."""
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        if job.share:
            need = job.gpu_mem or 0
            return [g for g in self._matching(node, job)
                    if node.share_room(g, start, end) >= need]
        return [g for g in self._matching(node, job) if node.free_over(g, start, end)]

    def place(self, job: PendingJob, start: float) -> Alloc | None:
        """GPUs for every rank of `job` from `start`, best fit, or None."""
        if start == self.now:
            fits = [fit for fit in self._fits_now(job).values() if fit is not None]
        else:
            fits = [fit for node in self.nodes.values()
                    if (fit := self._fit(node, job, start)) is not None]
        if len(fits) < job.nodes:
            return None
        # (Node names are unique: a comparison never reaches the GPUs.)
        best = [min(fits)] if job.nodes == 1 else heapq.nsmallest(job.nodes, fits)
        return {name: tuple(gpus) for *_, name, gpus in best}

    def _fits_now(self, job: PendingJob) -> dict[str, _Fit | None]:
        """Every node's fit for a rank of `job` starting now, kept for the pass per request
        and redone only for the nodes booked since: a pass that starts hundreds of jobs on a
        big cluster would otherwise weigh every node for every job (~1 s for 256 starts on 256
        nodes). A fit depends only on the node's bookings and these fields of the job."""
        key = (job.gpus, job.gpu_type, job.gpu_mem, job.cpus, job.mem, job.time_limit_s, job.qos,
               job.share, job.allowed, job.cache_key, affinity.warm_only(job, self.now))
        kept = self._fit_cache.get(key)
        if kept is None:
            # (A node without `gpus` free now cannot take an exclusive rank: _fit's first test,
            # made here, without a call for each of the many full nodes.)
            free_now, need, now = self.free_now, 0 if job.share else job.gpus, self.now
            kept = self._fit_cache[key] = _Fits(
                {name: self._fit(node, job, now) if free_now[name] >= need else None
                 for name, node in self.nodes.items()}, len(self._booked))
        else:
            for name in self._booked_since(kept):
                kept.fits[name] = self._fit(self.nodes[name], job, self.now)
        return kept.fits

    def _fit(self, node: NodeProfile, job: PendingJob, start: float) -> _Fit | None:
        """How well a rank of `job` fits `node` from `start` (lower is better), with its GPUs;
        None if it does not."""
        now = start <= self.now
        view, name = node.view, node.view.name
        if not view.schedulable or (now and not job.share and self.free_now[name] < job.gpus):
            return None
        pool_rank = self.pool_rank(name, job)
        if pool_rank is None:
            return None
        if now and (view.cpus_free - node.cpus_started < job.cpus
                    or view.mem_free - node.mem_started < job.mem):
            return None
        gpus = self.candidates(node, job, start) if job.gpus else []
        if len(gpus) < job.gpus:
            return None
        cold = 0
        if job.share:
            fit = self._share_fit(node, job, gpus, start)
            chosen = fit[-1]
        else:
            chosen = self._prefer_unreserved(node, gpus, job.gpus, start)
            # Best fit: the node with the fewest free GPUs left over, so 1-GPU work packs onto
            # busy nodes and idle nodes stay whole; name breaks ties so plans are stable.
            fit = (self.free_now[name] - job.gpus, _future_load(node, start), name, chosen)
        if job.cache_key is not None:
            # Warm GPUs first (gq/sched/affinity.py): among those free for the job's limit.
            warm = affinity.prefer_warm(view, gpus, chosen, job, self.now)
            if warm is None:
                return None
            chosen, cold = warm
        return (pool_rank, cold, *fit[:-1], chosen)

    def pool_rank(self, name: str, job: PendingJob) -> int | None:
        """Where a node stands for a job: its QOS's own pool first (0), then nodes of no pool
        (1), then another QOS's pool, borrowed (2); None while that owner has a job waiting,
        or when the job may not run there (its partition, -w, -x, --constraint)."""
        if job.allowed is not None and name not in job.allowed:
            return None
        owner = self.owner.get(name)
        if owner is None:
            return 1
        if owner == job.qos:
            return 0
        return None if owner in self.closed else 2

    def _share_fit(self, node: NodeProfile, job: PendingJob, gpus: list[int],
                   start: float) -> tuple[int, int, str, list[int]]:
        """A sharing job's best fit on `node`: the GPUs with the least VRAM left that still
        hold it (so sharing jobs pile onto GPUs already shared and whole GPUs stay free), and
        the node where it takes the fewest GPUs no job holds now."""
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        chosen = sorted(gpus, key=lambda g: (node.share_room(g, start, end), g))[:job.gpus]
        fresh = sum(1 for g in chosen if not node.held_now(g, self.now))
        return fresh, self.free_now[node.view.name] - fresh, node.view.name, sorted(chosen)

    def _prefer_unreserved(self, node: NodeProfile, gpus: list[int], count: int,
                           start: float) -> list[int]:
        """Among suitable GPUs, take those with no later booking first (lowest index next)."""
        if count >= len(gpus):
            return sorted(gpus)  # all of them, whatever their bookings
        def later(gpu: int) -> int:
            return sum(1 for b_start, _ in node.busy.get(gpu, ()) if b_start >= start)
        return sorted(sorted(gpus, key=later)[:count])

    def book(self, job: PendingJob, alloc: Alloc, start: float) -> None:
        end = start + job.time_limit_s if job.time_limit_s else math.inf
        self._booked.extend(alloc)
        for name, gpus in alloc.items():
            node = self.nodes[name]
            taken = len(gpus)  # of the GPUs no job held (a sharing job may join held ones)
            if job.share:
                taken = sum(1 for g in gpus if not node.held_now(g, self.now))
                node.take_shared(gpus, start, end, job.gpu_mem or 0)
            else:
                node.take(gpus, start, end)
            if start <= self.now:
                self.free_now[name] -= taken
                self._free_total -= taken
                node.cpus_started += job.cpus
                node.mem_started += job.mem


#: A node's fit for a rank of a job: (pool rank, cold GPUs (0 without a cache key), free GPUs
#: left, later bookings, node name, the GPUs), as Profile.place orders them.
_Fit = tuple[int, int, int, int, str, list[int]]


@dataclass
class _Fits:
    """Every node's fit for one kind of request starting now, as `Profile._fits_now` keeps
    them: `synced` is how much of Profile._booked they reflect."""

    fits: dict[str, _Fit | None]
    synced: int


class _Bounds:
    """A job shape's start bounds per node, sorted, as `Profile._bounds` keeps them."""

    def __init__(self, nodes: dict[str, tuple[int, NodeProfile, list[int]]], synced: int):
        #: Node name -> (rank, node, matching GPUs), for the nodes that could take a rank.
        self.nodes = nodes
        self.entries: list[tuple[float, int, NodeProfile, list[int]]] = []
        self.by_name: dict[str, tuple[float, int, NodeProfile, list[int]]] = {}
        #: How much of Profile._booked the entries reflect.
        self.synced = synced

    def put(self, name: str, bound: float, in_order: bool = True) -> None:
        """Add a node's entry (at the end, unsorted, while the list is built)."""
        if bound < math.inf:
            entry = self.by_name[name] = (bound, *self.nodes[name])
            if in_order:
                insort(self.entries, entry)
            else:
                self.entries.append(entry)

    def remove(self, name: str) -> None:
        entry = self.by_name.pop(name, None)
        if entry is not None:
            del self.entries[bisect_left(self.entries, entry)]


def _first_free(intervals: list[tuple[float, float]], now: float) -> float:
    """The first time from `now` on that a GPU with these (start-sorted) bookings is free."""
    t = now
    for start, end in intervals:
        if start > t:
            break
        if end > t:
            t = end
    return t


def _future_load(node: NodeProfile, start: float) -> int:
    """Bookings that begin after `start` on this node: fewer is better for a job starting then."""
    return sum(1 for ivs in node.busy.values() for b_start, _ in ivs if b_start > start)

