"""gqd's Prometheus endpoint: a sample the event loop publishes, served from another thread.

The loop owns every job and node; the HTTP thread never touches them. Every PUBLISH_S at most the
loop builds an immutable `Sample` and swaps it in (one reference assignment), and a scrape
reads whichever sample is current. Counters and the loop-lag and pass-time histograms are
prometheus_client's own, which are thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gq.errors import ConfigError
from gq.model import Job, JobState, Node, NodeState

if TYPE_CHECKING:
    from gq.head.index import JobIndex
    from gq.sched.types import PendingJob

log = logging.getLogger("gq.head")

#: Least time between two snapshots the loop builds, in seconds (a scrape sees data this old).
PUBLISH_S = 1.0
#: Most of the loop's time sampling may take: a huge queue is sampled less often than PUBLISH_S.
MAX_LOAD = 0.02
#: File in gqd's state directory holding the metrics endpoint's `HOST:PORT` while gqd runs.
ADDR_FILE = "metrics.addr"
#: Buckets of the loop-lag and scheduling-pass histograms, in seconds: fine around 100 ms, the
#: most lag a loop may show before clients and nodes feel it.
PASS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0)
#: Job states that make up the queue (the others leave it at once).
QUEUE_STATES = (JobState.PENDING.value, JobState.RUNNING.value)


@dataclass(frozen=True)
class GpuSample:
    node: str
    index: int
    type: str
    memory: int
    #: The job holding it, or None.
    job: int | None
    #: Latest telemetry from the node's heartbeat; None where it sent none.
    util: float | None = None
    mem_used: float | None = None
    temp: float | None = None


@dataclass(frozen=True)
class Sample:
    """What a scrape shows: built by the loop, never changed afterwards."""

    #: (state, qos) -> jobs in the queue.
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Pending reason -> jobs.
    reasons: dict[str, int] = field(default_factory=dict)
    #: Node name -> state.
    nodes: dict[str, str] = field(default_factory=dict)
    gpus: tuple[GpuSample, ...] = ()
    #: (GPU type, VRAM class) -> GPUs the pending jobs ask for (`pending_demand`).
    pending_gpus: dict[tuple[str, str], int] = field(default_factory=dict)


def vram_class(gpu_mem: int | None) -> str:
    """A job's --gpu-mem as a label: whole GiB rounded up (`80G`), or `any`."""
    return "any" if not gpu_mem else f"{-(-gpu_mem // 2**30)}G"


def pending_demand(views: Iterable[PendingJob], jobs: Mapping[int, Job]
                   ) -> dict[tuple[str, str], int]:
    """GPUs asked for by the jobs of the last pass that are still pending (those the gate and
    the running limits let through: what more nodes would start), by (GPU type, VRAM class):
    the figure an autoscaler scales on."""
    out: dict[tuple[str, str], int] = {}
    for v in views:
        job = jobs.get(v.id)
        if job is not None and job.state == JobState.PENDING and v.gpus:
            key = ((v.gpu_type or "any").lower(), vram_class(v.gpu_mem))
            out[key] = out.get(key, 0) + v.gpus * max(v.nodes, 1)
    return out


def sample(queue: JobIndex, nodes: Iterable[Node], qos_names: Iterable[str],
           pending_gpus: dict[tuple[str, str], int] | None = None) -> Sample:
    """The loop's side: what the head holds now, from its index (the queue's counts are kept
    there as jobs change: no scan of what may be 100k jobs)."""
    depth = {(state, q): 0 for state in QUEUE_STATES for q in qos_names}
    depth.update(queue.depth())
    reasons = queue.reasons()
    holders = {(n, g): job.id for job in queue.placed() if job.holds_alloc
               for n, gs in job.alloc.items() for g in gs}
    gpus = []
    states = {}
    for node in nodes:
        states[node.name] = node.state.value
        for g in node.gpus:
            t = node.telemetry.get(g.index, {})
            gpus.append(GpuSample(node.name, g.index, g.type, g.memory,
                                  holders.get((node.name, g.index)), _num(t.get("util")),
                                  _num(t.get("mem_used")), _num(t.get("temp"))))
    return Sample(jobs=depth, reasons=dict(reasons), nodes=states, gpus=tuple(gpus),
                  pending_gpus=dict(pending_gpus or {}))


def _num(value: Any) -> float | None:
    """A telemetry value a node sent, if it is a number (nodes are trusted little)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def parse_addr(text: str, source: str = "[head] metrics_addr") -> tuple[str, int] | None:
    """`HOST:PORT`, `[V6]:PORT` or `:PORT` (all interfaces) -> (host, port); "" -> None (off)."""
    if not text:
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{source}: expected HOST:PORT (or \"\" for no endpoint), not {text!r}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "0.0.0.0", int(port)


class Metrics:
    """The registry, its HTTP server thread, and the sample the loop last published."""

    def __init__(self, host: str, port: int) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram
        from prometheus_client.exposition import start_http_server
        from prometheus_client.process_collector import ProcessCollector
        self._sample = Sample()
        self.registry = CollectorRegistry(auto_describe=True)
        self.submitted = Counter("gq_jobs_submitted", "Jobs accepted by gqd (each array task "
                                 "counts)", registry=self.registry)
        self.pass_seconds = Histogram("gq_schedule_pass_seconds", "Duration of gqd's "
                                      "scheduling passes", buckets=PASS_BUCKETS,
                                      registry=self.registry)
        self.pass_failures = Counter("gq_schedule_pass_failures", "Scheduling passes that "
                                     "raised (a bug): each taken back and tried again after a "
                                     "backoff (gqd's log has the traceback)",
                                     registry=self.registry)
        self.loop_lag = Histogram("gq_loop_lag_seconds", "How long each turn of gqd's event "
                                  "loop kept it from reading new messages: the turn's work, "
                                  "plus how late it woke from a timed sleep",
                                  buckets=PASS_BUCKETS, registry=self.registry)
        ProcessCollector(registry=self.registry)
        self.registry.register(self)
        self._server, self._thread = start_http_server(port, host, registry=self.registry)
        bound_host, bound_port = self._server.server_address[:2]
        if isinstance(bound_host, bytes):  # (socketserver's type allows it; AF_INET gives str)
            bound_host = bound_host.decode()
        self.address = f"[{bound_host}]:{bound_port}" if ":" in bound_host \
            else f"{bound_host}:{bound_port}"
        log.info("serving metrics on http://%s/metrics", self.address)

    def loop_turn(self, asked: float, timeout_s: float, woke: float, done: float) -> None:
        """One turn of the loop (time.monotonic() values): it asked to sleep at most `timeout_s`
        at `asked`, woke at `woke` and was back at its poll at `done`. A message that came in
        as the turn began waited its whole work; lateness past the timeout is time the process
        did not get (a busy host, other threads holding the GIL)."""
        self.loop_lag.observe(max(0.0, woke - asked - timeout_s) + (done - woke))

    def publish(self, new: Sample) -> None:
        self._sample = new  # one reference swap: a scrape sees the old sample or the new one

    def describe(self) -> Iterator[Any]:
        return iter(())  # the families depend on the sample; collect() names them at scrape

    def collect(self) -> Iterator[Any]:
        """Called on the HTTP thread: reads only the published sample."""
        from prometheus_client.core import GaugeMetricFamily as Gauge
        s = self._sample
        jobs = Gauge("gq_jobs", "Jobs in the queue by state and QOS", labels=["state", "qos"])
        for (state, qos), n in sorted(s.jobs.items()):
            jobs.add_metric([state, qos], n)
        reasons = Gauge("gq_pending_jobs", "Pending jobs by reason", labels=["reason"])
        for reason, n in sorted(s.reasons.items()):
            reasons.add_metric([reason], n)
        running = Gauge("gq_running_gpus", "GPUs held by running jobs")
        running.add_metric([], sum(g.job is not None for g in s.gpus))
        demand = Gauge("gq_pending_gpus", "GPUs asked for by pending jobs that could start "
                       "but for resources, by GPU type and VRAM class (--gpu-mem, whole GiB "
                       "rounded up; any: none asked)", labels=["gpu_type", "vram_class"])
        for (gtype, vram), n in sorted(s.pending_gpus.items()):
            demand.add_metric([gtype, vram], n)
        yield from (jobs, reasons, running, demand, *self._node_families(s))

    def _node_families(self, s: Sample) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily as Gauge
        states = Gauge("gq_nodes", "Nodes by state", labels=["state"])
        for state in NodeState:
            states.add_metric([state.value], sum(v == state.value for v in s.nodes.values()))
        node_state = Gauge("gq_node_state", "1 for the state each node is in",
                           labels=["node", "state"])
        total = Gauge("gq_node_gpus", "GPUs of each node", labels=["node"])
        alloc = Gauge("gq_node_gpus_allocated", "GPUs of each node held by jobs",
                      labels=["node"])
        for name, now in sorted(s.nodes.items()):
            node_state.add_metric([name, now], 1)
            total.add_metric([name], sum(g.node == name for g in s.gpus))
            alloc.add_metric([name], sum(g.node == name and g.job is not None for g in s.gpus))
        yield from (states, node_state, total, alloc, *_gpu_families(s.gpus))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _gpu_families(gpus: tuple[GpuSample, ...]) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily as Gauge
    labels = ["node", "gpu", "type"]
    fams = {
        "allocated": Gauge("gq_gpu_allocated", "1 when a job holds the GPU", labels=labels),
        "util": Gauge("gq_gpu_utilization_ratio", "GPU utilization (0-1) from the node's "
                      "telemetry", labels=labels),
        "mem_used": Gauge("gq_gpu_memory_used_bytes", "VRAM in use, from the node's telemetry",
                          labels=labels),
        "memory": Gauge("gq_gpu_memory_bytes", "VRAM of the GPU", labels=labels),
        "temp": Gauge("gq_gpu_temperature_celsius", "GPU temperature from the node's telemetry",
                      labels=labels),
    }
    for g in gpus:
        key = [g.node, str(g.index), g.type]
        fams["allocated"].add_metric(key, int(g.job is not None))
        fams["memory"].add_metric(key, g.memory)
        for name, value in (("util", None if g.util is None else g.util / 100),
                            ("mem_used", g.mem_used), ("temp", g.temp)):
            if value is not None:
                fams[name].add_metric(key, value)
    yield from fams.values()
