"""`gq sim TRACE --nodes-csv NODES`: the Alibaba trace on its own node inventory, with GPU
sharing, GPU models, CPUs and memory (gq/sim/inventory.py), policies side by side."""

from __future__ import annotations

from typing import Any

from gq.cli import render


def sim_inventory(trace: str, nodes_csv: str, stride: int, since: float, policy: list[str],
                  limits: str, seed: int, config_file: str | None, as_json: bool) -> int:
    from gq.errors import UsageError
    from gq.sim import alibaba, inventory
    from gq.sim.heteropolicy import HETERO_POLICIES
    names: list[str] = []
    for value in policy:
        for name in (v.strip() for v in value.split(",")):
            if name and name not in HETERO_POLICIES:
                raise UsageError(f"unknown policy {name!r} for a node inventory replay: "
                                 f"expected one of {', '.join(HETERO_POLICIES)}")
            if name and name not in names:
                names.append(name)
    opts = alibaba.AlibabaOptions(limits=limits, seed=seed, node_stride=stride, since_s=since)
    try:
        nodes = alibaba.read_nodes(nodes_csv, stride)
        pods = alibaba.read_pods(trace, opts)
    except OSError as exc:
        raise UsageError(f"cannot read {exc.filename}: {exc.strerror or exc}") from None
    from gq import config
    cfg = config.load(config_file) if config_file else None
    results = inventory.replay(nodes, pods, names, cfg)
    what = alibaba.describe(nodes, pods, opts)
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "trace": trace,
                          "nodes_csv": nodes_csv, "node_stride": stride, "since_s": since,
                          "limits": limits, "seed": seed, "replayed": what,
                          "results": [m.to_json() for m in results.values()]})
    else:
        print(f"# {trace} on {nodes_csv}: {what}; times in hours")
        render.table(*_rows(results))
    bad = [m.policy for m in results.values()
           if m.vram_over or m.excluded_model or m.cpu_over or m.mem_over]
    if bad:
        raise UsageError(f"placement invariants broken under {', '.join(bad)}")
    return 0


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _rows(results: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    ms = list(results.values())
    rows: list[list[Any]] = [["pods started", *(m.started for m in ms)]]
    for label, pick in (("wait GPU pods", lambda m: m.wait_gpu),
                        ("wait sharing pods", lambda m: m.wait_sharing)):
        for stat in ("avg", "p99", "max"):
            rows.append([f"{label} {stat}", *(_h(getattr(pick(m), stat)) for m in ms)])
    rows += [
        ["GPU allocated", *(f"{m.gpu_allocated:.1%}" for m in ms)],
        ["stranded GPU-hours", *(f"{m.stranded_gpu_h:.0f} ({m.stranded_share:.2%})" for m in ms)],
        ["frag (ATC'23) GPUs", *(f"{m.paper_frag_gpus:.2f}" for m in ms)],
        ["frag rate (ATC'23)", *(f"{m.paper_frag_rate:.1%}" for m in ms)],
        ["pods sharing a GPU", *(m.co_located for m in ms)],
        ["VRAM oversubscribed", *(m.vram_over for m in ms)],
        ["on excluded model", *(m.excluded_model for m in ms)],
        ["CPU/mem over", *(m.cpu_over + m.mem_over for m in ms)],
    ]
    if any(m.unfinished or m.rejected for m in ms):
        rows += [["unfinished", *(m.unfinished for m in ms)],
                 ["rejected", *(m.rejected for m in ms)]]
    rows.append(["sim wall (s)", *(f"{m.wall_s:.1f}" for m in ms)])
    return ["METRIC", *(n.upper() for n in results)], rows
