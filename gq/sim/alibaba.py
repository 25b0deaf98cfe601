"""The Alibaba GPU trace (cluster-trace-gpu-v2023, "openb") on its own node inventory: nodes of
mixed GPU models with their CPUs and memory (`nodes.csv`), pods asking for a fraction of one
GPU (`gpu_milli` < 1000), whole GPUs, CPUs and memory, and the GPU models they allow
(`gpu_spec`). Replayed by gq/sim/hetero.py (issue 18, Done when 4; docs/SCHEDULING.md).
"""

from __future__ import annotations

import csv
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gq.errors import UsageError
from gq.sim.trace import LIMIT_MODELS, TraceOptions, limit_factor, time_limit

GIB = 1024 ** 3
#: VRAM per GPU model, bytes. The disclosed models' memory is their product's (T4 16 GB,
#: P100 16 GB, V100 16/32 GB, A10 24 GB). G1-G3 are undisclosed in the trace: 32 GiB is our
#: assumption, not Alibaba's figure. A fractional pod takes that fraction of whichever GPU it
#: lands on (the trace's, and the paper's, definition of gpu_milli), so the figures only enter
#: the VRAM invariant check and the report, never a placement.
VRAM = {"T4": 16 * GIB, "P100": 16 * GIB, "V100M16": 16 * GIB, "V100M32": 32 * GIB,
        "A10": 24 * GIB, "G1": 32 * GIB, "G2": 32 * GIB, "G3": 32 * GIB}
#: A GPU's capacity in the trace's unit (gpu_milli): a whole GPU.
MILLI = 1000
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("job_id", "submit_time_s", "gpus", "runtime_s", "gpu_milli", "cpu_milli",
               "memory_mib", "gpu_spec")


@dataclass(frozen=True)
class HNode:
    """One node of the inventory."""

    name: str
    model: str
    gpus: int
    cpu_milli: int
    mem_mib: int

    @property
    def vram(self) -> int:
        return VRAM.get(self.model, VRAM["G1"])


@dataclass(frozen=True)
class Pod:
    """One pod as the heterogeneous engine replays it (`runtime_s` is hidden from policies)."""

    id: int
    name: str
    submit_time: float
    runtime_s: float
    time_limit_s: int
    #: GPUs it takes (0: a CPU-only pod), all on one node.
    gpus: int
    #: Per GPU, in thousandths of a GPU: < 1000 only for a 1-GPU pod that shares its GPU.
    milli: int
    cpu_milli: int
    mem_mib: int
    #: GPU models it may run on (gpu_spec); None: any.
    models: frozenset[str] | None = None
    #: The trace's QoS class (LS, BE, ...), kept for reports; policies see gq's `normal`.
    group: str = ""

    @property
    def shares(self) -> bool:
        return self.gpus == 1 and self.milli < MILLI

    @property
    def gpu_demand(self) -> float:
        """GPUs it asks for, a fraction for a sharing pod."""
        return self.gpus * self.milli / MILLI

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models


@dataclass(frozen=True)
class AlibabaOptions:
    limits: str = "exact"
    seed: int = 0
    #: Keep every this many nodes of each GPU model (1: the whole inventory), at least one each.
    node_stride: int = 1
    #: Replay from this trace second: pods that ended before are left out, pods submitted
    #: before (and still running) are submitted then with what is left of their run.
    since_s: float = 0.0
    #: Replay CPU-only pods too (they take CPUs and memory of the GPU nodes).
    cpu_pods: bool = True


def _int(row: dict[str, str], column: str, default: int = 0) -> int:
    text = (row.get(column) or "").strip()
    return int(float(text)) if text else default


def _check_columns(path: str | Path, columns: list[str], wanted: tuple[str, ...]) -> None:
    missing = [c for c in wanted if c not in columns]
    if missing:
        raise UsageError(f"{path}: no column {', '.join(missing)}")


def read_nodes(path: str | Path, stride: int = 1) -> list[HNode]:
    """The GPU nodes of a `nodes.csv`, every `stride`-th of each model in file order (so a
    sample keeps the models' proportions and every model), named as in the file."""
    if stride < 1:
        raise UsageError("--node-stride must be at least 1")
    seen: defaultdict[str, int] = defaultdict(int)
    nodes = []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        _check_columns(path, list(reader.fieldnames or []), NODE_COLUMNS)
        for row in reader:
            model = row["model"].strip()
            if seen[model] % stride == 0:
                nodes.append(HNode(name=row["sn"].strip(), model=model, gpus=_int(row, "gpu"),
                                   cpu_milli=_int(row, "cpu_milli"),
                                   mem_mib=_int(row, "memory_mib")))
            seen[model] += 1
    if not nodes:
        raise UsageError(f"{path}: no nodes")
    return nodes


def parse_spec(text: str) -> frozenset[str] | None:
    """gpu_spec: GPU models separated by `|` (blank: any model)."""
    models = frozenset(m.strip() for m in text.split("|") if m.strip())
    return models or None


def read_pods(path: str | Path, opts: AlibabaOptions) -> list[Pod]:
    """Pods that ran, in submit order; pods that never ran (no runtime) are left out, as are
    CPU-only pods unless `opts.cpu_pods`."""
    if opts.limits not in LIMIT_MODELS or opts.limits == "trace":
        raise UsageError(f"bad --limits {opts.limits!r} for a node inventory replay: expected "
                         "exact, x2, x5 or random")
    raw = []
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        _check_columns(path, list(reader.fieldnames or []), POD_COLUMNS)
        for line, row in enumerate(reader):
            runtime_text = (row.get("runtime_s") or "").strip()
            if not runtime_text:
                continue
            submit, runtime = float(row["submit_time_s"]), float(runtime_text)
            gpus = _int(row, "gpus")
            if gpus == 0 and not opts.cpu_pods:
                continue
            if submit + runtime <= opts.since_s:
                continue
            if submit < opts.since_s:
                runtime -= opts.since_s - submit
                submit = opts.since_s
            raw.append((submit, line, row, runtime, gpus))
    raw.sort(key=lambda r: (r[0], r[1]))
    # Limits drawn in submit order from one stream, as gq/sim/trace.py draws them.
    rng = random.Random(opts.seed)
    pods = []
    for index, (submit, _, row, runtime, gpus) in enumerate(raw):
        milli = min(MILLI, _int(row, "gpu_milli", MILLI)) if gpus else 0
        if gpus > 1 or (gpus and milli <= 0):
            milli = MILLI  # a multi-GPU pod takes whole GPUs
        pods.append(Pod(id=index + 1, name=row["job_id"], submit_time=submit,
                        runtime_s=runtime,
                        time_limit_s=time_limit(runtime, limit_factor(opts.limits, rng)),
                        gpus=gpus, milli=milli, cpu_milli=_int(row, "cpu_milli"),
                        mem_mib=_int(row, "memory_mib"),
                        models=parse_spec(row.get("gpu_spec") or ""),
                        group=(row.get("group") or "").strip()))
    if not pods:
        raise UsageError(f"{path}: no pods to replay")
    return pods


def nodes_beside(trace: str | Path) -> Path | None:
    """The `nodes.csv` beside an Alibaba trace (one with a gpu_milli column), if any."""
    path = Path(trace)
    beside = path.with_name("nodes.csv")
    if not beside.is_file():
        return None
    try:
        with open(path, newline="") as fh:
            header = next(csv.reader(fh), [])
    except OSError:
        return None
    return beside if "gpu_milli" in header else None


def describe(nodes: list[HNode], pods: list[Pod], opts: AlibabaOptions) -> str:
    """What was replayed, in one line: the node sample, the window, the pods and the limits."""
    by_model: defaultdict[str, int] = defaultdict(int)
    for n in nodes:
        by_model[n.model] += n.gpus
    models = ", ".join(f"{m} {g}" for m, g in sorted(by_model.items()))
    gpu_pods = sum(1 for p in pods if p.gpus)
    sharing = sum(1 for p in pods if p.shares)
    limits = TraceOptions(limits=opts.limits, seed=opts.seed)
    from gq.sim.trace import describe_limits
    return (f"{len(nodes)} nodes (every {opts.node_stride} of each model), "
            f"{sum(n.gpus for n in nodes)} GPUs ({models}); {len(pods)} pods "
            f"({gpu_pods} GPU, {sharing} sharing a GPU) from t={opts.since_s:g} s; "
            f"{describe_limits(limits)}")

