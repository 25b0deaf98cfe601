"""The node registry: which gqnodes gqd knows, their state (UP, DRAIN, DOWN) and what they say
(registrations, heartbeats, health, run reports), and the admin requests that drain and resume
them. What a node's news means for its jobs, the job table decides.

A change to a node's stored state is journaled with the job table's changes (a rolled-back turn
takes a registration back with what it did to jobs; the node is asked to register again). When a
node was last heard from is not: it is no state of the store, and the node is alive.

Liveness is on the steady clock (`heard`, time.monotonic() in gqd): a step of the wall clock
marks no node DOWN (issue 13); `last_seen` (wall time) is only shown.

A node with a head lease ([node] head_lease_s, in its registration) stops its jobs itself when it
has heard nothing from gqd for that long (gq/node/lease.py; gqd answers each of its heartbeats
with an Alive). Its lease runs from when it sent a heartbeat gqd answered, so it ends before
`heard` plus the lease: when such a node goes DOWN, its running jobs are lost (requeued) only
once that, with a margin for clock rates, the kill grace and a second, has passed (`doomed`), so
no job runs in two places. A node that registers again before then keeps its jobs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from gq import requests
from gq.config import Config
from gq.errors import NotFoundError, PermissionDenied, ProtocolError, UsageError
from gq.head import telemetry
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.orders import Order
from gq.messages import (
    FINISHED, MAX_NOTE, STARTED, STEP_ENDED, STEP_STARTED, Ack, Alive, Heartbeat, Kill,
    Mark, NodeMessage,
    Register, Report, Reregister)
from gq.model import JobState, Node, NodeState
from gq.store import Store

log = logging.getLogger("gq.head")

#: A node's health problems shown in its drain reason: at most this many, this long each.
MAX_HEALTH_PROBLEMS = 4
MAX_HEALTH_TEXT = 200
#: Drain reason of a node whose state disk is full (its heartbeat's `disk` follows): gqd lifts
#: this drain, and no other, by itself once the node has room again.
DISK_FULL = "node state disk full: "
#: How much longer than a node's head lease gqd waits (on its own clock) before it requeues the
#: jobs of a node gone silent: a fraction for two clocks' rates (real ones differ by parts per
#: million), the jobs' kill grace (the node's stop is SIGTERM, then SIGKILL after it), and this
#: many seconds for the stop to take effect.
LEASE_RATE_MARGIN = 0.01
LEASE_MARGIN_S = 1.0


class NodeRegistry:
    def __init__(self, store: Store, table: JobTable, cfg: Config):
        self.store = store
        self.table = table
        self.cfg = cfg
        self.nodes: dict[str, Node] = {}
        #: Nodes registered since gqd started (the others are asked to register again).
        self.registered: set[str] = set()
        #: Node name -> when it was last heard from, on the steady clock: its liveness.
        self.heard: dict[str, float] = {}
        #: Node name -> its [node] head_lease_s, as it registered (0: none).
        self.lease: dict[str, float] = {}
        #: Node name -> when (steady clock) the jobs of a DOWN node with a lease are requeued.
        self.doomed: dict[str, float] = {}
        #: Called when a node comes or its features change (where jobs may run changed).
        self.reshaped: Callable[[], None] = lambda: None
        #: `gq admin resume` of a DOWN node that is not registered (gq/head/power.py makes a
        #: node of [power] nodes POWERED_DOWN again).
        self.powered_off: Callable[[Node], None] = lambda node: None
        #: A node's report that it started its tasks of a step, or that they ended
        #: (gq/head/steps.py).
        self.step_report: Callable[[str, Report, float], list[Order]] = \
            lambda node, msg, now: []
        #: Takes a heartbeat's checkpoint markers (gq/head/checkpoints.py).
        self.checkpointed: Callable[[str, tuple[Mark, ...], float], None] = \
            lambda node, marks, now: None

    def load(self) -> None:
        """The nodes the store knows, at gqd's start."""
        self.nodes.clear()
        for node in self.store.load_nodes():
            # Until it registers again we know nothing about a node; drains are kept, and
            # power states (gq/head/power.py, which loads them).
            if node.state not in (NodeState.DRAIN, NodeState.POWERED_DOWN,
                                  NodeState.POWERING_UP, NodeState.POWERING_DOWN):
                node.state, node.reason = NodeState.DOWN, "not registered since gqd started"
            self.nodes[node.name] = node
        self.registered.clear()
        self.heard.clear()

    def addr(self, name: str) -> str:
        """How a node's peers reach it ("" for a node not known)."""
        node = self.nodes.get(name)
        return node.addr if node is not None else ""

    # ------------------------------------------------------------ what nodes send

    def handle(self, name: str, msg: NodeMessage, now: float) -> list[Order]:
        if msg.node != name:
            raise ProtocolError(f"node {name!r} sent a message signed {msg.node!r}")
        if name in self.nodes and self.nodes[name].state == NodeState.POWERING_DOWN:
            return []  # being suspended (gq/head/power.py): its last words bring it not back
        if isinstance(msg, Register):
            return self._register(name, msg, now)
        if name not in self.registered:
            # A head restart forgot this node's connection: ask it to register again.
            return [Order(name, Reregister())]
        node = self.nodes[name]
        node.last_seen = now  # shown; liveness is `heard`
        self.heard[name] = self.table.steady(now)
        if node.state == NodeState.DOWN:
            self._keep(node)
            node.state, node.reason = NodeState.UP, ""
            self.store.save_node(node)
            self.table.touch()
        if isinstance(msg, Heartbeat):
            # (the schema has checked each key a GPU index and each value a map of readings)
            rule = telemetry.Rule.of(self.cfg)
            before = rule.limits(node, now, frozenset())
            node.telemetry = {int(k): v for k, v in msg.telemetry.items()}
            node.telemetry_at = now
            warm = {int(k): tuple(v) for k, v in msg.warm.items()}
            if warm != node.warm:
                node.warm = warm
                self.table.touch()  # a waiting job's key may be warm now (model affinity)
            if telemetry.eased(before, rule.limits(node, now, frozenset())):
                self.table.touch()  # a GPU cooled, or VRAM was freed: a pending job may fit
            out = self._check_health(node, list(msg.health), now)
            self._check_disk(node, msg.disk or "")
            if msg.checkpoints:
                self.checkpointed(name, msg.checkpoints, now)
            if msg.beat:  # the node holds a head lease: this answer renews it
                out.append(Order(name, Alive(msg.beat)))
            return out
        return [*self._report(node, msg, now), Order(name, Ack(msg.seq))]

    def _register(self, name: str, msg: Register, now: float) -> list[Order]:
        gpus = list(msg.gpus)
        old = self.nodes.get(name)
        node = Node(name=name, gpus=gpus, cpus=msg.cpus, mem=msg.mem, state=NodeState.UP,
                    last_seen=now, addr=msg.addr or name, features=list(msg.features))
        if old is None or old.features != node.features:
            self.reshaped()
        if old and (old.drain_reason or old.state == NodeState.DRAIN):
            drain = old.drain_reason or old.reason
            node.state, node.reason, node.drain_reason = NodeState.DRAIN, drain, drain
        self._keep_slot(name)
        self.nodes[name] = node
        self.registered.add(name)
        self.heard[name] = self.table.steady(now)
        self.lease[name] = msg.head_lease_s
        if self.doomed.pop(name, None) is not None:
            log.info("node %s is back within its head lease: its jobs go on", name)
        self.store.save_node(node)
        self.table.touch()
        log.info("node %s registered: %d GPUs (%s)", name, len(gpus), msg.gpu_source or "?")
        running = set(msg.running)
        out: list[Order] = []
        for job_id, restart in running:
            job = self.table.jobs.get(job_id)
            if job and job.state == JobState.RUNNING and job.restart_count == restart \
                    and name in job.alloc:
                self.table.adopt(job, name, now)
            else:
                # Not ours to run (cancelled, requeued, forgotten): stop it on the node.
                out.append(Order(name, Kill(job_id, restart, "KILL")))
        for job in self.table.running_on(name):
            launch = self.table.launches[job.id]
            if (job.id, job.restart_count) not in running and name in launch.confirmed \
                    and name in launch.holding:
                # It started there and the node no longer has it, not even as an unacked end
                # (its state directory was lost): that run is gone.
                log.warning("node %s lost job %d run %d", name, job.id, job.restart_count)
                out += self.table.lose(job, now)
        return out

    def _check_health(self, node: Node, problems: list[Any], now: float) -> list[Order]:
        """Fail fast: a node whose GPU reports an error (XID, ECC, GPU lost) is drained with it,
        and its jobs are requeued rather than left to crash or compute garbage there."""
        found = [str(p)[:MAX_HEALTH_TEXT] for p in problems][:MAX_HEALTH_PROBLEMS]
        reason = "; ".join(found)
        if not found or (node.state == NodeState.DRAIN and node.reason == reason):
            return []
        log.warning("node %s is unhealthy, draining it: %s", node.name, reason)
        self._drain(node, reason)
        out: list[Order] = []
        for job in self.table.running_on(node.name):
            out += self.table.lose(job, now)
        self.table.touch()
        return out

    def _check_disk(self, node: Node, problem: str) -> None:
        """A node whose state disk is full takes no new jobs, but its running jobs go on (their
        ends still reach us): drained with DISK_FULL, which is lifted here once the node says it
        has room again. A node drained for anything else (an admin, a health problem) is left
        as it is."""
        ours = node.state == NodeState.DRAIN and node.drain_reason.startswith(DISK_FULL)
        if problem and node.state == NodeState.UP:
            reason = DISK_FULL + problem[:MAX_HEALTH_TEXT]
            log.warning("node %s: %s; draining it, its jobs go on", node.name, reason)
            self._drain(node, reason)
            self.table.touch()
        elif not problem and ours:
            log.info("node %s has room on its state disk again: resumed", node.name)
            self._keep(node)
            node.state, node.reason, node.drain_reason = NodeState.UP, "", ""
            self.store.save_node(node)
            self.table.touch()

    def _report(self, node: Node, msg: Report, now: float) -> list[Order]:
        job = self.table.jobs.get(msg.job_id)
        if job is None or msg.job_id not in self.table.launches \
                or job.restart_count != msg.restart:
            log.info("ignoring stale %s report for job %s run %s from %s", msg.event,
                     msg.job_id, msg.restart, node.name)
            return []
        if node.name not in job.alloc:
            # Only a node that holds the run speaks for it (each rank of a gang job for itself:
            # results are kept per node); another node's report, forged or confused, is dropped
            # (and acked, so it is not sent again).
            log.warning("dropping %s report for job %d run %d from node %s, which does not hold "
                        "it (it runs on %s)", msg.event, job.id, job.restart_count, node.name,
                        ",".join(job.alloc))
            return []
        if msg.event == STARTED:
            self.table.rank_started(job, node.name)
            return []
        if msg.event in (STEP_STARTED, STEP_ENDED):
            return self.step_report(node.name, msg, now)
        if msg.event != FINISHED:
            return []
        out = self.table.rank_ended(job, node.name, msg.state or "FAILED", msg.exit_code, now,
                                    msg.max_rss, msg.cpu_s)
        if msg.note and job.state.terminal and not job.reason:
            # Why it could not start (its output file, say): shown by `gq show`.
            self.table.set_reason(job, msg.note[:MAX_NOTE])
        return out

    # ------------------------------------------------------------ timers

    def tick(self, now: float) -> list[Order]:
        """Nodes not heard from in [head] node_timeout_s are DOWN."""
        timeout = self.cfg.head.node_timeout_s
        steady = self.table.steady(now)
        out: list[Order] = []
        for node in list(self.nodes.values()):
            silent = steady - self.heard.get(node.name, steady)
            if node.name in self.registered and node.state != NodeState.DOWN and silent > timeout:
                out += self.node_down(node, f"no heartbeat for {silent:.0f}s", now)
        for name, when in list(self.doomed.items()):
            if steady >= when:
                del self.doomed[name]
                out += self._lease_over(name, now)
        return out

    def _lease_over(self, name: str, now: float) -> list[Order]:
        """The head lease of DOWN node `name` has surely run out: it has stopped its jobs,
        which are requeued now (or end NODE_FAIL, per their --retries and --no-requeue)."""
        if name in self.registered:
            return []
        out: list[Order] = []
        jobs = [j for j in self.table.index.on_node(name)
                if j.holds_alloc and j.state == JobState.RUNNING]
        if jobs:
            log.warning("node %s: its head lease has run out: requeuing its %d jobs", name,
                        len(jobs))
        for job in jobs:
            out += self.table.lose(job, now)
        self.table.touch()
        return out

    def node_down(self, node: Node, reason: str, now: float) -> list[Order]:
        log.warning("node %s is DOWN: %s", node.name, reason)
        self._keep_slot(node.name)
        self._keep(node)
        if node.state == NodeState.DRAIN:
            node.drain_reason = node.drain_reason or node.reason
        node.state, node.reason = NodeState.DOWN, reason + (
            f" (drained: {node.drain_reason})" if node.drain_reason else "")
        self.registered.discard(node.name)
        self.store.save_node(node)
        out: list[Order] = []
        lease = self.lease.get(node.name, 0.0)
        for job in [j for j in self.table.index.on_node(node.name) if j.holds_alloc]:
            if job.state != JobState.RUNNING:
                self.table.release(job)
            elif not lease:
                out += self.table.lose(job, now)
        if lease:
            # Its jobs may still be running there: they are requeued once it has stopped them.
            heard = self.heard.get(node.name, self.table.steady(now))
            when = heard + lease * (1 + LEASE_RATE_MARGIN) + self.cfg.head.kill_grace_s \
                + LEASE_MARGIN_S
            self.doomed[node.name] = when
            log.warning("node %s: its jobs are requeued when its head lease (%gs) has run out, "
                        "in %.1fs", node.name, lease, max(0.0, when - self.table.steady(now)))
        self.table.touch()
        return out

    # ------------------------------------------------------------ admin requests

    def req_nodes(self, msg: requests.Nodes, caller: Caller, client: Any, now: float) -> dict:
        holders: dict[tuple[str, int], int] = {}
        # Jobs whose processes may still live on a node, GPUs or none (a cancelled job holds
        # its allocation until the node reports it gone): what `gq down` waits for.
        on_node: dict[str, list[int]] = {}
        for job in self.table.index.placed():
            if job.holds_alloc:
                for node, gpus in job.alloc.items():
                    holders.update({(node, g): job.id for g in gpus})
                    on_node.setdefault(node, []).append(job.id)
        held: dict[str, set[int]] = {}
        for name, g in holders:
            held.setdefault(name, set()).add(g)
        out = []
        rule = telemetry.Rule.of(self.cfg)
        for each in sorted(self.nodes.values(), key=lambda n: n.name):
            data = each.to_json()
            notes = rule.notes(each, now, frozenset(held.get(each.name, ())))
            data["telemetry_stale"] = bool(each.telemetry) and not rule.fresh(each, now)
            data["jobs"] = sorted(on_node.get(each.name, ()))
            for gpu in data["gpus"]:
                gpu["job"] = holders.get((each.name, gpu["index"]))
                gpu["skip"] = notes.get(gpu["index"])
            out.append(data)
        return {"nodes": out}

    def req_drain(self, msg: requests.Drain, caller: Caller, client: Any, now: float) -> dict:
        """Take nodes out of scheduling; running jobs carry on (Slurm's DRAIN)."""
        nodes = self._admin_nodes(msg.nodes, caller)
        if not msg.reason.strip():
            raise UsageError("a drain needs a reason (--reason)")
        if msg.reason.startswith(DISK_FULL):  # so that no admin's drain is ever lifted
            raise UsageError(f"drain reasons starting {DISK_FULL.strip()!r} are gqnode's own")
        for node in nodes:
            self._drain(node, msg.reason)
        return {"nodes": [n.name for n in nodes]}

    def req_resume(self, msg: requests.Resume, caller: Caller, client: Any, now: float) -> dict:
        nodes = self._admin_nodes(msg.nodes, caller)
        for node in nodes:
            self._keep(node)
            if node.state == NodeState.DRAIN:
                node.state = NodeState.UP
            node.reason = "" if node.state == NodeState.UP else node.reason
            node.drain_reason = ""
            if node.state == NodeState.DOWN and node.name not in self.registered:
                self.powered_off(node)  # a node of [power] nodes: off again, to be resumed
            self.store.save_node(node)
        self.table.touch()
        return {"nodes": [n.name for n in nodes]}

    def _drain(self, node: Node, reason: str) -> None:
        self._keep(node)
        # A DOWN node stays DOWN with the reason; drain_reason brings it back drained. So does
        # a node in a power state (gq/head/power.py, which resumes no drained node).
        if node.state not in (NodeState.DOWN, NodeState.POWERED_DOWN, NodeState.POWERING_UP,
                              NodeState.POWERING_DOWN):
            node.state = NodeState.DRAIN
        node.reason = node.drain_reason = reason
        self.store.save_node(node)

    def _admin_nodes(self, names: Sequence[str], caller: Caller) -> list[Node]:
        if not caller.admin:
            raise PermissionDenied(f"permission denied: only admins manage nodes "
                                   f"({caller.user} is not in [auth] admins)")
        if not all(isinstance(n, str) for n in names):
            raise ProtocolError("nodes must be names")
        unknown = [n for n in names if n not in self.nodes]
        if unknown:
            raise NotFoundError(f"no such node: {', '.join(unknown)}")
        return [self.nodes[n] for n in names]

    # ------------------------------------------------------------ the journal

    def _keep(self, node: Node) -> None:
        """Journal what the store holds of a node (not when it was last heard from)."""
        was = (node.state, node.reason, node.drain_reason)

        def undo() -> None:
            node.state, node.reason, node.drain_reason = was
        self.table.journal.record(undo)

    def _keep_slot(self, name: str) -> None:
        """Journal which Node object stands for `name`, and whether it is registered."""
        old, registered = self.nodes.get(name), name in self.registered

        def undo() -> None:
            if old is None:
                self.nodes.pop(name, None)
            else:
                self.nodes[name] = old
            (self.registered.add if registered else self.registered.discard)(name)
        self.table.journal.record(undo)
