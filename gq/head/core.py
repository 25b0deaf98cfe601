"""The head: request and node-message dispatch, timers and the scheduling pass, over the parts
that own gqd's state (the job table, jobs.py; the node registry, nodes.py) and those that
answer requests (admission.py, actions.py, listings.py, submits.py).

No sockets here: handlers return reply data; orders for nodes (`outbox`) and replies to parked
clients (`deferred`) wait for the daemon loop to send them once the turn's transaction commits.
A failed request, node message or turn takes memory back with the store (`isolated`, `tx`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from gq import defaults, gcpause, protocol, requests, stepwire
from gq.config import Config
from gq.errors import GqError, PermissionDenied
from gq.head import auth, gate, limits, reasons, telemetry, testonly, tokens
from gq.head.actions import Actions
from gq.head.admission import Admission
from gq.head.auth import Caller
from gq.head.checkpoints import Checkpoints
from gq.head.feed import Feed
from gq.head.index import JobIndex
from gq.head.jobs import JobTable
from gq.head.listings import Listings
from gq.head.nodes import NodeRegistry
from gq.head.orders import Order
from gq.head.partitions import Partitions
from gq.head.power import Power
from gq.head.steps import Steps
from gq.head.submits import Submits
from gq.head.tokens import Tokens
from gq.messages import NodeMessage
from gq.model import Job, Node
from gq.sched import PendingJob, Snapshot, placement, plan
from gq.sched.priority import priority_of
from gq.sched.held import HeldIndex
from gq.sched.queue import QueueIndex
from gq.store import Store

#: Requests that change the queue: refused to callers whose identity the kernel did not prove.
CHANGING_REQUESTS = frozenset({protocol.SUBMIT, protocol.CANCEL, protocol.DRAIN,
                               protocol.RESUME, protocol.HOLD, protocol.RELEASE,
                               protocol.REQUEUE, protocol.UPDATE, protocol.CHECKPOINT})
#: Requests a read-only token may not make.
READ_ONLY_REFUSED = CHANGING_REQUESTS | {protocol.TOKEN_REVOKE}

#: A request's handler: of its typed request (gq/requests.py; the checked map of a type
#: declared only as a schema, srun's), the caller, the client's address and the time.
Handler = Callable[[Any, Caller, Any, float], "dict[str, Any] | None"]


def _monotonic(now: float) -> float:
    return time.monotonic()


class Head:
    def __init__(self, cfg: Config, store: Store, now: float,
                 steady: Callable[[float], float] = _monotonic):
        # Every interval the head measures (node liveness, launch resends, parked waits) is on
        # `steady(now)`, time.monotonic() in gqd, so that a step of the wall clock marks no node
        # DOWN and holds back no resend (issue 13); `now` (wall time) stays what is shown and
        # stored as a date. Tests that drive time by hand pass the identity.
        self.store = store
        #: Orders for nodes, sent once the turn commits.
        self.outbox: list[Order] = []
        #: Replies to clients answered later (waits, big submits), sent after the commit.
        self.deferred: list[tuple[Any, bytes]] = []
        self.table = JobTable(store, cfg, addr_of=lambda name: self.registry.addr(name),
                              steady=steady)
        self.registry = NodeRegistry(store, self.table, cfg)
        #: Power saving: nodes resumed and suspended ([power], gq/head/power.py).
        self.power = Power(cfg, self.registry, self.table)
        #: The partitions, and where each job may run (its allowed nodes).
        self.partitions = Partitions(cfg)
        self.admission = Admission(cfg, self.table, self.registry, lambda: self.partitions)
        self.actions = Actions(cfg, self.table, self.outbox.extend)
        self.listings = Listings(self.table, store, cfg.policy())
        self.submits = Submits(self.table, store, cfg)
        #: Job and node events (gq/events.py) for `events` requests; users' API tokens.
        self.feed = Feed(store, steady)
        self.tokens = Tokens(store)
        #: Job steps (srun); the registry hands them the nodes' step reports.
        self.steps = Steps(self.table, store, self.outbox.extend)
        self.registry.step_report = self.steps.node_report
        #: Jobs' checkpoints; the registry hands them the heartbeats' markers.
        self.checkpoints = Checkpoints(self.table, store)
        self.registry.checkpointed = self.checkpoints.from_node
        #: The earliest `--begin` still ahead: a pass is due then.
        self.wake_at: float | None = None
        #: The views of the jobs the last pass could start (sbatch --test-only's queue).
        self.last_pending: tuple[PendingJob, ...] = ()
        self.configure(cfg)
        self.table.load(now)
        self.checkpoints.load()
        self.registry.load()
        with store.tx():
            if self.power.load():
                self._reshaped()
        self._handlers: dict[str, Handler] = {
            protocol.PING: self._req_ping, protocol.SUBMIT: self._req_submit,
            protocol.CANCEL: self.actions.req_cancel, protocol.UPDATE: self.actions.req_update,
            protocol.HOLD: self.actions.req_hold, protocol.RELEASE: self.actions.req_release,
            protocol.REQUEUE: self.actions.req_requeue, protocol.QUEUE: self.listings.req_queue,
            protocol.SHOW: self.listings.req_show, protocol.HISTORY: self.listings.req_history,
            protocol.ACCOUNTING: self.listings.req_accounting,
            protocol.WAIT: self.listings.req_wait, protocol.NODES: self._req_nodes,
            protocol.DRAIN: self.registry.req_drain, protocol.RESUME: self.registry.req_resume,
            protocol.TEST_SUBMIT: self._req_test_submit,
            protocol.EVENTS: self.feed.request,
            protocol.TOKEN_CREATE: lambda m, c, _, now: self.tokens.create(c, m, now),
            protocol.TOKEN_LIST: lambda m, c, _, now: {"tokens": self.tokens.listing(c, m.all)},
            protocol.TOKEN_REVOKE: lambda m, c, _, now: self.tokens.revoke(c, m.ids),
            stepwire.STEP_LAUNCH: self.steps.req_launch,
            stepwire.STEP_STATUS: self.steps.req_status,
            stepwire.STEP_CANCEL: self.steps.req_cancel,
            protocol.CHECKPOINT: self.checkpoints.request}

    def configure(self, cfg: Config) -> None:
        """Take a (re)loaded config: QOS, weights and admins apply from the next pass."""
        self.cfg = cfg
        self.policy = cfg.policy()
        self.power.configure(cfg)
        self.partitions = Partitions(cfg)
        self.table.views.allowed = lambda spec: self.partitions.allowed(spec, self.registry.nodes)
        self.table.views.policy = self.policy
        self.table.views.reset()
        self.registry.reshaped = self._reshaped
        self.table.mailer.configure(cfg.head.mail_program)
        #: The jobs of the last pass, kept in the orders a pass takes them (under the policy).
        self.queue_index = QueueIndex(self.policy)
        #: The running jobs' bookings, synced each pass (a dict lookup per job while their
        #: views stay the same objects), so a pass need not rebuild them (gq/sched/held.py).
        self.held_index = HeldIndex()
        for part in (self.table, self.registry, self.admission, self.actions, self.submits):
            part.cfg = cfg
        self.listings.policy = self.policy
        self.table.touch()

    @property
    def jobs(self) -> dict[int, Job]:
        return self.table.jobs

    @property
    def index(self) -> JobIndex:
        return self.table.index

    @property
    def nodes(self) -> dict[str, Node]:
        return self.registry.nodes

    @property
    def dirty(self) -> bool:
        """A pass is due: something it reads changed since the last one began."""
        return self.table.dirty

    # ------------------------------------------------------------ transactions

    @contextlib.contextmanager
    def tx(self) -> Iterator[None]:
        """One loop turn's transaction. Committed, what memory did is kept; failed (a full disk,
        say), memory goes back to the last commit with the store, and the turn's orders are
        dropped: nothing is reloaded, and no node loses its registration."""
        mark, sent = self.table.journal.mark(), len(self.outbox)
        try:
            with self.store.tx():
                yield
        except BaseException:
            self.table.rollback(mark)
            del self.outbox[sent:]
            self.tokens.load()  # a token made or revoked in the turn is taken back with it
            raise
        self.table.committed()

    @contextlib.contextmanager
    def isolated(self, name: str) -> Iterator[None]:
        """One request or node message in a savepoint: an unexpected exception (a bug) takes
        back what it did, in the store and in memory, and its orders; it costs that message
        alone. A GqError is a refusal raised after the handler's checks: what it did stays."""
        sent = len(self.outbox)
        try:
            with self.table.isolated(name):
                yield
        except GqError:
            raise
        except BaseException:
            del self.outbox[sent:]
            self.tokens.load()
            raise

    def take_orders(self) -> list[Order]:
        """The turn's orders for nodes, to send now that it committed."""
        orders, self.outbox[:] = list(self.outbox), []
        return orders

    # ------------------------------------------------------------ client requests

    def handle_client(self, msg: dict[str, Any], caller: Caller, client: Any, now: float
                      ) -> dict[str, Any] | None:
        """Reply data for a request, or None when the reply is deferred (wait)."""
        if msg["type"] in CHANGING_REQUESTS and not caller.proven and (
                caller.via or not self.cfg.auth.trust_tcp):
            # A TCP caller's uid is only claimed; acting on it would let any local user submit
            # jobs that run as someone else. Reading stays open, as squeue's is. A node vouches
            # only for the owners of the jobs it holds (trust_tcp does not widen that).
            raise PermissionDenied(
                f"permission denied: {msg['type']} needs a proven identity; "
                + (f"{caller.via} speaks only for users with a job running there" if caller.via
                   else "use the local ipc socket or a login host's relay (TCP callers are "
                   "not authenticated)"))
        if caller.read_only and msg["type"] in READ_ONLY_REFUSED:
            raise PermissionDenied(f"permission denied: {msg['type']} needs a token that is not "
                                   "read-only")
        # Read once, typed; the handler reads its fields.
        data = self._handlers[msg["type"]](requests.read(msg), caller, client, now)
        if data is not None and isinstance(codes := data.get("errors"), tokens.Refusals):
            data["error_codes"] = codes.codes  # each refusal's code, for gq api's HTTP status
        return data

    def token_caller(self, token: object, via: str, now: float) -> Caller:
        """Who a request forwarded by gq api with `token` acts as (Unauthenticated if no one)."""
        found = self.tokens.resolve(token, now)
        return Caller(uid=found.uid, user=found.user, proven=True,
                      admin=auth.is_admin(found.user, found.uid, self.cfg.auth.admins), via=via,
                      read_only=found.read_only)

    def node_holds(self, node: str, uid: int) -> bool:
        """Whether a job of `uid` holds an allocation on `node`: the only users a node's relay
        may speak for (WAVE2 2), so a node's root acts for no one else."""
        return any(job.spec.uid == uid and job.holds_alloc for job in self.index.on_node(node))

    def _req_ping(self, msg: requests.Ping, caller: Caller, client: Any, now: float) -> dict:
        return {"version": defaults.PROTOCOL_VERSION, "user": caller.user, "uid": caller.uid,
                "proven": caller.proven, "pid": os.getpid(), "via": caller.via}

    def _req_submit(self, msg: requests.Submit, caller: Caller, client: Any, now: float
                    ) -> dict | None:
        """All or none; a big one is worked through over several loop turns (submits.py) and
        answered (None here) once committed."""
        intake = self.admission.intake(caller)
        return self.submits.submit(
            msg.rid, client, msg.jobs,
            lambda raw: self.admission.accept_spec(protocol.check_spec(raw), caller, intake), now,
            intake.warnings)

    def _req_nodes(self, msg: requests.Nodes, caller: Caller, client: Any, now: float) -> dict:
        return {**self.registry.req_nodes(msg, caller, client, now),
                "partitions": self.partitions.describe(self.registry.nodes)}

    def _reshaped(self) -> None:
        """A node came or its features changed: jobs' allowed nodes are worked out again."""
        self.partitions.changed()
        self.table.views.reset()

    def _req_test_submit(self, msg: requests.TestSubmit, caller: Caller, client: Any, now: float
                         ) -> dict:
        """sbatch --test-only: the job checked as a submit's, then when and where it would
        start (gq/head/testonly.py); nothing is kept."""
        intake = self.admission.intake(caller)
        spec = self.admission.accept_spec(protocol.check_spec(msg.job), caller, intake)
        return {**testonly.estimate(self.table, self.registry.nodes.values(), self.last_pending,
                                    self.policy, spec, now),
                "warnings": list(dict.fromkeys(intake.warnings))}

    # ------------------------------------------------------------ nodes and timers

    def handle_node(self, name: str, msg: NodeMessage, now: float) -> None:
        self.outbox.extend(self.registry.handle(name, msg, now))

    def tick(self, now: float) -> None:
        """Timers: node timeouts, unconfirmed launches, --begin times, parked waits."""
        self.outbox.extend(self.registry.tick(now))
        self.outbox.extend(self.power.tick(now, self.last_pending))
        self.outbox.extend(self.table.resend_due(now))
        if self.steps.live:
            self.steps.sweep(now)
            self.outbox.extend(self.steps.resend_due(now))
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at = None
            self.table.touch()
        self.deferred.extend(self.listings.answer_parked(now))
        self.feed.prune(now, self.cfg.head.events_keep_s, self.cfg.head.events_keep_rows)

    # ------------------------------------------------------------ the pass

    def schedule(self, now: float) -> None:
        """One pass of the pure scheduler; its starts are persisted here and launched after commit."""
        # A pass makes tens of thousands of short-lived objects (keys, views, lists), which set
        # off many collections, each walking the head's long-lived ones (every job): a fifth of
        # a pass on a 10,000-job queue. What a pass drops is freed by reference counting; the
        # rare cycle waits for the next collection after it.
        with gcpause.paused():
            self._pass(now)

    def reset_pass_caches(self) -> None:
        """After a pass that raised (gq/head/passguard.py): what passes keep from one to the
        next is made again from the jobs and nodes, as a half-done sync may have left it
        inconsistent with them."""
        self.queue_index = QueueIndex(self.policy)
        self.held_index = HeldIndex()
        self.table.views.clear()
        self.table.touch()

    def _pass(self, now: float) -> None:
        table = self.table
        table.dirty = False
        # Held jobs are screened once after their hold (their reason changes with it only).
        screen = gate.screen([*table.index.ready(), *table.take_fresh()], now, table.parent,
                             table.index.live())
        self.wake_at = screen.wake_at
        eligible, held = limits.screen(screen.eligible, table.index.placed(), self.cfg.qos)
        table.set_reasons([*screen.waiting, *((j, limits.QOS_LIMIT) for j in held)])
        for job in screen.invalid:  # --kill-on-invalid-dep
            self.outbox.extend(table.cancel(job, now))
            table.set_reason(job, gate.NEVER)
        pending = table.views.of_pending(eligible, now)
        self.last_pending = pending
        if not pending:
            table.planned({})
            return
        usage = table.usage.at(now)
        self.queue_index.sync(pending)
        rule = telemetry.Rule.of(self.cfg)
        nodes = table.node_views(self.registry.nodes.values(),
                                 lambda node, held: rule.limits(node, now, held))
        # Once a node's telemetry is stale, what it rules out no longer counts: pass again then.
        self.wake_at = min([*(rule.stale_at(self.registry.nodes[v.name]) for v in nodes
                              if placement.telemetry_limited(v)),
                            *(() if self.wake_at is None else (self.wake_at,))], default=None)
        running = table.running_views()
        self.held_index.sync(running)
        result = plan(Snapshot(nodes=nodes, pending=pending, running=running, usage=usage,
                               queue=self.queue_index, held=self.held_index), now, self.policy)
        # A job waiting for a warm GPU (--cold-wait) takes a cold one once its wait is over.
        cold_at = min((v.cold_wait_until for v in pending if v.cold_wait_until > now),
                      default=None)
        if cold_at is not None:
            self.wake_at = cold_at if self.wake_at is None else min(self.wake_at, cold_at)
        table.planned(result.reservations)
        for preempt in result.preemptions:
            self.outbox.extend(table.preempt(table.jobs[preempt.victim], preempt.for_job))
        # Every job that did not start gets the pass's reason for it, written out.
        table.set_reasons(self.power.explain(reasons.planned(eligible, pending, result, nodes)))
        # A pending job's priority is worked out when shown (JobTable.shown); a running one
        # shows the priority it started with.
        rank = priority_of(now, self.policy, usage)
        for start in result.starts:
            job = table.jobs[start.job_id]
            self.outbox.extend(table.start(job, start.alloc, rank(table.view(job)), now))
