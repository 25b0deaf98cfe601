"""Which running jobs to stop so a higher-tier job can start: those that lose the least work."""

from __future__ import annotations

from gq.sched.types import NodeView, PendingJob, Policy, RunningJob, Snapshot


def _matches(node: NodeView, job: PendingJob, gpu_index: int) -> bool:
    gpu = next((g for g in node.gpus if g.index == gpu_index), None)
    return gpu is not None and (job.gpu_type is None or gpu.type == job.gpu_type.lower()) \
        and (job.gpu_mem is None or gpu.memory >= job.gpu_mem)


def choose_victims(state: Snapshot, job: PendingJob, now: float, policy: Policy,
                   victim_qos: set[str], taken: set[int]) -> list[int]:
    """The cheapest set of preemptible running jobs whose GPUs (with the free ones) fit `job`.

    Cost is GPU-seconds run (lost unless checkpointed); ties go to the most recently started.
    Only as many victims as needed, on as few nodes as the job needs (one per rank).
    """
    by_node: dict[str, list[RunningJob]] = {}
    for run in state.running:
        if run.id in taken or run.ending or run.qos not in victim_qos \
                or now - run.start_time < policy.preempt_exempt_s:
            continue
        for name in run.alloc:
            by_node.setdefault(name, []).append(run)
    options: list[tuple[float, str, list[int]]] = []
    for node in state.nodes:
        if not node.schedulable:
            continue
        free = sum(1 for g in node.free if _matches(node, job, g))
        chosen: list[int] = []
        cost = 0.0
        for run in sorted(by_node.get(node.name, []), key=lambda r: (_lost(r, now), -r.start_time)):
            if free >= job.gpus:
                break
            gained = sum(1 for g in run.alloc[node.name] if _matches(node, job, g))
            if gained:
                chosen.append(run.id)
                cost += _lost(run, now)
                free += gained
        if free >= job.gpus and chosen:
            options.append((cost, node.name, chosen))
        elif free >= job.gpus:
            options.append((0.0, node.name, []))
    if len(options) < job.nodes:
        return []
    options.sort()
    victims = [v for _, _, chosen in options[:job.nodes] for v in chosen]
    # A victim spanning nodes is counted once; a gang victim frees all of its nodes anyway.
    return list(dict.fromkeys(victims))


def _lost(run: RunningJob, now: float) -> float:
    return sum(len(g) for g in run.alloc.values()) * max(0.0, now - run.start_time)
