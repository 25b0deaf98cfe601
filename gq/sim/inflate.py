"""The ATC'23 paper's own experiment, for a like-for-like comparison with its published figures:
pods drawn at random from the trace arrive one after another and never leave; each is placed
by the policy or, if no node holds it, fails (dropped, as the paper's simulator counts a failed
pod); GPU allocation is read as the arrived GPU demand grows past the cluster's capacity.

    python -m gq.sim.inflate [--node-stride N] [--seed S] [--policy firstfit,bestfit,fgd]

(Weng et al., "Beware of Fragmentation", USENIX ATC'23: FGD "reduces unallocated GPUs by up to
49%" against packing schedulers on the full inventory, docs/SCHEDULING.md.)
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
from collections.abc import Sequence

from gq.sim import alibaba
from gq.sim.alibaba import HNode, Pod
from gq.sim.fragment import Workload
from gq.sim.hetero import HeteroSim, audit
from gq.sim.heteropolicy import make

#: Arrived GPU demand, as shares of the cluster's GPUs, at which allocation is read.
MARKS = (0.8, 0.9, 1.0, 1.1, 1.2, 1.3)


def inflate(nodes: Sequence[HNode], pods: Sequence[Pod], name: str, seed: int = 0,
            marks: Sequence[float] = MARKS) -> dict[float, float]:
    """Arrived demand mark -> GPUs allocated (as a share of all GPUs) once it had arrived."""
    rng = random.Random(seed)
    workload = Workload(pods)
    from gq.sim.replay import gq_policy
    policy = make(name, workload, gq_policy())
    sim = HeteroSim(nodes, [], policy)
    capacity = sum(n.gpus for n in nodes)
    arrived, out, i = 0.0, {}, 0
    todo = sorted(marks)
    while todo:
        i += 1
        pod = dataclasses.replace(rng.choice(pods), id=i, submit_time=float(i),
                                  runtime_s=float("inf"), time_limit_s=0)
        sim.offer(pod, float(i))
        arrived += pod.gpu_demand
        while todo and arrived >= todo[0] * capacity:
            free = sum(s.free_milli for s in sim.nodes) / alibaba.MILLI
            out[todo.pop(0)] = (capacity - free) / capacity
    found = audit(nodes, sim.records)
    assert found.total == 0, found.details[:3]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from gq.sim.trace import shared_traces
    base = shared_traces() / "alibaba"
    parser.add_argument("--jobs", default=str(base / "jobs.csv"))
    parser.add_argument("--nodes", default=str(base / "nodes.csv"))
    parser.add_argument("--node-stride", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", default="firstfit,bestfit,fgd")
    parser.add_argument("--gpu-pods-only", action="store_true",
                        help="draw only GPU pods (CPU-only pods take CPUs GPU pods need)")
    args = parser.parse_args(argv)
    nodes = alibaba.read_nodes(args.nodes, args.node_stride)
    pods = alibaba.read_pods(args.jobs, alibaba.AlibabaOptions(since_s=9964972))
    if args.gpu_pods_only:
        pods = [p for p in pods if p.gpus]
    print(f"# {len(nodes)} nodes, {sum(n.gpus for n in nodes)} GPUs; pods drawn from "
          f"{len(pods)} (seed {args.seed}); GPU allocation at arrived demand (x capacity)")
    names = [n for n in args.policy.split(",") if n]
    print("policy    " + "".join(f"{m:>8.0%}" for m in MARKS) + "   wall")
    for name in names:
        began = time.perf_counter()
        got = inflate(nodes, pods, name, args.seed)
        print(f"{name:<10}" + "".join(f"{got[m]:>8.1%}" for m in MARKS)
              + f"  {time.perf_counter() - began:5.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
