"""`gq sim --autoscale`: the always-on cluster against power saving at each suspend time, queue
delay beside node-hours powered (gq/sim/autoscale.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gq.cli import render

if TYPE_CHECKING:
    from gq.config import Config
    from gq.sim.autoscale import PowerModel
    from gq.sim.engine import Cluster
    from gq.sim.replay import ColdModel
    from gq.sim.trace import TraceJob


def parse_durations(values: list[str], what: str) -> list[float]:
    """`--suspend-time 60s,10m` (repeatable): seconds, in the order given."""
    from gq.errors import UsageError
    from gq.units import parse_duration
    out = []
    for value in values:
        for text in filter(None, (v.strip() for v in value.split(","))):
            seconds = float(parse_duration(text))
            if seconds <= 0:
                raise UsageError(f"{what} must be over 0, not {text!r}")
            out.append(seconds)
    return out


def sim_autoscale(jobs: list[TraceJob], cluster: Cluster, cfg: Config | None,
                  cold: ColdModel | None, power: PowerModel, suspend_times: list[float],
                  describe: str, as_json: bool) -> int:
    import dataclasses

    from gq.sched import plan
    from gq.sim import affinity
    from gq.sim.autoscale import PoweredSimulator, always_on_node_s
    from gq.sim.engine import Simulator
    from gq.sim.metrics import summarize
    from gq.sim.replay import gq_policy
    knobs = gq_policy(cfg)

    def loads() -> affinity.ColdStarts | None:
        return affinity.cold_starts(jobs, *cold) if cold is not None else None

    base = Simulator(jobs, cluster, plan, knobs, loads=loads()).run()
    runs: list[dict[str, Any]] = [{"run": "always-on", "suspend_time_s": None,
                                   "node_hours": always_on_node_s(base) / 3600, "resumes": 0,
                                   "suspends": 0, "metrics": summarize(base)}]
    for suspend in suspend_times:
        model = dataclasses.replace(power, suspend_time_s=suspend)
        sim = PoweredSimulator(jobs, cluster, plan, knobs, model, loads=loads())
        result = sim.run()
        runs.append({"run": f"autoscale suspend {suspend:g}s", "suspend_time_s": suspend,
                     "node_hours": sim.counts.node_s / 3600, "resumes": sim.counts.resumes,
                     "suspends": sim.counts.suspends, "metrics": summarize(result)})
    always = runs[0]["node_hours"]
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "workload": describe,
                          "nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node,
                          "boot_s": power.boot_s, "resume_rate": power.resume_rate,
                          "always_on": power.always_on, "jobs": len(jobs),
                          "runs": [{**{k: v for k, v in r.items() if k != "metrics"},
                                    "wait": dataclasses.asdict(r["metrics"].wait),
                                    "unfinished": r["metrics"].unfinished} for r in runs]})
        return 0
    print(f"# {describe}: {len(jobs)} jobs on {cluster.nodes} x {cluster.gpus_per_node} GPUs; "
          f"boot {power.boot_s:g}s, resume rate {power.resume_rate or 'unlimited'}/min, "
          f"{power.always_on} always on; waits in seconds")
    render.table(["RUN", "WAIT P50", "WAIT P99", "WAIT AVG", "NODE-HOURS", "VS ALWAYS-ON",
                  "RESUMES", "UNFINISHED"],
                 [[r["run"], f"{r['metrics'].wait.p50:.0f}", f"{r['metrics'].wait.p99:.0f}",
                   f"{r['metrics'].wait.avg:.0f}", f"{r['node_hours']:.2f}",
                   f"{r['node_hours'] / always - 1:+.0%}" if always else "-", r["resumes"],
                   r["metrics"].unfinished] for r in runs])
    return 0
