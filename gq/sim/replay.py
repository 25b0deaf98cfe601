"""One replay end to end: a named policy, its knobs, the engine and the metrics."""

from __future__ import annotations

import dataclasses

from gq.config import Config
from gq.errors import UsageError
from gq.sched import plan
from gq.sched.types import Policy
from gq.sim.baselines import BASELINES
from gq.sim.engine import Cluster, PolicyFn, ProgressFn, simulate
from gq.sim.metrics import Metrics, summarize
from gq.sim.trace import TraceJob

#: Policies `gq sim --policy` knows, in the order they are listed in help and tables.
POLICY_NAMES = ("gq", "easy", "fifo", "firstfit")


def policy_fn(name: str) -> PolicyFn:
    if name == "gq":
        return plan
    if name in BASELINES:
        return BASELINES[name]
    raise UsageError(f"unknown policy {name!r}: expected one of {', '.join(POLICY_NAMES)}")


def gq_policy(cfg: Config | None = None) -> Policy:
    """gq's knobs as gqd builds them from a config (the built-in defaults unless given)."""
    # Reservations made only to explain (nothing free now) change no decision: skip them.
    return dataclasses.replace((cfg or Config()).policy(), explain=False)


def replay(jobs: list[TraceJob], cluster: Cluster, name: str,
           on_progress: ProgressFn | None = None) -> Metrics:
    return summarize(simulate(jobs, cluster, policy_fn(name), gq_policy(), on_progress))


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
