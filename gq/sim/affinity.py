"""Model affinity in `gq sim`: what a cold start costs, which keys are warm on which GPU, and
a synthetic inference workload to replay (issue 20; docs/SCHEDULING.md "Model affinity").

A job with a cache key (`TraceJob.cache_key`) starts cold unless its key is warm on every GPU
it gets (one of the last `per_gpu` keys that ran there); a cold start adds the key's load time
to the job's run (its GPUs are held while it loads) and is counted with the GPU-seconds spent
loading. The scheduler sees the warm keys in each NodeView, as gqd gives them from its nodes'
heartbeats. Replayed "without affinity", the jobs keep their keys for this count, but the
scheduler is not told them (`blind`), so it places them as jobs without a key.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from gq.errors import UsageError

if TYPE_CHECKING:
    from gq.sim.trace import TraceJob

#: The synthetic workloads `gq sim --synthetic` knows.
SYNTHETIC = ("inference",)


@dataclass
class ColdStarts:
    """The cold-start model of one replay, and what it counted."""

    #: Job id -> its cache key (jobs without one are never cold).
    keys: dict[int, str]
    #: Seconds a cold start of a key takes; `per_key` overrides it for some keys.
    default_s: float = 0.0
    per_key: dict[str, float] = field(default_factory=dict)
    #: How many recent keys a GPU keeps warm (the model in its memory: 1).
    per_gpu: int = 1
    #: (node, GPU) -> its recent keys, least recent first.
    recent: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    cold: int = 0
    warm: int = 0
    load_gpu_s: float = 0.0

    def start(self, job_id: int, alloc: dict[str, tuple[int, ...]]) -> float:
        """A run starts on `alloc`: the seconds it spends loading first (0 when warm)."""
        key = self.keys.get(job_id)
        if key is None:
            return 0.0
        gpus = [(name, g) for name, ids in alloc.items() for g in ids]
        warm = all(key in self.recent.get(gpu, ()) for gpu in gpus)
        for gpu in gpus:
            lru = self.recent.setdefault(gpu, [])
            if key in lru:
                lru.remove(key)
            lru.append(key)
            del lru[:-self.per_gpu or len(lru)]
        if warm:
            self.warm += 1
            return 0.0
        cost = self.per_key.get(key, self.default_s)
        self.cold += 1
        self.load_gpu_s += cost * len(gpus)
        return cost

    def warm_on(self, name: str, gpus: int) -> dict[int, frozenset[str]]:
        """A node's warm keys, as its NodeView carries them."""
        return {g: frozenset(keys) for g in range(gpus)
                if (keys := self.recent.get((name, g)))}


def cold_starts(jobs: Iterable[TraceJob], default_s: float, per_key: dict[str, float],
                per_gpu: int = 1) -> ColdStarts:
    return ColdStarts(keys={j.id: j.cache_key for j in jobs if j.cache_key is not None},
                      default_s=default_s, per_key=dict(per_key), per_gpu=max(1, per_gpu))


def blind(jobs: Iterable[TraceJob]) -> list[TraceJob]:
    """The jobs as a scheduler without affinity sees them: no keys, no cold waits."""
    return [replace(j, cache_key=None, cold_wait_s=None) for j in jobs]


def parse_cold_start(values: Iterable[str]) -> tuple[float, dict[str, float]]:
    """`--cold-start DURATION` (every key) and `--cold-start KEY=DURATION` (one key)."""
    from gq.units import parse_duration
    default, per_key = 0.0, {}
    for value in values:
        key, eq, text = value.rpartition("=")
        try:
            seconds = float(parse_duration(text if eq else value))
        except UsageError as exc:
            raise UsageError(f"bad --cold-start {value!r}: {exc}") from None
        if eq:
            per_key[key] = seconds
        else:
            default = seconds
    return default, per_key


def inference(seed: int = 0, jobs: int = 3000, models: int = 8, gpus: int = 32,
              load: float = 0.7, cold_start_s: float = 30.0, cold_wait_s: float | None = None,
              skew: float = 1.0) -> list[TraceJob]:
    """A synthetic inference workload: `jobs` 1-GPU requests for `models` models (popularity
    by Zipf's law with exponent `skew`), runtimes log-uniform from 5 s to 2 min, Poisson
    arrivals sized so that the work, cold starts aside, fills `load` of `gpus` GPUs; each job's
    limit is twice its runtime plus a cold start (users overestimate), and it may wait
    `cold_wait_s` for a warm GPU (None: the policy's default)."""
    from gq.sim.trace import TraceJob
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) ** skew for i in range(models)]
    names = [f"model-{i}" for i in range(models)]
    runtimes = [math.exp(rng.uniform(math.log(5.0), math.log(120.0))) for _ in range(jobs)]
    mean = sum(runtimes) / len(runtimes)
    gap = mean / (gpus * load)  # mean seconds between arrivals
    out, t = [], 0.0
    for i, runtime in enumerate(runtimes):
        t += rng.expovariate(1.0 / gap)
        key = rng.choices(names, weights)[0]
        out.append(TraceJob(id=i + 1, name=f"req{i + 1}", submit_time=round(t, 3),
                            runtime_s=round(runtime, 3),
                            time_limit_s=math.ceil(2 * runtime + cold_start_s),
                            cache_key=key, cold_wait_s=cold_wait_s, user=key))
    return out


def synthetic(name: str, seed: int, gpus: int, cold_start_s: float, cold_wait_s: float | None,
              load: float = 0.5) -> list[TraceJob]:
    if name not in SYNTHETIC:
        raise UsageError(f"unknown --synthetic {name!r}: expected one of {', '.join(SYNTHETIC)}")
    return inference(seed=seed, gpus=gpus, load=load, cold_start_s=cold_start_s,
                     cold_wait_s=cold_wait_s)
