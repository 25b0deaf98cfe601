"""`gq up`, `gq down` (the personal cluster) and `gq nodes`."""

from __future__ import annotations

from typing import Optional

import typer

from gq.cli import render


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("down")(down)
    app.command("nodes")(nodes)


def up(
    nodes: Optional[int] = typer.Option(None, "-n", "--nodes", help="gqnodes to run (default 1, or as last time)"),
    fake_gpus: Optional[str] = typer.Option(None, "--fake-gpus", help="GPUs per node: 8, 8xh100:80G, 4xa100:40G,4xl4:24G"),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="CPUs each node claims (default: the host's)"),
    mem: Optional[str] = typer.Option(None, "--mem", help="memory each node claims, e.g. 256G (default: the host's)"),
    features: Optional[str] = typer.Option(None, "--features", help="features of each node, comma-separated (for --constraint)"),
    node: Optional[list[str]] = typer.Option(None, "--node", metavar="NAME[:cpus=N,mem=SIZE,gpus=SPEC,features=A+B]", help="a node of its own shape (repeat for each; instead of --nodes)"),
) -> int:
    """Start a personal cluster on this host (gqd and N gqnodes); run again to restart what stopped."""
    from gq import cluster
    from gq.errors import UsageError
    from gq.model import parse_gpu_spec, parse_size
    if nodes is not None and not 1 <= nodes <= 64:
        raise UsageError(f"bad --nodes {nodes}: expected 1..64")
    named = [cluster.parse_node(text) for text in node or ()]
    for spec in [fake_gpus, *(m.get("fake_gpus") for m in named)]:
        if spec is not None:
            parse_gpu_spec(spec)  # a bad spec is a usage error here, not a daemon that dies
    for size in [mem, *(m.get("mem") for m in named)]:
        if size is not None:
            parse_size(size)
    for count in [cpus, *(int(m["cpus"]) if m.get("cpus", "").isdigit() else -1
                          for m in named if "cpus" in m)]:
        if count is not None and count < 1:
            raise UsageError(f"bad --cpus {count}: expected a count of 1 or more")
    shape = {k: str(v) for k, v in (("cpus", cpus), ("mem", mem), ("features", features))
             if v is not None}
    cfg = cluster.up(nodes, fake_gpus, say=render.message, shape=shape, named=named or None)
    if url := cluster.metrics_url(cfg):
        render.message(f"Prometheus metrics at {url}")
    render.message(f"personal cluster is up (config {cfg.path}); try `gq submit --wrap 'nvidia-smi -L || env | grep CUDA'`")
    return 0


def down() -> int:
    """Stop the personal cluster; running jobs are cancelled, pending ones stay queued."""
    from gq import cluster
    cluster.down(say=render.message)
    return 0


def nodes(as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
          parsable: bool = typer.Option(False, "-p", "--parsable",
                                        help="'|' between fields, a header line first")) -> int:
    """List nodes and each GPU: type, VRAM, utilization, temperature and the job holding it."""
    from gq.client import Client
    with Client() as client:
        data = client.nodes()
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "nodes": data})
    else:
        render.listing(*render.node_rows(data), parsable)
    return 0
