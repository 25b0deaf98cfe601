"""The Alibaba trace on its node inventory (issue 18, Done when 4): GPU models, CPUs and memory
per node, fractional pods sharing a GPU, gpu_spec honoured, fragmentation measured, and every
replay's placements audited: 0 VRAM oversubscription, 0 pods on a GPU model they exclude."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gq.sim import alibaba, inventory
from gq.sim.alibaba import MILLI, AlibabaOptions, HNode, Pod
from gq.sim.engine import SimInvariantError
from gq.sim.fragment import Workload
from gq.sim.hetero import HeteroSim, Record, audit
from gq.sim.heteropolicy import HETERO_POLICIES, FirstFit
from gq.sim.trace import shared_traces

NODE_HEADER = ["sn", "cpu_milli", "memory_mib", "gpu", "model"]
POD_HEADER = ["job_id", "submit_time_s", "gpus", "runtime_s", "user", "group",
              "requested_walltime_s", "observed_wait_s", "status", "gpu_milli", "cpu_milli",
              "memory_mib", "gpu_spec", "start_time_s", "end_time_s", "censored_at_trace_end"]


def write(tmp_path: Path, nodes: list[list[object]], pods: list[tuple[object, ...]]) -> Path:
    """A tiny trace in the real files' format: nodes.csv beside jobs.csv. A pod is
    (submit, gpus, runtime, gpu_milli, cpu_milli, memory_mib, gpu_spec)."""
    with (tmp_path / "nodes.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(NODE_HEADER)
        out.writerows(nodes)
    with (tmp_path / "jobs.csv").open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(POD_HEADER)
        for i, (submit, gpus, runtime, milli, cpu, mem, spec) in enumerate(pods):
            out.writerow([f"p{i}", submit, gpus, runtime, "", "LS", "", 0, "Running", milli,
                          cpu, mem, spec, submit, submit + runtime, 0])
    return tmp_path / "jobs.csv"


NODES = [["t4", 32000, 65536, 2, "T4"], ["v100", 32000, 65536, 4, "V100M32"],
         ["g2", 96000, 393216, 8, "G2"]]


def mixed_pods() -> list[tuple[object, ...]]:
    pods: list[tuple[object, ...]] = []
    for i in range(30):
        pods.append((i * 10, 1, 500 + 37 * i, (250, 460, 500, 810)[i % 4], 2000, 4096, ""))
    for i in range(10):  # only on V100M32 or T4
        pods.append((5 + i * 20, 1, 300, 1000, 4000, 8192, "V100M32|T4"))
    for i in range(6):
        pods.append((7 + i * 40, 4, 200, 1000, 8000, 16384, ""))
    for i in range(8):  # CPU-only pods take CPUs and memory beside the GPU pods
        pods.append((3 + i * 30, 0, 400, 0, 16000, 32768, ""))
    pods.append((1, 1, 100, 300, 1000, 1024, "A10"))  # no A10 here: refused at submit
    return pods


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write(tmp_path, NODES, mixed_pods())


def load(trace: Path, stride: int = 1) -> tuple[list[HNode], list[Pod]]:
    opts = AlibabaOptions(node_stride=stride)
    return alibaba.read_nodes(trace.with_name("nodes.csv"), stride), alibaba.read_pods(trace, opts)


@pytest.mark.parametrize("name", HETERO_POLICIES)
def test_every_policy_keeps_the_invariants_shares_gpus_and_honours_gpu_spec(trace, name):
    nodes, pods = load(trace)
    result, found = inventory.run(nodes, pods, name)
    assert found.total == 0, found.details
    assert [p.name for p in result.rejected] == ["p54"] and not result.unfinished
    assert len(result.records) == len(pods) - 1
    models = {r.pod.name: nodes[r.node].model for r in result.records}
    spec = [r.pod.name for r in result.records if r.pod.models]
    assert len(spec) == 10 and all(models[p] in ("V100M32", "T4") for p in spec)
    # Fractional pods shared GPUs: some ran beside another pod on one GPU.
    assert inventory.co_located(result) > 0
    assert all(r.pod.gpus == len(r.gpus) for r in result.records)
    # The 4-GPU pods can only go to the 4- and 8-GPU nodes.
    assert all(models[r.pod.name] in ("V100M32", "G2") for r in result.records if r.pod.gpus == 4)


def test_a_restricted_pod_waits_rather_than_land_on_an_excluded_model(tmp_path):
    # The T4 node is free, but the pod allows only V100M32, which is busy for 100 s.
    path = write(tmp_path, [["t4", 32000, 65536, 2, "T4"], ["v", 32000, 65536, 1, "V100M32"]],
                 [(0, 1, 100, 1000, 1000, 1024, "V100M32"), (1, 1, 10, 1000, 1000, 1024, "V100M32")])
    nodes, pods = load(path)
    for name in HETERO_POLICIES:
        result, found = inventory.run(nodes, pods, name)
        second = next(r for r in result.records if r.pod.name == "p1")
        assert (nodes[second.node].model, second.start) == ("V100M32", 100), name
        assert found.total == 0


def test_fractions_pack_one_gpu_up_to_its_whole_and_no_further(tmp_path):
    # Three 0.4-GPU pods on one 1-GPU node: two share it, the third waits for one to end.
    path = write(tmp_path, [["a", 64000, 65536, 1, "A10"]],
                 [(0, 1, 100, 400, 1000, 1024, ""), (0, 1, 100, 400, 1000, 1024, ""),
                  (0, 1, 100, 400, 1000, 1024, "")])
    nodes, pods = load(path)
    for name in HETERO_POLICIES:
        result, found = inventory.run(nodes, pods, name)
        assert sorted(r.start for r in result.records) == [0, 0, 100], name
        assert found.total == 0


def test_cpus_and_memory_are_honoured(tmp_path):
    # Two GPUs free but CPUs for one pod only: the second waits although a GPU is idle, and
    # that idle GPU counts as stranded while it waits.
    path = write(tmp_path, [["n", 10000, 65536, 2, "T4"]],
                 [(0, 1, 100, 1000, 8000, 1024, ""), (0, 1, 50, 1000, 8000, 1024, "")])
    nodes, pods = load(path)
    result, found = inventory.run(nodes, pods, "firstfit")
    assert sorted(r.start for r in result.records) == [0, 100] and found.total == 0
    assert result.stranded_gpu_s == pytest.approx(100.0)  # one idle GPU for 100 s


def test_the_engine_refuses_oversubscription_and_excluded_models():
    nodes = [HNode("n", "T4", 1, 8000, 8192)]
    pods = [Pod(1, "a", 0, 10, 10, 1, 600, 1000, 1024),
            Pod(2, "b", 0, 10, 10, 1, 600, 1000, 1024),
            Pod(3, "c", 0, 10, 10, 1, 100, 1000, 1024, models=frozenset({"V100M32"}))]

    class Greedy:
        name = "bad"

        def __call__(self, sim: HeteroSim, now: float) -> None:
            for pod in list(sim.pending.values()):
                sim.start(pod.id, 0, (0,))

    with pytest.raises(SimInvariantError, match="over-allocates n GPU 0"):
        HeteroSim(nodes, pods[:2], Greedy()).run()
    nodes2 = nodes + [HNode("v", "V100M32", 1, 8000, 8192)]
    with pytest.raises(SimInvariantError, match="excludes T4"):
        HeteroSim(nodes2, pods[2:], Greedy()).run()


def test_the_audit_finds_what_a_broken_replay_would_have_done():
    nodes = [HNode("n", "T4", 1, 8000, 8192)]
    a = Pod(1, "a", 0, 10, 10, 1, 600, 1000, 1024)
    b = Pod(2, "b", 0, 10, 10, 1, 600, 1000, 1024, models=frozenset({"A10"}))
    found = audit(nodes, [Record(a, 0, (0,), 0, 10), Record(b, 0, (0,), 5, 15)])
    assert (found.vram_over, found.excluded_model) == (1, 1)
    # Back to back (one ends as the other starts) is no overlap.
    assert audit(nodes, [Record(a, 0, (0,), 0, 10), Record(a, 0, (0,), 10, 20)]).total == 0


def test_fragmentation_as_the_paper_defines_it():
    # One task type: 0.5 GPU. A 2-GPU node with GPUs 0.7 and 0.2 used: GPU 1 (0.8 free) can
    # take it, GPU 0 (0.3 free) cannot: 0.3 GPU is fragmented. Without CPUs, all 1.1 is.
    pods = [Pod(1, "a", 0, 10, 10, 1, 500, 1000, 1024)]
    work = Workload(pods)
    assert work.of("T4", 8000, 8192, [700, 200]) == pytest.approx(0.3)
    assert work.of("T4", 0, 8192, [700, 200]) == pytest.approx(1.1)
    # FGD puts the next half GPU where it adds the least fragmentation: beside the 0.2.
    from gq.sim.heteropolicy import Fgd
    sim = HeteroSim([HNode("n", "T4", 2, 8000, 8192)], pods, Fgd(work), frag=work)
    sim.nodes[0].used[:] = [700, 200]
    sim.pending[1] = pods[0]
    assert Fgd(work).choose(sim, pods[0]) == (0, (1,))
    assert FirstFit.choose(sim, pods[0]) == (0, (1,))  # the only GPU that holds it, too


def test_gq_sim_finds_nodes_csv_beside_the_trace(trace, capsys):
    from gq.cli.main import main
    assert main(["sim", str(trace), "--policy", "gq,fgd", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes_csv"].endswith("nodes.csv")
    assert [r["policy"] for r in doc["results"]] == ["gq", "fgd"]
    for r in doc["results"]:
        assert (r["vram_over"], r["excluded_model"], r["rejected"]) == (0, 0, 1)
    assert main(["sim", str(trace), "--policy", "bestfit"]) == 0
    out = capsys.readouterr().out
    assert "3 nodes" in out and "VRAM oversubscribed" in out
    assert main(["sim", str(trace), "--policy", "easy"]) == 2  # not an inventory policy


def test_node_stride_keeps_every_model():
    nodes_csv = shared_traces() / "alibaba" / "nodes.csv"
    if not nodes_csv.is_file():
        pytest.skip("no shared traces")
    every = alibaba.read_nodes(nodes_csv)
    sample = alibaba.read_nodes(nodes_csv, 200)
    assert len(every) == 1213 and {n.model for n in sample} == {n.model for n in every}
    assert sum(n.gpus for n in every) == 6212


def test_a_slice_of_the_real_trace_keeps_the_invariants():
    """The first 400 pods of the bulk window on the stride-200 sample of the real inventory."""
    base = shared_traces() / "alibaba"
    if not (base / "jobs.csv").is_file():
        pytest.skip("no shared traces")
    opts = AlibabaOptions(node_stride=200, since_s=9964972)
    nodes = alibaba.read_nodes(base / "nodes.csv", 200)
    pods = alibaba.read_pods(base / "jobs.csv", opts)[:400]
    assert any(p.shares for p in pods) and any(p.gpus > 1 for p in pods)
    for name in HETERO_POLICIES:
        result, found = inventory.run(nodes, pods, name)
        assert found.total == 0, (name, found.details[:3])
        assert inventory.co_located(result) > 0
        assert len(result.records) == len(pods) - len(result.rejected)
        # Every GPU's thousandths stayed within the whole, checked again from the records.
        assert all(r.pod.milli <= MILLI for r in result.records)


def test_since_starts_the_replay_there(tmp_path):
    path = write(tmp_path, NODES, [(0, 1, 50, 1000, 1000, 1024, ""),     # ended before: out
                                   (0, 1, 500, 300, 1000, 1024, ""),    # running: from 100
                                   (150, 1, 10, 1000, 1000, 1024, "")])
    with (tmp_path / "jobs.csv").open("a", newline="") as fh:  # a pod that never ran
        csv.writer(fh).writerow(["p3", 5, 1, "", "", "BE", "", "", "Pending", 1000, 1000,
                                 1024, "", "", "", 0])
    pods = alibaba.read_pods(path, AlibabaOptions(since_s=100))
    assert [(p.name, p.submit_time, p.runtime_s, p.shares) for p in pods] == [
        ("p1", 100, 400, True), ("p2", 150, 10, False)]
    assert alibaba.nodes_beside(path) == tmp_path / "nodes.csv"


def test_the_papers_experiment_fills_the_cluster_without_breaking_the_invariants(trace):
    """gq/sim/inflate.py: pods drawn from the trace arrive and never leave; allocation grows
    with arrived demand and stays within the cluster (inflate audits every placement)."""
    from gq.sim.inflate import inflate
    nodes, pods = load(trace)
    pods = [p for p in pods if p.name != "p54"]  # the A10 pod fits nowhere here
    for name in HETERO_POLICIES:
        got = inflate(nodes, pods, name, seed=1, marks=(0.5, 1.0, 1.5))
        assert 0.45 <= got[0.5] <= got[1.0] <= got[1.5] <= 1.0, (name, got)
        assert got[1.5] > 0.7, (name, got)


def test_identical_nodes_still_need_nodes(tmp_path, capsys):
    from gq.cli.main import main
    path = tmp_path / "philly.csv"
    path.write_text("job_id,submit_time_s,gpus,runtime_s\nj1,0,1,10\n")
    assert main(["sim", str(path)]) == 2
    assert "--nodes is required" in capsys.readouterr().err
    assert main(["sim", str(path), "--nodes", "1", "--policy", "fifo"]) == 0
