"""`gq watch`: the queue and every GPU (which job holds it, how busy it is), refreshed.

On a terminal it is a full-screen rich view; otherwise each refresh prints the plain tables of
`gq nodes` and `gq queue` after a `# TIME` line, so that a log or a pipe gets the same data.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import typer

from gq.cli import render
from gq.errors import UsageError
from gq.model import iso_time


def register(app: typer.Typer) -> None:
    app.command("watch")(watch)


def watch(
    interval: float = typer.Option(2.0, "-i", "--interval", metavar="SECONDS",
                                   help="seconds between refreshes"),
    count: int = typer.Option(0, "-n", "--count", metavar="N",
                              help="stop after N refreshes (default: until Ctrl-C)"),
    me: bool = typer.Option(False, "--me", help="only my jobs in the queue"),
) -> int:
    """A live view of the queue and of each node's GPUs: the job holding each, its utilization."""
    if not interval > 0:
        raise UsageError(f"bad --interval {interval}: must be more than 0 seconds")
    if count < 0:
        raise UsageError(f"bad --count {count}: must be 0 (no end) or more")
    from gq.client import Client
    with Client() as client:
        user = client._user if me else None
        fetch = lambda: (client.queue(user=user, fields=render.QUEUE_FIELDS),  # noqa: E731
                         client.nodes())
        try:
            if render.terminal():
                _live(fetch, interval, count)
            else:
                _plain(fetch, interval, count)
        except KeyboardInterrupt:
            pass
    return 0


def _refreshes(interval: float, count: int) -> Iterator[int]:
    """1, 2, ... (up to `count` when it is not 0), sleeping `interval` between them."""
    n = 0
    while True:
        n += 1
        yield n
        if n == count:
            return
        time.sleep(interval)


def _plain(fetch: Any, interval: float, count: int) -> None:
    for _ in _refreshes(interval, count):
        jobs, nodes = fetch()
        print(f"# {iso_time(time.time())}")
        render.table(*render.node_rows(nodes))
        print()
        render.table(*render.queue_rows(jobs))
        print(flush=True)


def _live(fetch: Any, interval: float, count: int) -> None:
    from rich.live import Live
    with Live(console=render.console(), screen=True, auto_refresh=False) as live:
        for _ in _refreshes(interval, count):
            live.update(view(*fetch()), refresh=True)


def view(jobs: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> Any:
    """The rich renderable of one refresh: a summary line, the GPUs by node, the queue."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text
    gpus = [g for n in nodes for g in n["gpus"]]
    busy = sum(1 for g in gpus if g.get("job"))
    pending = sum(1 for j in jobs if j["state"] == "PENDING")
    running = sum(1 for j in jobs if j["state"] == "RUNNING")
    header = Text(f"gq watch  {iso_time(time.time())}  {running} running, {pending} pending, "
                  f"{busy}/{len(gpus)} GPUs in use", style="bold")
    grid = Table(box=None, pad_edge=False, header_style="bold", title_justify="left")
    for col in ("NODE", "STATE", "GPUS", "OCCUPANCY (GPU:JOB UTIL)"):
        grid.add_column(col, no_wrap=True)
    for n in nodes:
        used = sum(1 for g in n["gpus"] if g.get("job"))
        grid.add_row(n["name"], _state(n), f"{used}/{len(n['gpus'])}", _occupancy(n["gpus"]))
    queue = Table(box=None, pad_edge=False, header_style="bold")
    headers, rows = render.queue_rows(jobs)
    for h in headers:
        queue.add_column(h, no_wrap=True)
    for row in rows:
        queue.add_row(*("" if c is None else str(c) for c in row))
    return Group(header, Text(""), grid, Text(""), queue)


def _state(node: dict[str, Any]) -> Any:
    from rich.text import Text
    style = {"UP": "green", "DRAIN": "yellow", "DOWN": "red", "POWERED_DOWN": "dim",
             "POWERING_UP": "cyan", "POWERING_DOWN": "dim"}.get(node["state"], "")
    return Text(node["state"] + (f" ({node['reason']})" if node.get("reason") else ""), style)


def _occupancy(gpus: list[dict[str, Any]]) -> Any:
    """`0:17 93%  1:- 0%  ...`: a held GPU's job in bold, utilization coloured by load."""
    from rich.text import Text
    out = Text()
    for g in gpus:
        if out:
            out.append("  ")
        job = g.get("job")
        out.append(f"{g['index']}:")
        out.append(str(job) if job else "-", style="bold cyan" if job else "dim")
        if "util" in g:
            util = g["util"]
            out.append(f" {util}%", style="red" if util >= 90 else "yellow" if util >= 50
                       else "green")
    return out

