"""Model affinity: a job with a `--cache-key` goes to GPUs where that key is warm (the GPUs'
recent jobs loaded it, or a node's cache directory holds it), so it need not load its model
again; with `--cold-wait` it waits a while for such a GPU rather than start cold.

The rule costs no reservation: it only chooses among the GPUs placement found free for the job's
whole limit (`Profile.candidates`), so a warm GPU is never taken from a job planned to start on
it. Within a node, warm GPUs go first; between nodes of one pool rank, the node with fewer cold
GPUs for the job comes before best fit. A job without a key is placed exactly as before.
"""

from __future__ import annotations

from gq.sched.types import NodeView, PendingJob

#: `reason` of a job that waits for a GPU where its --cache-key is warm (its --cold-wait).
WAITING_WARM = "WaitingForWarmGPU"


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
