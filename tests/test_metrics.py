"""gqd's Prometheus endpoint, scraped from a live cluster (issue 6, Done when 5)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pytest

from gq.cluster import metrics_url
from gq.errors import ConfigError
from gq.head.metrics import parse_addr
from tests.conftest import LiveCluster, wait_for


DASHBOARD = Path(__file__).resolve().parent.parent / "contrib" / "grafana-gq.json"


def scrape(url: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, its labels) -> value, from one scrape."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def scrape_until(url: str, check, what: str) -> dict:  # noqa: ANN001
    """The first scrape for which `check(samples)` holds, polled until the deadline."""
    def one() -> dict | None:
        samples = scrape(url)
        return samples if check(samples) else None
    return wait_for(one, what)


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_queue_depth_gpus_and_pass_time_show_on_a_live_gqd(cluster: LiveCluster) -> None:
    url = metrics_url(cluster.config())
    assert url is not None and urlparse(url).hostname == "127.0.0.1", url  # loopback only
    assert "Prometheus metrics at " + url in cluster.gq("up").stderr  # `gq up` tells where
    first = scrape_until(url, lambda s: value(s, "gq_node_gpus", node="node2"),
                         "both nodes in the metrics")
    assert value(first, "gq_jobs", state="PENDING", qos="normal") == 0
    assert value(first, "gq_node_gpus", node="node1") == 8
    submitted = value(first, "gq_jobs_submitted_total") or 0.0

    held = cluster.submit("--hold", "--wrap", "true")
    scrape_until(url, lambda s: value(s, "gq_jobs", state="PENDING", qos="normal") == 1,
                 "the queue depth to count the held job")
    runner = cluster.submit("-g", "2", "-q", "pro", "--wrap", "sleep 30")
    cluster.wait_state(runner, "RUNNING")
    after = scrape_until(url, lambda s: value(s, "gq_running_gpus") == 2,
                         "two running GPUs in the metrics")
    assert value(after, "gq_jobs", state="RUNNING", qos="pro") == 1
    assert value(after, "gq_jobs_submitted_total") == submitted + 2
    assert value(after, "gq_pending_jobs", reason="JobHeldUser") == 1
    node = next(iter(cluster.show(runner)["gpu_ids"]))
    assert value(after, "gq_node_gpus_allocated", node=node) == 2
    assert value(after, "gq_node_state", node=node, state="UP") == 1
    assert value(after, "gq_schedule_pass_seconds_count") >= 1
    # Every turn of the loop is timed, its sleep not counted: idle turns sleep a whole
    # second (LOOP_TICK_S), and their lag is far below it.
    turns = value(after, "gq_loop_lag_seconds_count")
    assert turns >= 1 and value(after, "gq_loop_lag_seconds_bucket", le="1.0") == turns
    # Telemetry from the nodes' heartbeats (fake GPUs: idle at 30 C).
    gpu = {"node": "node1", "gpu": "0", "type": cluster.nodes()[0]["gpus"][0]["type"]}
    assert value(after, "gq_gpu_temperature_celsius", **gpu) == 30
    assert value(after, "gq_gpu_utilization_ratio", **gpu) == 0
    assert value(after, "gq_gpu_memory_bytes", **gpu) > 0
    # The Grafana dashboard asks only for what gqd serves.
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    asked = {m for e in exprs for m in re.findall(r"\bgq_[a-z_]+", e)}
    served = {name for name, _ in after}
    assert asked and asked <= served, asked - served
    cluster.gq("cancel", str(held), str(runner), check=True)


def test_metrics_addresses() -> None:
    assert parse_addr("") is None
    assert parse_addr("127.0.0.1:6819") == ("127.0.0.1", 6819)
    assert parse_addr(":9000") == ("0.0.0.0", 9000)
    assert parse_addr("[::1]:0") == ("::1", 0)
    for bad in ("localhost", "host:port", "1.2.3.4:70000"):
        with pytest.raises(ConfigError, match="metrics_addr"):
            parse_addr(bad)


def test_sample_counts_the_queue_and_gpu_holders() -> None:
    from gq.head.index import JobIndex
    from gq.head.metrics import sample
    from gq.model import Gpu, Job, JobSpec, JobState, Node, NodeState
    jobs = [Job(id=1, spec=JobSpec(script="", qos="pro"), state=JobState.RUNNING,
                alloc={"n1": [0, 1]}, holds_alloc=True),
            Job(id=2, spec=JobSpec(script=""), reason="Priority"),
            Job(id=3, spec=JobSpec(script="", qos="gone"), reason="Priority"),
            Job(id=4, spec=JobSpec(script=""), state=JobState.COMPLETED)]
    node = Node(name="n1", gpus=[Gpu(index=i, type="h100", memory=80 << 30) for i in range(4)],
                state=NodeState.UP, telemetry={0: {"util": 90, "temp": "hot"}})
    index = JobIndex()
    for job in jobs:
        index.add(job)
    s = sample(index, [node], ["normal", "pro"])
    assert s.jobs == {("PENDING", "normal"): 1, ("PENDING", "pro"): 0, ("RUNNING", "normal"): 0,
                      ("RUNNING", "pro"): 1, ("PENDING", "gone"): 1}
    assert s.reasons == {"Priority": 2} and s.nodes == {"n1": "UP"}
    assert [g.job for g in s.gpus] == [1, 1, None, None]
    assert (s.gpus[0].util, s.gpus[0].temp) == (90.0, None)  # a non-number is left out
