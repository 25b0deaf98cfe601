"""sinfo: partitions and nodes in Slurm's formats: the default (a line per partition and node
state), `-N` (a line per node and partition), `-s` (summary), `-o FORMAT`, `-h`, filtered by
`-p`, `-t`, `-n`. A node's state is Slurm's word for what its GPUs and CPUs hold: idle, mix,
alloc, drng/drain, down*."""

from __future__ import annotations

import argparse
from typing import Any

from gq import protocol
from gq.hostlist import compress, expand
from gq.slurm import common, fmt
from gq.slurm.scontrol import node_state, used_cpus

DEFAULT = "%#P %.5a %.10l %.6D %.6t %N"
NODES = "%#N %.6D %.#P %6t"
SUMMARY = "%#P %.5a %.10l %.16F %N"
#: Slurm's compact state words (sinfo %t) for the long ones (%T).
COMPACT = {"idle": "idle", "mixed": "mix", "allocated": "alloc", "draining": "drng",
           "drained": "drain", "down*": "down*", "idle~": "idle~", "idle#": "idle#",
           "idle%": "idle%"}

#: A row: (partition, its nodes in this row, the cluster's view) - see `_rows`.
Row = tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]


def _limit(part: dict[str, Any]) -> str:
    return common.limit(part["max_time_s"]).replace("UNLIMITED", "infinite")


def _counts(row: Row, of: str) -> str:
    """Allocated/idle/other/total nodes (F) or CPUs (C)."""
    _, nodes, seen = row
    a = i = o = 0
    for node in nodes:
        state = seen["states"][node["name"]]
        weight = node["cpus"] if of == "C" else 1
        used = seen["cpus"].get(node["name"], 0) if of == "C" else None
        if state in ("down*", "drained", "draining"):
            o += weight
        elif of == "C":
            a, i = a + (used or 0), i + weight - (used or 0)
        elif state.startswith("idle"):  # powered down (idle~) too, as Slurm counts it
            i += weight
        else:
            a += weight
    return f"{a}/{i}/{o}/{a + i + o}"


COLUMNS: dict[str, fmt.Column] = {
    "P": ("PARTITION", lambda r: r[0]["name"] + ("*" if r[0]["default"] else "")),
    "R": ("PARTITION", lambda r: r[0]["name"]), "a": ("AVAIL", lambda r: "up"),
    "l": ("TIMELIMIT", lambda r: _limit(r[0])), "D": ("NODES", lambda r: str(len(r[1]))),
    "t": ("STATE", lambda r: COMPACT[r[2]["states"][r[1][0]["name"]]] if r[1] else "n/a"),
    "T": ("STATE", lambda r: r[2]["states"][r[1][0]["name"]] if r[1] else "n/a"),
    "N": ("NODELIST", lambda r: compress([n["name"] for n in r[1]])),
    "n": ("HOSTNAMES", lambda r: ",".join(n["name"] for n in r[1])),
    "G": ("GRES", lambda r: _gres(r[1][0]) if r[1] else "(null)"),
    "c": ("CPUS", lambda r: str(r[1][0]["cpus"]) if r[1] else "0"),
    "m": ("MEMORY", lambda r: str(r[1][0]["mem"] // (1024 * 1024)) if r[1] else "0"),
    "f": ("AVAIL_FEATURES", lambda r: ",".join(r[1][0].get("features") or []) or "(null)"
          if r[1] else "(null)"),
    "F": ("NODES(A/I/O/T)", lambda r: _counts(r, "F")),
    "C": ("CPUS(A/I/O/T)", lambda r: _counts(r, "C")),
    "E": ("REASON", lambda r: (r[1][0].get("reason") or "none") if r[1] else "none"),
}


def _gres(node: dict[str, Any]) -> str:
    kinds: dict[str, int] = {}
    for g in node["gpus"]:
        kinds[g["type"]] = kinds.get(g["type"], 0) + 1
    return ",".join(f"gpu:{t}:{n}" for t, n in kinds.items()) or "(null)"


def parser() -> argparse.ArgumentParser:
    return common.parser(
        "sinfo", ("-h --noheader", common.FLAG), ("-N --Node", common.FLAG),
        ("-s --summarize", common.FLAG), ("-o --format", common.ONE),
        ("-p --partition", common.MANY), ("-t --states", common.MANY), ("-n --nodes", common.MANY),
        ("-l --long", common.FLAG), ("-a --all", common.FLAG), ("-e --exact", common.FLAG))


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    with common.client() as c:
        reply = c.request(protocol.NODES)
        jobs = c.queue(states=["RUNNING"])
    cpus = used_cpus(jobs)
    nodes = {n["name"]: n for n in reply["nodes"]}
    states = {name: node_state(n, cpus.get(name, 0)) for name, n in nodes.items()}
    seen: dict[str, Any] = {"cpus": cpus, "states": states}
    wanted_nodes = {n for text in common.split(args.nodes) for n in expand(text)}
    wanted_states = {s.lower() for s in common.split(args.states)}
    rows: list[Row] = []
    for part in reply.get("partitions") or ():
        if args.partition and part["name"] not in common.split(args.partition):
            continue
        members = [nodes[n] for n in part["nodes"] if n in nodes
                   and (not wanted_nodes or n in wanted_nodes)
                   and (not wanted_states or {states[n], COMPACT[states[n]]} & wanted_states)]
        rows += _group(part, members, seen, args)
    form = args.format or (NODES if args.Node else SUMMARY if args.summarize else DEFAULT)
    for line in fmt.render(fmt.parse(form, COLUMNS, "sinfo"), COLUMNS, rows,
                           header=not args.noheader):
        print(line)
    return 0


def _group(part: dict[str, Any], members: list[dict[str, Any]], seen: dict[str, Any],
           args: argparse.Namespace) -> list[Row]:
    """A partition's rows: one a node with -N, one in all with -s, else one a node state."""
    if args.Node:
        return [(part, [n], seen) for n in members]
    if args.summarize:
        return [(part, members, seen)]
    by_state: dict[str, list[dict[str, Any]]] = {}
    for node in members:
        by_state.setdefault(seen["states"][node["name"]], []).append(node)
    return [(part, group, seen) for group in by_state.values()] or [(part, [], seen)]


def main(argv: list[str] | None = None) -> int:
    return common.main("sinfo", run, argv)
