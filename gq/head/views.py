"""The scheduler's views of gqd's jobs and nodes (gq.sched's PendingJob, RunningJob, NodeView),
each kept from pass to pass until what it was made from changes.

Every pass reads the whole queue's views, thousands of running jobs' and every node's; few change
between two passes, and a kept view keeps the caches the scheduler keys on it. A view is a pure
function of what it was made from, and each kept one is checked against that (`is` on a spec,
allocation or GPU list, which are replaced and never changed in place): a view made from a change
that was rolled back is simply made again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gq import defaults
from gq.head.index import JobIndex
from gq.head.reasons import STOPPING
from gq.model import Gpu, Job, JobSpec, JobState, Node, NodeState
from gq.sched import NodeView, PendingJob, Policy, RunningJob, affinity


#: A node and the GPUs jobs hold there -> (GPU index -> VRAM free of processes not gq's, the
#: GPUs too hot for new jobs), from its telemetry.
Limits = Callable[[Node, frozenset[int]], tuple[dict[int, int], frozenset[int]]]


def _anywhere(spec: JobSpec) -> frozenset[str] | None:
    return None


class Views:
    def __init__(self) -> None:
        #: The nodes a job's spec lets it run on (its partition, --nodelist, --exclude,
        #: --constraint: gq/head/partitions.py); None: any. Set by the head; pending views are
        #: made again (`reset`) when what it answers changes.
        self.allowed: Callable[[JobSpec], frozenset[str] | None] = _anywhere
        #: Job id -> (the spec it was made from, the scheduler's view of the pending job).
        self.pending: dict[int, tuple[JobSpec, PendingJob]] = {}
        #: Job id -> (its spec, alloc, (start time, ending, checkpoint time) and the
        #: scheduler's view of it holding GPUs, made from them).
        self.running: dict[int, tuple[JobSpec, dict, tuple[Any, ...], RunningJob]] = {}
        #: Node name -> (its GPU list, what else its view was made from, the view).
        self.nodes: dict[str, tuple[list[Gpu], tuple[Any, ...], NodeView]] = {}
        #: Job id -> when a pass first saw it eligible (its --cold-wait runs from then; a gqd
        #: restart starts it again).
        self.eligible_since: dict[int, float] = {}
        #: The scheduler's knobs, for the default --cold-wait of a job with a cache key (set
        #: by the head on each config; views are made again then).
        self.policy = Policy()

    def reset(self) -> None:
        """Where jobs may run changed (a node came, or its features did): pending views anew."""
        self.pending.clear()

    def clear(self) -> None:
        """Every kept view made again (after a failed pass); a job's --cold-wait clock is kept."""
        self.pending.clear()
        self.running.clear()
        self.nodes.clear()

    def forget(self, job_id: int) -> None:
        """The job left memory."""
        self.pending.pop(job_id, None)
        self.running.pop(job_id, None)
        self.eligible_since.pop(job_id, None)

    def of_pending(self, jobs: Iterable[Job], now: float = 0.0) -> tuple[PendingJob, ...]:
        """The view of each pending job, made once per spec (`gq update` replaces the spec);
        `now`: the pass's time, from which a job first seen eligible counts its --cold-wait."""
        views, out = self.pending, []
        for job in jobs:
            kept = views.get(job.id)
            if kept is None or kept[0] is not job.spec:
                wait = affinity.cold_wait_s(job.spec.cache_key, job.spec.cold_wait_s,
                                            self.policy)
                since = self.eligible_since.setdefault(job.id, now) if wait else 0.0
                kept = views[job.id] = (job.spec, pending_view(job, self.allowed(job.spec),
                                                               since, wait))
            out.append(kept[1])
        return tuple(out)

    def of_running(self, job: Job) -> RunningJob:
        """The view of a job holding GPUs, made again only when what it shows changed (a new
        run or spec, it began to end (it ended, or is being stopped), or it checkpointed)."""
        ending = job.state != JobState.RUNNING or job.reason in STOPPING
        kept = self.running.get(job.id)
        if kept is None or kept[0] is not job.spec or kept[1] is not job.alloc \
                or kept[2] != (job.start_time, ending, job.checkpoint_time):
            kept = self.running[job.id] = (job.spec, job.alloc,
                                           (job.start_time, ending, job.checkpoint_time),
                                           running_view(job, ending))
        return kept[3]

    def of_nodes(self, nodes: Iterable[Node], index: JobIndex,
                 limits: Limits | None = None) -> tuple[NodeView, ...]:
        """Every node's view: what the jobs holding GPUs there leave free, and what its
        telemetry rules out (`limits`, given the GPUs jobs hold: gq/head/telemetry.py)."""
        nodes = list(nodes)
        used: dict[str, set[int]] = {n.name: set() for n in nodes}
        cpus: dict[str, int] = dict.fromkeys(used, 0)
        mem: dict[str, int] = dict.fromkeys(used, 0)
        for job in index.placed():
            if job.holds_alloc:
                for node, gpus in job.alloc.items():
                    if node in used:
                        used[node].update(gpus)
                        cpus[node] += job.spec.cpus
                        mem[node] += job.spec.mem
        views = []
        for n in nodes:
            held = frozenset(used[n.name])
            room, hot = limits(n, held) if limits is not None else ({}, frozenset())
            made_of = (held, n.cpus - cpus[n.name], n.mem - mem[n.name],
                       n.state == NodeState.UP, tuple(sorted(room.items())), hot, n.warm)
            kept = self.nodes.get(n.name)
            # A kept view also keeps its GPU tuple, which the scheduler's caches key on. (A
            # node's GPU list is replaced when it registers, never changed in place.)
            if kept is None or kept[0] is not n.gpus or kept[1] != made_of:
                have = kept[2].gpus if kept is not None and kept[0] is n.gpus else tuple(n.gpus)
                kept = self.nodes[n.name] = (n.gpus, made_of, NodeView(
                    name=n.name, gpus=have, free=frozenset(g.index for g in have) - made_of[0],
                    cpus_free=made_of[1], mem_free=made_of[2], schedulable=made_of[3],
                    vram_free=room, hot=hot,
                    warm={i: frozenset(keys) for i, keys in n.warm.items() if keys}))
            views.append(kept[2])
        return tuple(views)


def pending_view(job: Job, allowed: frozenset[str] | None = None,
                 eligible_since: float = 0.0, cold_wait_s: float = 0.0) -> PendingJob:
    s = job.spec
    return PendingJob(id=job.id, qos=s.qos or defaults.DEFAULT_QOS, submit_time=job.submit_time,
                      nodes=s.nodes, gpus=s.gpus, gpu_type=s.gpu_type, gpu_mem=s.gpu_mem,
                      cpus=s.cpus, mem=s.mem, time_limit_s=s.time_limit_s or 0, user=s.user,
                      share=s.share, nice=-s.nice, allowed=allowed, cache_key=s.cache_key,
                      cold_wait_until=eligible_since + cold_wait_s
                      if eligible_since and cold_wait_s else 0.0)


def running_view(job: Job, ending: bool) -> RunningJob:
    s = job.spec
    return RunningJob(id=job.id, qos=s.qos or defaults.DEFAULT_QOS,
                      alloc={n: tuple(g) for n, g in job.alloc.items()},
                      start_time=job.start_time or 0.0, time_limit_s=s.time_limit_s or 0,
                      cpus=s.cpus, mem=s.mem, user=s.user,
                      share_mem=(s.gpu_mem or 0) if s.share else 0, ending=ending,
                      # a checkpoint of an earlier run is before this one's start: no matter
                      checkpoint_time=job.checkpoint_time)
