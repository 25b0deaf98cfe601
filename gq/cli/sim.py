"""`gq sim`: replay a job trace through gq's scheduler and the baselines, side by side."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Optional

import typer

from gq.cli import render

if TYPE_CHECKING:  # the simulator is imported inside the command, so `gq submit` never loads it
    from gq.config import Config
    from gq.sim.engine import Cluster, ProgressFn, SimResult
    from gq.sim.metrics import Metrics
    from gq.sim.replay import ColdModel
    from gq.sim.trace import TraceJob, TraceOptions


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)


def sim(
    trace: Optional[str] = typer.Argument(None, help="trace CSV (../shared/traces format: Philly or Alibaba); none with --synthetic"),
    vc: Optional[str] = typer.Option(None, "--vc", help="Philly virtual cluster to replay"),
    nodes: Optional[int] = typer.Option(None, "-n", "--nodes", help="identical nodes in the simulated cluster (required unless a node inventory is replayed)"),
    nodes_csv: Optional[str] = typer.Option(None, "--nodes-csv", metavar="CSV", help="replay on this node inventory (Alibaba nodes.csv: GPU models, CPUs, memory) with GPU sharing; default: nodes.csv beside an Alibaba trace when --nodes is not given"),
    node_stride: int = typer.Option(1, "--node-stride", help="with a node inventory: keep every N-th node of each GPU model"),
    since: float = typer.Option(0.0, "--since", metavar="SECONDS", help="with a node inventory: replay from this trace second (pods running then start then)"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="GPUs per node"),
    policy: list[str] = typer.Option(["gq"], "--policy", help="gq|easy|conservative|fifo|firstfit (a node inventory: gq|firstfit|bestfit|fgd); repeat or comma-separate to compare"),
    limits: str = typer.Option("exact", "--limits", help="time limit = runtime x k: exact (1), x2, x5, random (U[1,5]); or trace (its limit_s column)"),
    seed: int = typer.Option(0, "--seed", help="seed of random limits and the QOS mix"),
    schedule_out: Optional[str] = typer.Option(None, "--schedule-out", metavar="CSV", help="write each job's start, end and nodes under each policy"),
    qos_mix: Optional[str] = typer.Option(None, "--qos-mix", help="QOS shares, e.g. pro=0.2,free=0.8 (default: all normal)"),
    checkpoint_every: Optional[str] = typer.Option(None, "--checkpoint-every", metavar="DURATION", help="every job checkpoints this often (a preemption loses only the work since)"),
    config_file: Optional[str] = typer.Option(None, "--config", metavar="FILE", help="take gq's knobs ([scheduler], [qos.*]) from this gq.toml"),
    synthetic: Optional[str] = typer.Option(None, "--synthetic", metavar="inference", help="replay a generated workload instead of a trace: inference (8 models, 5 s-2 min 1-GPU jobs)"),
    load: float = typer.Option(0.5, "--load", help="--synthetic: the share of the GPUs its work fills, cold starts aside"),
    cold_start: list[str] = typer.Option([], "--cold-start", metavar="[KEY=]DURATION", help="a cold start's cost, added to the job's run (KEY=: that key's); counts cold starts (default 30s with --synthetic)"),
    cold_wait: Optional[str] = typer.Option(None, "--cold-wait", metavar="DURATION", help="--synthetic: every job waits this long for a warm GPU (as --cold-wait of gq submit; default [scheduler] cold_wait_s)"),
    cache_keys_per_gpu: int = typer.Option(1, "--cache-keys-per-gpu", help="keys a GPU keeps warm in the cold-start model"),
    spike: float = typer.Option(1.0, "--spike", metavar="FACTOR", help="FACTOR times the arrivals in a window (--spike-window): each job there gets FACTOR-1 copies"),
    spike_window: Optional[str] = typer.Option(None, "--spike-window", metavar="START,LENGTH", help="--spike's window, durations from the first submit (default: from 40%% of the span, a tenth of it)"),
    autoscale: bool = typer.Option(False, "--autoscale", help="power saving: the nodes start powered down and are resumed and suspended as gqd's [power] does; compares queue delay and node-hours with always-on"),
    boot_time: str = typer.Option("120s", "--boot-time", metavar="DURATION", help="--autoscale: from a resume until the node takes jobs"),
    suspend_time: list[str] = typer.Option(["60s,10m"], "--suspend-time", metavar="DURATION[,...]", help="--autoscale: idle time before a node is suspended; one replay each"),
    resume_rate: int = typer.Option(0, "--resume-rate", help="--autoscale: nodes resumed a minute at most (0: no limit)"),
    always_on: int = typer.Option(0, "--always-on", metavar="N", help="--autoscale: nodes never powered down"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
) -> int:
    """Replay a trace on a simulated clock and report waits, slowdown, utilization and fairness."""
    from gq.errors import UsageError
    from gq.sim import replay, trace as trace_mod
    from gq.sim.engine import Cluster
    if nodes is None:
        from gq.sim.alibaba import nodes_beside
        found = nodes_csv or (nodes_beside(trace) if trace else None)
        if found is None:
            raise UsageError("--nodes is required (or --nodes-csv for a node inventory)")
        nodes_csv = str(found)
    if nodes_csv:
        if autoscale or spike != 1.0:
            raise UsageError("--autoscale and --spike replay identical nodes (--nodes), not an "
                             "inventory")
        if trace is None:
            raise UsageError("a node inventory replays a trace: name the trace CSV")
        from gq.cli.siminventory import sim_inventory
        return sim_inventory(trace, nodes_csv, node_stride, since, policy, limits, seed,
                             config_file, as_json)
    assert nodes is not None  # (found above, or a node inventory was replayed)
    if nodes < 1 or gpus_per_node < 1:
        raise UsageError("--nodes and --gpus-per-node must be at least 1")
    names = replay.parse_policies(policy)
    from gq.spec import parse_cold_wait
    from gq.units import parse_duration
    opts = trace_mod.TraceOptions(vc=vc, limits=limits, seed=seed, gpus_per_node=gpus_per_node,
                                  qos_mix=trace_mod.parse_qos_mix(qos_mix),
                                  checkpoint_every_s=parse_duration(checkpoint_every)
                                  if checkpoint_every else 0.0)
    from gq.sim import affinity
    cold_s, per_key = affinity.parse_cold_start(cold_start or (["30s"] if synthetic else []))
    if synthetic:
        if trace is not None:
            raise UsageError("give a trace or --synthetic, not both")
        if not 0 < load <= 1:
            raise UsageError(f"--load must be a fraction over 0, at most 1, not {load}")
        trace = f"synthetic {synthetic}, load {load:g}, seed {seed}"
        opts = dataclasses.replace(opts, limits="trace")  # its own: 2 x runtime + cold start
        # No --cold-wait: the policy's default for each keyed job ([scheduler] cold_wait_s).
        wait = None if cold_wait is None else float(parse_cold_wait(cold_wait) or 0)
        jobs = affinity.synthetic(synthetic, seed, nodes * gpus_per_node, cold_s, wait, load)
    elif trace is None:
        raise UsageError("give a trace CSV, or --synthetic")
    else:
        try:
            jobs = trace_mod.load(trace, opts)
        except OSError as exc:
            raise UsageError(f"cannot read trace {trace}: {exc.strerror or exc}") from None
    if spike != 1.0:
        jobs = _spiked(jobs, spike, spike_window, seed)
        trace = f"{trace}, arrivals x{spike:g} in a window"
    cluster = Cluster(nodes=nodes, gpus_per_node=gpus_per_node)
    from gq import config
    cfg = config.load(config_file) if config_file else None
    cold = (cold_s, per_key, cache_keys_per_gpu) if cold_start or synthetic else None
    if autoscale:
        if names != ["gq"] or schedule_out:
            raise UsageError("--autoscale replays gq's policy only, without --schedule-out")
        from gq.cli.simautoscale import parse_durations, sim_autoscale
        from gq.sim.autoscale import PowerModel
        if resume_rate < 0 or not 0 <= always_on <= nodes:
            raise UsageError("--resume-rate must be at least 0, --always-on 0 to --nodes")
        power = PowerModel(boot_s=float(parse_duration(boot_time)), resume_rate=resume_rate,
                           always_on=always_on)
        return sim_autoscale(jobs, cluster, cfg, cold, power,
                             parse_durations(suspend_time, "--suspend-time"), trace, as_json)
    runs = _run_all(jobs, cluster, names, cfg, cold)
    if schedule_out:
        try:
            replay.write_schedule(schedule_out, runs)
        except OSError as exc:
            raise UsageError(f"cannot write {schedule_out}: {exc.strerror or exc}") from None
    from gq.sim.metrics import summarize
    results = {name: summarize(result) for name, result in runs.items()}
    if as_json:
        render.emit_json(_document(trace, opts, cluster, len(jobs), results))
    else:
        print(_describe(trace, opts, cluster, len(jobs)))
        render.table(*_rows(results))
    return 0


def _spiked(jobs: list[TraceJob], factor: float, window: str | None, seed: int
            ) -> list[TraceJob]:
    from gq.errors import UsageError
    from gq.sim.autoscale import spike
    from gq.units import parse_duration
    if factor < 1:
        raise UsageError(f"--spike must be at least 1, not {factor:g}")
    start = length = None
    if window:
        first, comma, second = window.partition(",")
        if not comma:
            raise UsageError(f"--spike-window expects START,LENGTH, not {window!r}")
        start, length = float(parse_duration(first)), float(parse_duration(second))
    return spike(jobs, factor, start, length, seed)


def _run_all(jobs: list[TraceJob], cluster: Cluster, names: list[str],
             cfg: Config | None, cold: ColdModel | None = None) -> dict[str, SimResult]:
    from gq.sim.replay import run
    results = {}
    with _progress(len(jobs)) as start_bar:
        for name in names:
            results[name] = run(jobs, cluster, name, start_bar(name), cfg, cold)
    return results


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[str], ProgressFn | None]]:
    """A bar per policy on stderr, only when a person is watching it."""
    if not sys.stderr.isatty():
        yield lambda name: None
        return
    from rich.console import Console
    from rich.progress import Progress
    with Progress(console=Console(stderr=True), transient=True) as bar:
        def start_bar(name: str) -> ProgressFn:
            task = bar.add_task(f"replaying ({name})", total=total)
            return lambda done, _total: bar.update(task, completed=done)
        yield start_bar


def _describe(path: str, opts: TraceOptions, cluster: Cluster, jobs: int) -> str:
    from gq.sim.trace import DEFAULT_QOS, describe_limits
    where = f" vc {opts.vc}" if opts.vc else ""
    mix = ",".join(f"{n}={s:g}" for n, s in opts.qos_mix) or f"all {DEFAULT_QOS}"
    ckpt = f"; checkpoints every {opts.checkpoint_every_s:g} s" if opts.checkpoint_every_s else ""
    return (f"# {path}{where}: {jobs} jobs on {cluster.nodes} x {cluster.gpus_per_node} GPUs; "
            f"{describe_limits(opts)}; QOS {mix}{ckpt}; times in hours")


def _h(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def _rows(results: dict[str, Metrics]) -> tuple[list[str], list[list[Any]]]:
    """One row per metric, one column per policy, so policies read side by side."""
    ms = list(results.values())
    rows: list[list[Any]] = [
        ["jobs", *(m.jobs for m in ms)],
        ["makespan", *(_h(m.makespan_s) for m in ms)],
        ["GPU utilization", *(f"{m.utilization:.1%}" for m in ms)],
    ]
    for label, pick in (("wait", lambda m: m.wait), ("wait 1-GPU", lambda m: m.wait_1gpu),
                        ("wait >=8-GPU", lambda m: m.wait_big)):
        for stat in ("avg", "p50", "p95", "p99", "max"):
            rows.append([f"{label} {stat}", *(_h(getattr(pick(m), stat)) for m in ms)])
    qos = sorted({q for m in ms for q in m.wait_by_qos}) if any(
        len(m.wait_by_qos) > 1 for m in ms) else []
    for q in qos:
        for stat in ("avg", "p99", "max"):
            rows.append([f"wait {q} {stat}",
                         *(_h(getattr(m.wait_by_qos[q], stat)) if q in m.wait_by_qos else "-"
                           for m in ms)])
    from gq.cli.accounting import gpu_hours
    rows += [
        ["avg JCT", *(_h(m.avg_jct_s) for m in ms)],
        ["avg bounded slowdown", *(f"{m.avg_bounded_slowdown:.2f}" for m in ms)],
        ["Jain fairness", *(f"{m.jain:.3f} ({m.jain_groups} {m.jain_over})" for m in ms)],
        ["preemptions", *(m.preemptions for m in ms)],
        ["lost GPU-hours", *(f"{gpu_hours(m.lost_gpu_h)} ({m.lost_share:.1%})" for m in ms)],
    ]
    if any(m.cold_starts or m.warm_starts for m in ms):
        rows += [["cold starts", *(m.cold_starts for m in ms)],
                 ["warm starts", *(m.warm_starts for m in ms)],
                 ["GPU-hours loading", *(f"{m.load_gpu_h:.2f}" for m in ms)]]
    if any(m.unfinished or m.rejected for m in ms):
        rows += [["unfinished", *(m.unfinished for m in ms)], ["rejected", *(m.rejected for m in ms)]]
    rows.append(["sim wall (s)", *(f"{m.wall_s:.1f}" for m in ms)])
    return ["METRIC", *(n.upper() for n in results)], rows


def _document(path: str, opts: TraceOptions, cluster: Cluster, jobs: int,
              results: dict[str, Metrics]) -> dict[str, Any]:
    from gq.sim.trace import describe_limits
    return {"schema_version": render.JSON_SCHEMA_VERSION, "trace": path, "vc": opts.vc,
            "jobs": jobs, "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
            "limits": opts.limits, "limits_model": describe_limits(opts), "seed": opts.seed,
            "qos_mix": dict(opts.qos_mix), "checkpoint_every_s": opts.checkpoint_every_s,
            "results": [{"policy": name, **m.to_json()} for name, m in results.items()]}
