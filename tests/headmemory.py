"""What a `Head` holds in memory, as plain values to compare before and after a rollback."""

from __future__ import annotations

from typing import Any

from gq.head import gate
from gq.head.core import Head


def memory(head: Head) -> dict[str, Any]:
    """Everything the head holds in memory that the store rolls back, as plain values, and
    which objects hold it (a reload would make new ones). A pending job's priority is left out:
    it is worked out when the job is shown."""
    table, index, registry = head.table, head.index, head.registry
    jobs = list(table.jobs.values())
    scan = gate.Live.count(jobs)
    nodes = {*registry.nodes, *(n for j in jobs for n in j.alloc)}
    names = {(j.spec.user, j.spec.name) for j in jobs} | {("nobody", "x")}
    return {
        "jobs": [(j.id, id(j), {k: v for k, v in vars(j).items() if k != "priority"})
                 for j in jobs],
        "arrays": {a: dict(tasks) for a, tasks in table.arrays.items()},
        "queued": (dict(table.queued.by_key), len(table.queued)),
        "ready": [j.id for j in index.ready()], "placed": [j.id for j in index.placed()],
        "on_node": {n: [j.id for j in index.on_node(n)] for n in nodes},
        "depth": index.depth(), "reasons": index.reasons(),
        "fresh": sorted(j.id for j in jobs if j.hold and not index.seen(j.id)),
        "running": dict(index.live().running),
        "first": {k: (index.first_live(k), scan.first(k)) for k in names},
        "launches": {i: (id(l), l.sent_at, set(l.confirmed), set(l.holding), dict(l.results),
                         l.max_rss, l.cpu_s)
                     for i, l in table.launches.items()},
        "due": {(s, i) for s, i in table.launches.resends
                if i in table.launches and table.launches[i].sent_at == s},
        "ended": dict(table.ended), "reservations": dict(table.reservations),
        "usage": table.usage.at(0.0),
        "nodes": {n: (id(node), node.state, node.reason, node.drain_reason, node.gpus)
                  for n, node in registry.nodes.items()},
        "registered": set(registry.registered), "submits": len(head.submits.queue),
        "orders": list(head.outbox)}


def store_rows(head: Head) -> list[list[tuple]]:
    """Every row of the store's tables, but the commit counter (gq/storeguard.py): a turn's
    transaction counts when anything was written in it, also what a savepoint took back (an
    over-count is harmless: the mark only ever needs a lower bound)."""
    conn = head.store.conn
    return [conn.execute(f"SELECT * FROM {t} {where} ORDER BY 1, 2").fetchall()
            for t, where in (("jobs", ""), ("runs", ""), ("nodes", ""),
                             ("meta", "WHERE key != 'commits'"))]
