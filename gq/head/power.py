"""Power saving, Slurm style ([power], gq/powercfg.py; docs/SCHEDULING.md "Autoscaling").

The nodes of `[power] nodes` are known to gqd before they ever register, with their declared
shape, POWERED_DOWN: jobs that only they could hold are admitted, and the scheduler plans
nothing onto them (a node not UP is not schedulable: no start, no reservation), so a job never
waits for a node that may never come. Each loop turn (`tick`, in the turn's transaction):

- the jobs still pending after the last pass that powered-down nodes would take resume just
  enough of those nodes (the pure choice: gq/sched/resume.py), at most `resume_rate` a minute:
  `resume_program HOSTLIST`, the nodes POWERING_UP;
- a node that registers is UP (the registry does that) and takes jobs like any other; one that
  has not registered within `resume_timeout` is DOWN with the reason, and its claim is released
  (its room no longer counts, so another node may be resumed for the jobs);
- a node of `[power] nodes` that is UP and has held no job for `suspend_time` is suspended:
  `suspend_program HOSTLIST`, the node POWERING_DOWN (its messages ignored, so that a last
  heartbeat does not bring it back) until the program exits (or `suspend_timeout`), then
  POWERED_DOWN.

The programs are started after the turn commits (`send`; a rolled-back turn starts none), never
waited for: reaped by `poll` on later turns. Power states are node states, in the store: after a
gqd restart a POWERED_DOWN node stays so, a POWERING_UP one gets a fresh resume_timeout, and a
POWERING_DOWN one is POWERED_DOWN.
"""

from __future__ import annotations

import logging
import math
import shlex
import subprocess
from collections import deque
from collections.abc import Iterable

from gq.config import Config
from gq.head.jobs import JobTable
from gq.head.nodes import NodeRegistry
from gq.head.orders import Order
from gq.hostlist import compress, natural_key
from gq.head.reasons import NONE
from gq.model import Job, JobState, Node, NodeState
from gq.powercfg import shapes
from gq.sched.plan import RESOURCES
from gq.sched.resume import Room, to_resume
from gq.sched.types import PendingJob

log = logging.getLogger("gq.head")

#: Power programs running at once, at most (a hung one must not grow gqd).
MAX_RUNNING = 32
#: The window of `resume_rate`, in seconds (Slurm's ResumeRate is nodes a minute).
RATE_WINDOW_S = 60.0
#: Seconds between two looks at the demand, at least.
RESUME_EVERY_S = 1.0
#: A pending job's reason while nodes it will run on are powering up (`Power.reason`).
POWERING_UP = "PoweringUp"
POWER_STATES = (NodeState.POWERED_DOWN, NodeState.POWERING_UP, NodeState.POWERING_DOWN)


class Power:
    def __init__(self, cfg: Config, registry: NodeRegistry, table: JobTable) -> None:
        self.registry = registry
        self.table = table
        #: Node name -> when (steady clock) its resume, or its suspend, began.
        self.resuming: dict[str, float] = {}
        self.suspending: dict[str, float] = {}
        #: Node name -> since when (steady clock) an UP node of ours has held no job.
        self.idle_since: dict[str, float] = {}
        #: When (steady clock) each node resumed in the last RATE_WINDOW_S was.
        self.recent: deque[float] = deque()
        #: Job id -> the nodes it was laid on at the last look at the demand: while one of
        #: them is POWERING_UP, a job the pass could not start shows it (`explain`).
        self.waiting: dict[int, list[str]] = {}
        #: No look at the demand before this (steady clock).
        self.resume_at = -math.inf
        self.seen: object = None
        #: (argv, node names) of programs to start once the turn commits; those running.
        self.queued: list[tuple[list[str], list[str]]] = []
        self.running: list[tuple[subprocess.Popen[bytes], list[str]]] = []
        #: The declared nodes and their shapes: read at start (a reload takes the other keys).
        self.declared = {n.name: n for n in shapes(cfg.power, cfg.path or "<config>")}
        self.configure(cfg)
        registry.powered_off = self._powered_off

    def configure(self, cfg: Config) -> None:
        self.cfg = cfg.power

    # ------------------------------------------------------------ start-up

    def load(self) -> bool:
        """After the registry's load: every declared node is known, power states restored (a
        node POWERED_DOWN keeps its declared shape, which a changed config may have changed).
        True if a node was added (where jobs may run changed)."""
        added = False
        for name, shape in self.declared.items():
            node = self.registry.nodes.get(name)
            if node is None or node.state in POWER_STATES:
                state = node.state if node is not None else NodeState.POWERED_DOWN
                added |= node is None
                node = self.registry.nodes[name] = Node(
                    name=name, gpus=list(shape.gpus), cpus=shape.cpus, mem=shape.mem,
                    features=list(shape.features), addr=name,
                    state=NodeState.POWERED_DOWN if state == NodeState.POWERING_DOWN else state)
                self.registry.store.save_node(node)
        for node in self.registry.nodes.values():
            if node.name not in self.declared and node.state in POWER_STATES:
                node.state, node.reason = NodeState.DOWN, "no longer in [power] nodes"
                self.registry.store.save_node(node)
        return added

    # ------------------------------------------------------------ the loop's turn

    def tick(self, now: float, pending: Iterable[PendingJob]) -> list[Order]:
        """Timers and decisions of this turn; `pending`: the last pass's views of the jobs it
        could have started (those still PENDING are the demand)."""
        if not self.declared:
            return []
        steady = self.table.steady(now)
        self._reap()
        out = self._powering(now, steady)
        self._suspend_idle(steady, pending)
        self._resume(steady, pending)
        return out

    def _ours(self, state: NodeState) -> list[Node]:
        """Our nodes in `state`; a drained one is never resumed."""
        nodes = self.registry.nodes
        return [nodes[n] for n in self.declared if n in nodes and nodes[n].state == state
                and not (state == NodeState.POWERED_DOWN and nodes[n].drain_reason)]

    def _powered_off(self, node: Node) -> None:
        """`gq admin resume` of one of our nodes that is DOWN (its resume timed out, or it went
        silent): it is off, to be resumed when jobs need it (Slurm's state=resume of a cloud
        node)."""
        if node.name in self.declared:
            log.info("node %s: resumed by an admin: POWERED_DOWN", node.name)
            self._set(node, NodeState.POWERED_DOWN, "")

    def _powering(self, now: float, steady: float) -> list[Order]:
        """Resumes that timed out; suspends that are over."""
        out: list[Order] = []
        for node in self._ours(NodeState.POWERING_UP):
            since = self.resuming.setdefault(node.name, steady)  # (after a restart: from now)
            if steady - since > self.cfg.resume_timeout:
                del self.resuming[node.name]
                out += self.registry.node_down(
                    node, f"resume timed out after {self.cfg.resume_timeout:g}s", now)
        for name in [n for n in self.resuming
                     if self.registry.nodes[n].state != NodeState.POWERING_UP]:
            del self.resuming[name]  # it registered (UP), or an admin acted on it
        busy = {n for _, names in self.running for n in names}
        for node in self._ours(NodeState.POWERING_DOWN):
            since = self.suspending.setdefault(node.name, steady)
            queued = any(node.name in names for _, names in self.queued)
            if (node.name not in busy and not queued) or steady - since > self.cfg.suspend_timeout:
                self.suspending.pop(node.name, None)
                self._set(node, NodeState.POWERED_DOWN, "")
                log.info("node %s is powered down", node.name)
        return out

    def _suspend_idle(self, steady: float, pending: Iterable[PendingJob]) -> None:
        if not self.cfg.suspend_program:
            return
        idle = []
        for node in self._ours(NodeState.UP):
            if any(j.holds_alloc for j in self.table.index.on_node(node.name)):
                self.idle_since.pop(node.name, None)
                continue
            since = self.idle_since.setdefault(node.name, steady)
            if steady - since >= self.cfg.suspend_time:
                idle.append(node)
        for name in [n for n in self.idle_since if self.registry.nodes[n].state != NodeState.UP]:
            del self.idle_since[name]
        # An idle node a pending job would fit is kept (its clock starts again): the job waits
        # for more (a reservation that includes this node, a gang's other nodes powering up).
        wanted = self._wanted(idle, pending)
        for node in wanted:
            self.idle_since[node.name] = steady
        idle = [n for n in idle if n not in wanted]
        if not idle:
            return
        for node in idle:
            del self.idle_since[node.name]
            self.suspending[node.name] = steady
            self.registry._keep_slot(node.name)  # (journaled: a rolled-back turn keeps it)
            self.registry.registered.discard(node.name)  # silent from now on, and not DOWN
            self._set(node, NodeState.POWERING_DOWN,
                      f"suspended after {self.cfg.suspend_time:g}s idle")
        self._queue(self.cfg.suspend_program, [n.name for n in idle])

    def _resume(self, steady: float, pending: Iterable[PendingJob]) -> None:
        # A loop turn may take a millisecond: the demand (every pending job) is looked at when
        # a pass has made it anew, else once a RESUME_EVERY_S (for the rate's window, a node's
        # claim released).
        down = self._ours(NodeState.POWERED_DOWN)
        coming = self._ours(NodeState.POWERING_UP)
        if not (down or coming) or (pending is self.seen and steady < self.resume_at):
            return
        self.seen, self.resume_at = pending, steady + RESUME_EVERY_S
        jobs = self.table.jobs
        demand = sorted((v for v in pending if (j := jobs.get(v.id)) is not None
                         and j.state == JobState.PENDING), key=lambda v: (v.submit_time, v.id))
        self.waiting = {}
        if not demand:
            return
        while self.recent and steady - self.recent[0] >= RATE_WINDOW_S:
            self.recent.popleft()
        rate = self.cfg.resume_rate
        limit = None if not rate else max(0, rate - len(self.recent))
        # What is free on UP nodes now comes first: a node that registered this turn (its
        # jobs start in the coming pass), or room freed since the last pass, resumes nothing.
        powering = self._free_up() + [Room.of(n.name, n.gpus, n.cpus, n.mem) for n in coming]
        spare = [Room.of(n.name, n.gpus, n.cpus, n.mem)
                 for n in sorted(down, key=lambda n: (len(n.gpus), natural_key(n.name)))]
        # (Rate spent: jobs are still laid on the nodes coming, for their reasons.)
        names = to_resume(demand, powering, spare if limit != 0 else [], limit or None,
                          self.waiting)
        self._explain_waiting(names)
        if not names:
            return
        for name in names:
            self.resuming[name] = steady
            self.recent.append(steady)
            self._set(self.registry.nodes[name], NodeState.POWERING_UP, "resumed for pending jobs")
        log.info("resuming %s for %d pending jobs", compress(names), len(demand))
        self._queue(self.cfg.resume_program, names)

    def _explain_waiting(self, resumed: list[str]) -> None:
        """The jobs laid on nodes powering up (or resumed now) show it at once, not only from
        the next pass."""
        coming = set(resumed)
        pairs = [(job, why) for job_id in self.waiting
                 if (job := self.table.jobs.get(job_id)) is not None
                 and (why := self.reason(job_id, job.reason, coming)) != job.reason]
        self.table.set_reasons(pairs)

    def reason(self, job_id: int, reason: str, coming: frozenset[str] | set[str] = frozenset()) -> str:
        """A pending job's reason, `Resources` (the pass found no room for it) told as
        `PoweringUp (NODES)` while nodes it was laid on are POWERING_UP (or in `coming`:
        resumed this turn); Slurm's job would be CONFIGURING on them (it allocates powered-down
        nodes; gq starts a job only on nodes that have joined)."""
        names = self.waiting.get(job_id)
        if not names or not (reason.startswith(RESOURCES) or reason.startswith(POWERING_UP)
                             or reason in (NONE, "")):
            return reason
        nodes = self.registry.nodes
        up = [n for n in names if n in coming
              or (n in nodes and nodes[n].state == NodeState.POWERING_UP)]
        if up:
            return f"{POWERING_UP} ({compress(up)})"
        return RESOURCES if reason.startswith(POWERING_UP) else reason

    def explain(self, pairs: list[tuple[Job, str]]) -> list[tuple[Job, str]]:
        """A pass's (job, reason) pairs with `reason` applied."""
        if not self.waiting:
            return pairs
        return [(job, self.reason(job.id, why)) for job, why in pairs]

    def _wanted(self, idle: list[Node], pending: Iterable[PendingJob]) -> list[Node]:
        """The idle nodes one rank of a job still pending would fit."""
        if not idle:
            return []
        jobs = self.table.jobs
        waiting = [v for v in pending if (j := jobs.get(v.id)) is not None
                   and j.state == JobState.PENDING]
        return [n for n in idle
                if any(Room.of(n.name, n.gpus, n.cpus, n.mem).fits(v) is not None
                       for v in waiting)]

    def _free_up(self) -> list[Room]:
        """What the jobs holding UP nodes leave free on them."""
        up = {n.name: Room.of(n.name, n.gpus, n.cpus, n.mem)
              for n in self.registry.nodes.values() if n.state == NodeState.UP}
        for job in self.table.index.placed():
            if job.holds_alloc:
                for name, gpus in job.alloc.items():
                    if (room := up.get(name)) is not None:
                        held = set(gpus)
                        room.gpus = [g for g in room.gpus if g.index not in held]
                        room.cpus -= job.spec.cpus
                        room.mem -= job.spec.mem
        return [room for room in up.values() if room.gpus]

    def _set(self, node: Node, state: NodeState, reason: str) -> None:
        self.registry._keep(node)
        node.state, node.reason = state, reason
        self.registry.store.save_node(node)
        self.table.touch()

    # ------------------------------------------------------------ the programs

    def _queue(self, program: str, names: list[str]) -> None:
        entry = (shlex.split(program) + [compress(names)], names)
        self.queued.append(entry)
        self.table.journal.record(lambda: self.queued.remove(entry) if entry in self.queued
                                  else None)

    def send(self) -> None:
        """Start the queued programs (after the commit); never waited for."""
        self._reap()
        for argv, names in self.queued:
            if len(self.running) >= MAX_RUNNING:
                log.warning("power: %d programs still running, not running %r", MAX_RUNNING,
                            argv)
                continue
            try:
                self.running.append((subprocess.Popen(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True), names))
            except OSError as exc:
                log.warning("power program %r cannot run: %s", argv[0], exc)
        self.queued.clear()

    def _reap(self) -> None:
        for proc, names in list(self.running):
            code = proc.poll()
            if code is not None:
                self.running.remove((proc, names))
                if code:
                    log.warning("power program %r exited %d (nodes %s)", proc.args, code,
                                compress(names))

    def close(self) -> None:
        """At gqd's exit: reap what has ended (the rest run on, detached)."""
        self._reap()
