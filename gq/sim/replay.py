"""One replay end to end: a named policy, its knobs, the engine and the metrics."""

from __future__ import annotations

import dataclasses
from typing import Any

from gq.config import Config
from gq.errors import UsageError
from gq.sched import plan
from gq.sched.types import Policy
from gq.sim import affinity
from gq.sim.baselines import BASELINES
from gq.sim.engine import Cluster, PolicyFn, ProgressFn, SimResult, simulate
from gq.sim.metrics import Metrics, summarize
from gq.sim.trace import TraceJob

#: A replay's cold-start model: (seconds of a cold start, per-key overrides, warm keys a GPU
#: keeps).
ColdModel = tuple[float, dict[str, float], int]
#: Variants of gq's policy `gq sim --policy` can compare, as changes to its knobs: the ones
#: docs/SCHEDULING.md reports trying (what each did is there).
VARIANTS: dict[str, dict[str, Any]] = {
    # Before issue 18: aged after 48 h, only the head reserved.
    "gq-48h": {"reserve_age_s": 48 * 3600, "big_reserve_depth": 0},
    "gq-nobig": {"big_reserve_depth": 0},
    # Big jobs aged sooner than small ones.
    "gq-bigage": {"reserve_age_big_s": 48 * 3600},
    # Aged jobs all in their order, each reserving, before smallest-first backfill.
    "gq-agedfcfs": {"aged_in_order": True},
    # gq's mechanics in first-come order: should be EASY (docs/SCHEDULING.md).
    # Model affinity by placement alone (the default before job choice and a default cold
    # wait): warm GPUs first among the free ones, no job choice, no wait.
    "gq-placeonly": {"warm_swap_s": 0, "cold_wait_s": 0},
    # Each half of today's default alone.
    "gq-noswap": {"warm_swap_s": 0},
    "gq-nocoldwait": {"cold_wait_s": 0},
    "gq-fcfs": {"reserve_age_s": 10 ** 9, "weight_ratio": 0, "weight_fairshare": 0,
                "max_age_s": 10 ** 9, "weight_age": 10 ** 9, "backfill_smallest_first": False,
                "big_reserve_depth": 0},
}
#: gq's policy not told the jobs' cache keys (model affinity off; cold starts still counted).
NO_AFFINITY = "gq-noaffinity"
#: Policies `gq sim --policy` knows, in the order they are listed in help and tables.
POLICY_NAMES = ("gq", "easy", "conservative", "fifo", "firstfit", *VARIANTS, NO_AFFINITY)


def policy_fn(name: str) -> PolicyFn:
    """The policy of that name, fresh for one replay (a baseline keeps its queue)."""
    if name in ("gq", NO_AFFINITY) or name in VARIANTS:
        return plan
    if name in BASELINES:
        return BASELINES[name]()
    raise UsageError(f"unknown policy {name!r}: expected one of {', '.join(POLICY_NAMES)}")


def gq_policy(cfg: Config | None = None) -> Policy:
    """gq's knobs as gqd builds them from a config (the built-in defaults unless given)."""
    # Reservations made only to explain (nothing free now) change no decision: skip them.
    return dataclasses.replace((cfg or Config()).policy(), explain=False)


def run(jobs: list[TraceJob], cluster: Cluster, name: str,
        on_progress: ProgressFn | None = None, cfg: Config | None = None,
        cold: ColdModel | None = None) -> SimResult:
    """One replay under the policy `name`, with the knobs of `cfg` (gq's defaults if None);
    with `cold` (a cold start's seconds, per key, warm keys per GPU), cold starts are counted
    and cost their load time (gq/sim/affinity.py)."""
    knobs = dataclasses.replace(gq_policy(cfg), **VARIANTS.get(name, {}))
    loads = affinity.cold_starts(jobs, *cold) if cold is not None else None
    seen = affinity.blind(jobs) if name == NO_AFFINITY or name in BASELINES else jobs
    return simulate(seen, cluster, policy_fn(name), knobs, on_progress, loads)


def replay(jobs: list[TraceJob], cluster: Cluster, name: str,
           on_progress: ProgressFn | None = None, cfg: Config | None = None) -> Metrics:
    return summarize(run(jobs, cluster, name, on_progress, cfg))


#: Columns of `gq sim --schedule-out`: one row per job and policy.
SCHEDULE_COLUMNS = ("policy", "job_id", "submit_s", "gpus", "runtime_s", "limit_s", "start_s",
                    "end_s", "wait_s", "restarts", "nodes")


def write_schedule(path: str, results: dict[str, SimResult]) -> None:
    """Each job's start, end and nodes under each policy, to compare schedules job by job."""
    import csv
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(SCHEDULE_COLUMNS)
        for name, result in results.items():
            for o in result.outcomes:
                j = o.job
                wait = "" if o.start is None else o.start - j.submit_time
                out.writerow([name, j.name, j.submit_time, j.total_gpus, j.runtime_s,
                              j.time_limit_s, _blank(o.start), _blank(o.end), wait, o.restarts,
                              " ".join(o.nodes)])


def _blank(value: float | None) -> object:
    return "" if value is None else value


def parse_policies(values: list[str]) -> list[str]:
    """`--policy` given several times and/or as comma lists, duplicates dropped, order kept."""
    names: list[str] = []
    for value in values:
        for name in (v.strip() for v in value.split(",")):
            if name and name not in names:
                policy_fn(name)  # an unknown name is a usage error before any replay starts
                names.append(name)
    if not names:
        raise UsageError("no --policy given")
    return names
