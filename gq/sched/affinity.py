"""Model affinity: a job with a `--cache-key` goes to GPUs where that key is warm (the GPUs'
recent jobs loaded it, or a node's cache directory holds it), so it need not load its model
again; with `--cold-wait` it waits a while for such a GPU rather than start cold.

The rule costs no reservation: it only chooses among the GPUs placement found free for the job's
whole limit (`Profile.candidates`), so a warm GPU is never taken from a job planned to start on
it. Within a node, warm GPUs go first; between nodes of one pool rank, the node with fewer cold
GPUs for the job comes before best fit. A job without a key is placed exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gq.sched.types import NodeView, PendingJob, Plan, Policy, Start

#: `reason` of a job that waits for a GPU where its --cache-key is warm (its --cold-wait).
WAITING_WARM = "WaitingForWarmGPU"


def cold_wait_s(key: str | None, own: float | None, policy: Policy) -> float:
    """How long a job waits for a warm GPU: its own --cold-wait if it gave one (0 too), else,
    with a key, the policy's default (`[scheduler] cold_wait_s`); none without a key."""
    if key is None:
        return 0.0
    return float(policy.cold_wait_s if own is None else own)


def warm_only(job: PendingJob, now: float) -> bool:
    """Whether the job takes only warm GPUs now (its --cold-wait has not run out)."""
    return job.cache_key is not None and now < job.cold_wait_until


def is_warm(view: NodeView, gpu: int, key: str | None) -> bool:
    return key is not None and key in view.warm.get(gpu, ())


def prefer_warm(view: NodeView, gpus: list[int], chosen: list[int], job: PendingJob,
                now: float) -> tuple[list[int], int] | None:
    """The GPUs a job with a cache key takes on `view` among `gpus` (free for its limit; the
    plain rule chose `chosen`), warm ones first, and how many of them are cold; None when it
    takes only warm GPUs now and too few are."""
    key = job.cache_key
    warm = [g for g in gpus if is_warm(view, g, key)]
    if len(warm) >= job.gpus:
        # All warm: keep the plain rule's choice when it is all warm, else the lowest warm.
        if all(g in warm for g in chosen):
            return chosen, 0
        return sorted(warm[:job.gpus]), 0
    if warm_only(job, now):
        return None
    cold = [g for g in chosen if g not in warm][:job.gpus - len(warm)]
    return sorted(warm + cold), job.gpus - len(warm)


def swap_warm(result: Plan, pending: Iterable[PendingJob], nodes: Iterable[NodeView],
              now: float, within_s: float) -> None:
    """Job choice by warmth (`Policy.warm_swap_s`): a pass's cold start of a keyed job that has
    waited less than `within_s` gives its GPUs to a queued job that did not start, whose key is
    warm on all of them and which asks for no more (same GPUs, type, VRAM; no more CPUs, memory
    or time limit), oldest first. The warm job's run fits inside the cold one's booking, so no
    reservation moves; the cold job waits for the next GPU (it cannot be passed over once it
    has waited `within_s`)."""
    views = {n.name: n for n in nodes}
    # (Not a job a preemption was planned for: it would lose the GPUs freed for it.)
    started = {s.job_id for s in result.starts} | {p.for_job for p in result.preemptions}
    jobs = {j.id: j for j in pending if j.cache_key is not None}
    spare: dict[str, list[PendingJob]] = {}
    for j in sorted((j for j in jobs.values() if j.id not in started and j.nodes == 1
                     and not j.share), key=lambda j: (j.submit_time, j.id)):
        assert j.cache_key is not None
        spare.setdefault(j.cache_key, []).append(j)
    if not spare:
        return
    for i, start in enumerate(result.starts):
        cold = jobs.get(start.job_id)
        if cold is None or cold.cache_key is None or cold.nodes != 1 or cold.share \
                or now - cold.submit_time >= within_s:
            continue
        ((name, gpus),) = start.alloc.items()
        view = views[name]
        if all(is_warm(view, g, cold.cache_key) for g in gpus):
            continue
        # The oldest fitting job of any key warm on all these GPUs (in a set's order, the
        # choice would change from run to run).
        found = min((j for key in set.intersection(*(set(view.warm.get(g, ())) for g in gpus))
                     for j in spare.get(key, ()) if _fits_in(j, cold, name)),
                    key=lambda j: (j.submit_time, j.id), default=None)
        if found is not None:
            assert found.cache_key is not None
            spare[found.cache_key].remove(found)
            result.starts[i] = Start(job_id=found.id, alloc=start.alloc)
            result.reasons.pop(found.id, None)
            # Starting now, it needs its later reservation no more (the pass's bookings keep
            # it: others were planned around it, which is only cautious).
            result.reservations.pop(found.id, None)
            result.reasons[cold.id] = WARM_FIRST


#: `reason` of a keyed job whose cold start a pass gave to a job warm there (`swap_warm`).
WARM_FIRST = "Priority"


def _fits_in(job: PendingJob, slot: PendingJob, node: str) -> bool:
    return job.gpus == slot.gpus and job.gpu_type == slot.gpu_type \
        and job.gpu_mem == slot.gpu_mem and job.cpus <= slot.cpus and job.mem <= slot.mem \
        and 0 < job.time_limit_s <= (slot.time_limit_s or math.inf) \
        and (job.allowed is None or node in job.allowed) and job.qos == slot.qos
