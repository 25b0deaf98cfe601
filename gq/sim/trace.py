"""Job traces (Philly, Alibaba) as simulator jobs: sizes, time limits and QOS modelled on load."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gq.errors import UsageError

#: How a job's time limit comes from its runtime: limit = ceil(runtime * k), or the trace's own
#: `limit_s` column (`trace`), so that other simulators can replay exactly the same inputs.
LIMIT_MODELS = ("exact", "x2", "x5", "random", "trace")
#: Range of k under `random`: users overestimate, by up to 5x (the scheduler issue).
RANDOM_K = (1.0, 5.0)
#: QOS of every job when no mix is given (gq's default QOS).
DEFAULT_QOS = "normal"
#: Columns a trace must have, whatever its source.
REQUIRED_COLUMNS = ("job_id", "submit_time_s", "gpus", "runtime_s")


@dataclass(frozen=True)
class TraceJob:
    """One job as the simulator replays it; `runtime_s` is known to the engine, never to policies."""

    id: int
    #: The trace's own job id, kept for reports.
    name: str
    submit_time: float
    runtime_s: float
    time_limit_s: int
    #: Nodes x GPUs per node; a job over one node's GPUs takes whole nodes (gang).
    nodes: int = 1
    gpus: int = 1
    qos: str = DEFAULT_QOS
    user: str = ""
    #: It checkpoints every this many seconds of its run (0: never), so a preemption loses
    #: only the work since its last checkpoint and its next run resumes from there.
    checkpoint_s: float = 0.0
    #: What it loads (model affinity, gq/sim/affinity.py), and how long it may wait for a GPU
    #: where that is warm (from its submission; None: the policy's default for a job with a key).
    cache_key: str | None = None
    cold_wait_s: float | None = None

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus


@dataclass(frozen=True)
class TraceOptions:
    """How a raw trace becomes simulator jobs."""

    vc: str | None = None
    limits: str = "exact"
    seed: int = 0
    #: QOS name -> share of jobs; empty means every job gets DEFAULT_QOS.
    qos_mix: tuple[tuple[str, float], ...] = ()
    gpus_per_node: int = 8
    #: Every job checkpoints every this many seconds of its run (0: none does).
    checkpoint_every_s: float = 0.0


def shared_traces(start: Path | None = None) -> Path:
    """The team's trace directory, `shared/traces` beside the checkout or a level above it (a
    worktree under wt/): for tests and scripts that replay the development traces."""
    here = (start or Path(__file__)).resolve()
    for parent in here.parents:
        if (parent / "shared" / "traces").is_dir():
            return parent / "shared" / "traces"
    return here.parents[2] / "shared" / "traces"


def parse_qos_mix(text: str | None) -> tuple[tuple[str, float], ...]:
    """`pro=0.2,free=0.8` -> (("pro", 0.2), ("free", 0.8)), shares normalised to sum to 1."""
    if not text:
        return ()
    pairs: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, share = part.strip().partition("=")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not sep or not name or not value >= 0:
            raise UsageError(f"bad --qos-mix part {part!r}: expected NAME=SHARE, e.g. pro=0.2,free=0.8")
        pairs.append((name.strip(), value))
    total = sum(v for _, v in pairs)
    if total <= 0:
        raise UsageError(f"bad --qos-mix {text!r}: the shares sum to zero")
    return tuple((n, v / total) for n, v in pairs)


def limit_factor(model: str, rng: random.Random) -> float:
    """The k of `limit = runtime * k` for one job."""
    if model == "exact":
        return 1.0
    if model in ("x2", "x5"):
        return float(model[1:])
    if model == "random":
        return rng.uniform(*RANDOM_K)
    raise UsageError(f"bad time-limit model {model!r}: expected one of {', '.join(LIMIT_MODELS)}")


def time_limit(runtime_s: float, k: float) -> int:
    # Rounded up so that a job never hits its limit under `exact`; at least 1 s because a
    # limit of 0 means "no limit" to the scheduler, which could then never plan around it.
    return max(1, math.ceil(runtime_s * k))


def pick_qos(mix: tuple[tuple[str, float], ...], rng: random.Random) -> str:
    if not mix:
        return DEFAULT_QOS
    x = rng.random()
    for name, share in mix:
        x -= share
        if x < 0:
            return name
    return mix[-1][0]  # float rounding left x a hair above zero


def shape(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs per node): more GPUs than one node has means whole nodes, rounded up."""
    if gpus <= gpus_per_node:
        return 1, gpus
    return math.ceil(gpus / gpus_per_node), gpus_per_node


def read_rows(path: str | Path, vc: str | None) -> Iterator[dict[str, str]]:
    """Rows of a trace CSV, restricted to one Philly virtual cluster when `vc` is given."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        columns = reader.fieldnames or []
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise UsageError(f"{path}: not a job trace: no column {', '.join(missing)}")
        if vc is not None and "vc" not in columns:
            raise UsageError(f"{path}: --vc given but the trace has no vc column")
        for row in reader:
            if vc is None or row["vc"] == vc:
                yield row


def _number(row: dict[str, str], column: str) -> float | None:
    text = (row.get(column) or "").strip()
    return float(text) if text else None


def parse_rows(rows: Iterable[dict[str, str]], opts: TraceOptions) -> list[TraceJob]:
    """Simulator jobs in submit order. CPU-only rows and pods that never ran are skipped."""
    # k is drawn per job in submit order from random.Random(seed), as the reference simulator
    # (../shared/refsim) draws it, so "seed 1" means the same limits to both (up to gq's
    # rounding up to whole seconds). The QOS mix has a stream of its own, so adding one does
    # not change the limits.
    limit_rng = random.Random(opts.seed)
    qos_rng = random.Random(f"{opts.seed}:qos")
    raw: list[tuple[float, int, dict[str, str], float, int]] = []
    for line, row in enumerate(rows):
        submit, gpus, runtime = (_number(row, c) for c in ("submit_time_s", "gpus", "runtime_s"))
        if submit is None or runtime is None or not gpus:
            continue
        # Alibaba's fractional GPUs (gpu_milli < 1000) still hold a whole GPU here: no sharing
        # on identical nodes (its node inventory with sharing: gq/sim/alibaba.py, hetero.py).
        raw.append((submit, line, row, runtime, max(1, math.ceil(gpus))))
    raw.sort(key=lambda r: (r[0], r[1]))
    jobs = []
    for index, (submit, _, row, runtime, gpus) in enumerate(raw):
        nodes, per_node = shape(gpus, opts.gpus_per_node)
        jobs.append(TraceJob(
            id=index + 1, name=row["job_id"], submit_time=submit, runtime_s=runtime,
            time_limit_s=_limit(row, runtime, opts.limits, limit_rng),
            nodes=nodes, gpus=per_node, qos=pick_qos(opts.qos_mix, qos_rng),
            user=(row.get("user") or "").strip(), checkpoint_s=opts.checkpoint_every_s))
    return jobs


def _limit(row: dict[str, str], runtime: float, model: str, rng: random.Random) -> int:
    if model != "trace":
        return time_limit(runtime, limit_factor(model, rng))
    given = _number(row, "limit_s")
    if given is None:
        raise UsageError(f"job {row['job_id']}: --limits trace needs a limit_s column "
                         "with a limit for every job")
    # Never below the runtime (as the reference simulator reads it): jobs run their runtime.
    return time_limit(max(given, runtime), 1.0)


def load(path: str | Path, opts: TraceOptions) -> list[TraceJob]:
    if opts.limits not in LIMIT_MODELS:
        raise UsageError(f"bad --limits {opts.limits!r}: expected one of {', '.join(LIMIT_MODELS)}")
    jobs = parse_rows(read_rows(path, opts.vc), opts)
    if not jobs:
        where = f" in VC {opts.vc}" if opts.vc else ""
        raise UsageError(f"{path}: no GPU jobs{where}")
    return jobs


def describe_limits(opts: TraceOptions) -> str:
    """How limits were modelled, to print with every result (the traces carry none)."""
    if opts.limits == "exact":
        return "limit = runtime"
    if opts.limits in ("x2", "x5"):
        return f"limit = runtime x {opts.limits[1:]}"
    if opts.limits == "trace":
        return "limit = the trace's limit_s (at least the runtime)"
    return f"limit = runtime x U[{RANDOM_K[0]:g},{RANDOM_K[1]:g}] (seed {opts.seed})"
