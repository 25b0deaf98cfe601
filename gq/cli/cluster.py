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
) -> int:
    """Start a personal cluster on this host (gqd and N gqnodes); run again to restart what stopped."""
    from gq import cluster
    from gq.errors import UsageError
    from gq.model import parse_gpu_spec
    if nodes is not None and not 1 <= nodes <= 64:
        raise UsageError(f"bad --nodes {nodes}: expected 1..64")
    if fake_gpus is not None:
        parse_gpu_spec(fake_gpus)  # a bad spec is a usage error here, not a daemon that dies
    cfg = cluster.up(nodes, fake_gpus, say=render.message)
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
