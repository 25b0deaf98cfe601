"""The head's state machine: jobs and nodes in memory, written through to the store.

No sockets here: handlers return reply data, and messages for nodes or parked clients are queued
in `outbox_nodes` / `deferred` for the daemon loop to send after the transaction commits.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gq import defaults, gcpause, protocol
from gq import spec as spec_fields
from gq.arrays import parse_ref, split_ref
from gq.config import Config
from gq.deps import ParentState, parse_dependency
from gq.errors import NotFoundError, PermissionDenied, ProtocolError, RefusedError, UsageError
from gq.head import auth, gate, limits
from gq.head.auth import Caller
from gq.head.feed import Feed
from gq.head import tokens
from gq.head.tokens import Tokens
from gq.head.index import JobIndex
from gq.head.submits import Submits
from gq.model import (JOB_FIELDS, Gpu, Job, JobSpec, JobState, Node, NodeState, format_duration,
                      format_size, iso_time, job_record, parse_signal)
from gq.head.usage import Usage
from gq.sched import NodeView, PendingJob, Reservation, RunningJob, Snapshot, placement, plan
from gq.sched.priority import factors, priority_of
from gq.sched.queue import QueueIndex
from gq.store import Store

log = logging.getLogger("gq.head")

#: A launch not confirmed by a `started` report in this many seconds is sent again.
LAUNCH_RESEND_S = 5.0
#: Finished jobs stay visible in `gq queue --all` this long, in seconds (Slurm's MinJobAge).
RECENT_S = 300.0
#: A page of a listing holds records of at most this many bytes (msgpack), half the message
#: limit: the rest of the reply always fits.
PAGE_BYTES = defaults.MAX_MESSAGE_BYTES // 2
#: Most jobs one `history` reply holds when the client asks for no page (older clients).
HISTORY_MAX = 100_000
#: `reason` of a running job being preempted; it is requeued (or ends PREEMPTED) once stopped.
PREEMPTED = "Preempted"
#: `reason` of a running job that `gq requeue` is stopping; it is requeued once stopped.
REQUEUED = "Requeued"
#: Reasons of a running job on its way back to the queue.
STOPPING = frozenset({PREEMPTED, REQUEUED})
#: Requests that change the queue: refused to callers whose identity the kernel did not prove.
CHANGING_REQUESTS = frozenset({protocol.SUBMIT, protocol.CANCEL, protocol.DRAIN,
                               protocol.RESUME, protocol.HOLD, protocol.RELEASE,
                               protocol.REQUEUE, protocol.UPDATE})
#: Requests a read-only token may not make.
READ_ONLY_REFUSED = CHANGING_REQUESTS | {protocol.TOKEN_REVOKE}
#: A node's health problems shown in its drain reason: at most this many, this long each.
MAX_HEALTH_PROBLEMS = 4
MAX_HEALTH_TEXT = 200
#: Drain reason of a node whose state disk is full (its heartbeat's `disk` follows): gqd lifts
#: this drain, and no other, by itself once the node has room again.
DISK_FULL = "node state disk full: "


@dataclass
class Parked:
    """A client `wait` request answered later."""

    client: Any
    rid: int
    ids: list[int]
    #: On the steady clock (Head.steady).
    deadline: float


@dataclass
class _Intake:
    """What every spec of one submit request shares, worked out once per request."""

    #: The nodes as the scheduler sees them (a scan of the live jobs).
    views: tuple[NodeView, ...]
    #: The caller's primary group; None when the passwd database does not know the caller.
    gid: int | None
    #: Shapes (nodes, GPUs, GPU type, VRAM) some node could hold: checked once each.
    fits: set[tuple[Any, ...]] = field(default_factory=set)


@dataclass
class Launch:
    """Bookkeeping for a job run the head has sent out: which nodes still hold it."""

    #: On the steady clock (Head.steady).
    sent_at: float
    confirmed: set[str] = field(default_factory=set)
    holding: set[str] = field(default_factory=set)
    #: Per rank node -> (state, exit code) once it reported finished.
    results: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    #: What the run used on the nodes that reported it: the most memory of any, CPU seconds
    #: of all (None: no node said).
    max_rss: int | None = None
    cpu_s: float | None = None

    def add_usage(self, msg: dict[str, Any]) -> None:
        rss, cpu = msg.get("max_rss"), msg.get("cpu_s")
        if rss is not None:
            self.max_rss = max(self.max_rss or 0, rss)
        if cpu is not None and cpu >= 0:
            self.cpu_s = (self.cpu_s or 0.0) + cpu


def _monotonic(now: float) -> float:
    return time.monotonic()


class Head:
    def __init__(self, cfg: Config, store: Store, now: float,
                 steady: Callable[[float], float] = _monotonic):
        # Issue 13 (monotonic clocks): every interval the head measures (node liveness, launch
        # resends, parked waits) is on `steady(now)`, time.monotonic() in gqd, so that a step of
        # the wall clock marks no node DOWN and holds back no resend; `now` (wall time) stays
        # what is shown and stored as a date. Tests that drive time by hand pass the identity.
        self.steady = steady
        self.store = store
        self.configure(cfg)
        self.outbox_nodes: list[tuple[str, bytes]] = []
        self.deferred: list[tuple[Any, bytes]] = []
        self.parked: list[Parked] = []
        self.dirty = True
        self.submits = Submits(self)
        self.feed = Feed(store, steady)
        self.tokens = Tokens(store)
        #: Requests handled by the head's parts (events, tokens) rather than a `_req_` method.
        self.handlers: dict[str, Callable[..., dict[str, Any] | None]] = {
            protocol.EVENTS: self.feed.request,
            protocol.TOKEN_CREATE: lambda m, c, _, now: self.tokens.create(c, m, now),
            protocol.TOKEN_LIST: lambda m, c, _, now: {
                "tokens": self.tokens.listing(c, bool(m.get("all")))},
            protocol.TOKEN_REVOKE: lambda m, c, _, now: self.tokens.revoke(c, m["ids"])}
        self.load(now)

    def configure(self, cfg: Config) -> None:
        """Take a (re)loaded config: QOS, weights and admins apply from the next pass."""
        self.cfg = cfg
        self.policy = cfg.policy()
        #: The jobs of the last pass, kept in the orders a pass takes them (under the policy).
        self.queue_index = QueueIndex(self.policy)
        self.dirty = True

    def load(self, now: float) -> None:
        """(Re)build memory from the store: at start, and after a failed commit."""
        self.jobs: dict[int, Job] = {}
        #: Array job id -> task index -> job id, for the arrays' tasks in `jobs`.
        self.arrays: dict[int, dict[int, int]] = {}
        self.queued = limits.Queued()
        #: Job id -> (the spec it was made from, the scheduler's view of the pending job).
        self.views: dict[int, tuple[JobSpec, PendingJob]] = {}
        #: Job id -> (its spec, alloc, (start time, ending) and the scheduler's view of it
        #: holding GPUs, made from them).
        self.running_views: dict[int, tuple[JobSpec, dict, tuple[Any, ...], RunningJob]] = {}
        #: Node name -> (its GPU list, what else its view was made from, the view).
        self.node_views: dict[str, tuple[list[Gpu], tuple[Any, ...], NodeView]] = {}
        self.index = JobIndex()
        for job in self.store.live_jobs():
            self._track(job)
        #: Parents of dependencies that have ended, as the store has them (read once each).
        self.ended: dict[int, ParentState] = {}
        #: The earliest `--begin` still ahead: a pass is due then.
        self.wake_at: float | None = None
        self.nodes: dict[str, Node] = {}
        for node in self.store.load_nodes():
            # Until it registers again we know nothing about a node; drains are kept.
            if node.state != NodeState.DRAIN:
                node.state, node.reason = NodeState.DOWN, "not registered since gqd started"
            self.nodes[node.name] = node
        self.registered: set[str] = set()
        #: Node name -> when it was last heard from (steady clock): its liveness.
        self.heard: dict[str, float] = {}
        self.reservations: dict[int, Reservation] = {}
        self.usage = Usage(self.cfg.scheduler.fairshare_half_life_s)
        for job in self.store.finished_jobs(since=now - 4 * self.usage.half_life_s, limit=100_000):
            self.usage.charge(job, job.end_time or now)
        self.launches: dict[int, Launch] = {}
        #: Heap of (sent_at, job id): when each launch was sent, for resending unconfirmed
        #: ones (an entry whose launch was sent again since, or is gone, is skipped).
        self.resends: list[tuple[float, int]] = []
        for job in self.index.placed():
            if job.holds_alloc:
                self.launches[job.id] = Launch(sent_at=0.0, holding=set(job.alloc))
                self._remind(job.id)
        self.outbox_nodes.clear()
        self.dirty = True
        self.submits.reloaded()
        self.tokens.load()

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
        handler = self.handlers.get(msg["type"]) or getattr(self, f"_req_{msg['type']}")
        data = handler(msg, caller, client, now)
        if data is not None and isinstance(data.get("errors"), _Errors):
            data["error_codes"] = data["errors"].codes  # each refusal's code, for gq api
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

    def _req_ping(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        return {"version": defaults.PROTOCOL_VERSION, "user": caller.user, "uid": caller.uid,
                "proven": caller.proven, "pid": os.getpid(), "via": caller.via}

    def _req_submit(self, msg: dict[str, Any], caller: Caller, client: Any, now: float
                    ) -> dict | None:
        """All or none; a big one is worked through over several loop turns (submits.py) and
        answered (None here) once committed."""
        intake = _Intake(views=self._node_views(), gid=_primary_gid(caller.uid))
        return self.submits.submit(
            msg["rid"], client, msg["jobs"],
            lambda raw: self._accept_spec(protocol.check_spec(raw), caller, intake), now)

    def _track(self, job: Job) -> None:
        self.jobs[job.id] = job
        self.index.add(job)
        self.queued.add(job)
        if job.array_job_id is not None:
            self.arrays.setdefault(job.array_job_id, {})[job.array_index or 0] = job.id

    def _untrack(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        self.index.drop(job)
        self.views.pop(job.id, None)
        self.running_views.pop(job.id, None)
        self.queued.remove(job)
        tasks = self.arrays.get(job.array_job_id) if job.array_job_id is not None else None
        if tasks is not None:
            tasks.pop(job.array_index or 0, None)
            if not tasks:
                del self.arrays[job.array_job_id]

    def _save(self, job: Job, *fields: str) -> None:
        """Write a changed job through to the store (only `fields`, or all of it) and file it
        anew in the index: every change to a job in memory goes through here."""
        self.store.update_job(job, *fields)
        self.index.update(job)

    def _accept_spec(self, raw: dict[str, Any], caller: Caller, intake: _Intake) -> JobSpec:
        """Check what a spec means (gq.spec.check, as the CLI did, after filling in gqd's
        defaults; then what needs gqd's config and state) and bind it to the caller."""
        if caller.uid == 0 and not self.cfg.auth.allow_root_jobs:
            raise PermissionDenied("permission denied: jobs of root are refused on this cluster "
                                   "([auth] allow_root_jobs = false); submit as a user")
        values = spec_fields.complete(raw)
        values["uid"], values["user"] = caller.uid, caller.user
        if (caller.proven or values["gid"] < 0) and intake.gid is not None:
            values["gid"] = intake.gid
        values["qos"] = values["qos"] or defaults.DEFAULT_QOS
        qos = self.cfg.qos.get(values["qos"])
        if qos is None:
            raise RefusedError(f"unknown QOS {values['qos']!r}; known: "
                               f"{', '.join(sorted(self.cfg.qos))}")
        if values["time_limit_s"] is None:
            values["time_limit_s"] = qos.default_time_s
        if values["retries"] is None:
            values["retries"] = self.cfg.head.default_retries if values["requeue"] else 0
        spec = JobSpec.from_dict(spec_fields.check(values))
        limit = spec.time_limit_s or 0
        if qos.max_time_s and not 0 < limit <= qos.max_time_s:
            # 0 is UNLIMITED, which a capped QOS cannot grant either.
            raise RefusedError(f"time limit {format_duration(limit)} is over the "
                               f"{spec.qos!r} QOS maximum of {format_duration(qos.max_time_s)}")
        if spec.dependency is not None:
            for parent in sorted(parse_dependency(spec.dependency).parents):
                if parent not in self.jobs and self.store.get_job(parent) is None:
                    # As sbatch: a dependency on a job nobody knows is refused, not kept waiting.
                    raise RefusedError(f"job dependency problem: job {parent} does not exist")
        self._check_satisfiable(spec, intake)
        return spec

    def _check_satisfiable(self, spec: JobSpec, intake: _Intake) -> None:
        """Refuse a job no known node could ever hold, saying why (as sbatch does)."""
        if not self.nodes:
            return  # nothing registered yet (a fresh head): the job waits for nodes instead
        shape = (spec.nodes, spec.gpus, spec.gpu_type, spec.gpu_mem)
        if shape in intake.fits:
            return
        view = _pending_view(Job(id=0, spec=spec))
        hosts = [n for n in intake.views if placement.could_ever_fit(n.gpus, view)]
        if len(hosts) >= spec.nodes:
            intake.fits.add(shape)
            return
        want = f"{spec.gpus} GPU(s)" + (f" of type {spec.gpu_type}" if spec.gpu_type else "") \
            + (f" with at least {format_size(spec.gpu_mem)} each" if spec.gpu_mem else "")
        have = sorted({f"{len(n.gpus)}x{'/'.join(sorted({g.type for g in n.gpus}) or ['none'])}"
                       for n in self.nodes.values()})
        raise RefusedError(f"no node can ever run this job: it asks for {want} on each of "
                           f"{spec.nodes} node(s); {len(hosts)} node(s) could "
                           f"(nodes have: {', '.join(have)})")

    def _req_cancel(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        if msg.get("signal"):
            sig = parse_signal(msg["signal"])  # a bad name is the caller's usage error
            batch = bool(msg.get("batch_only")) or sig.batch_only  # -b, or B:USR1
            done, errors = self._act(msg["ids"], caller, lambda job: self._signal(job, sig.name,
                                                                                   batch))
        else:
            done, errors = self._act(msg["ids"], caller, lambda job: self.cancel(job, now))
        return {"cancelled": done, "errors": errors}

    def _req_update(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        changes = {k: msg[k] for k in ("time_limit_s", "qos", "name") if k in msg}
        if not changes:
            raise UsageError("nothing to update: give --time, --qos or --name")
        if "name" in changes and not changes["name"].strip():
            raise UsageError("a job's name cannot be empty")
        done, errors = self._act(msg["ids"], caller,
                                 lambda job: self._update(job, caller, changes))
        return {"done": done, "errors": errors}

    def _req_hold(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        done, errors = self._act(msg["ids"], caller, lambda job: self._hold(job, caller))
        return {"done": done, "errors": errors}

    def _req_release(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        done, errors = self._act(msg["ids"], caller, lambda job: self._unhold(job, caller))
        return {"done": done, "errors": errors}

    def _req_requeue(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        done, errors = self._act(msg["ids"], caller, self.requeue)
        return {"done": done, "errors": errors}

    def _act(self, refs: list[Any], caller: Caller, action: Any
             ) -> tuple[list[Any], dict[str, str]]:
        """Apply `action` to each job named, and to every live task of an array named by its id
        (tasks it cannot apply to, such as running ones for a hold, are skipped unless all are).
        A job the caller may not touch, or that `action` refuses, is an entry in the errors."""
        done, errors = [], _Errors()
        for raw in refs:
            try:
                jobs = [self._owned(job, caller) for job in self._expand(_ref(raw))]
                refused = []
                for job in jobs:
                    try:
                        action(job)
                    except RefusedError as exc:
                        refused.append(exc)
                if len(refused) == len(jobs):
                    raise refused[0]
                done.append(raw)
            except RefusedError as exc:
                errors[str(raw)] = str(exc)
                errors.codes[str(raw)] = exc.code
        return done, errors

    def _owned(self, job: Job, caller: Caller) -> Job:
        if not caller.admin and job.spec.uid != caller.uid:
            raise PermissionDenied(f"permission denied: job {job.ref} belongs to {job.spec.user}")
        return job

    def _expand(self, ref: int | str) -> list[Job]:
        """The jobs a reference names: an array's live tasks for its id, else the one job."""
        if isinstance(ref, int) and ref in self.arrays:
            return [self.jobs[i] for _, i in sorted(self.arrays[ref].items())]
        return [self.lookup(ref)]

    def lookup(self, ref: int | str) -> Job:
        """The job `123` or the array task `123_7`."""
        if isinstance(ref, int):
            return self.find(ref)
        array_id, index = split_ref(ref)
        job_id = self.arrays.get(array_id, {}).get(index)
        job = self.jobs[job_id] if job_id is not None else self.store.array_task(array_id, index)
        if job is None:
            raise NotFoundError(f"job {ref} does not exist")
        return job

    def find(self, job_id: int) -> Job:
        job = self.jobs.get(job_id) or self.store.get_job(job_id)
        if job is None:
            raise NotFoundError(f"job {job_id} does not exist")
        return job

    def _hold(self, job: Job, caller: Caller) -> None:
        """Slurm's hold: a pending job is not scheduled until released. An admin's hold on
        someone else's job (JobHeldAdmin) only an admin can release."""
        if job.state != JobState.PENDING:
            raise RefusedError(f"job {job.ref} is not pending ({job.state.value}): only "
                               "pending jobs can be held")
        job.hold = "admin" if caller.admin and job.spec.uid != caller.uid else "user"
        job.reason = gate.HELD[job.hold]
        self._save(job, "hold", "reason")
        self.reservations.pop(job.id, None)
        self.dirty = True

    def _unhold(self, job: Job, caller: Caller) -> None:
        if not job.hold or job.state != JobState.PENDING:
            raise RefusedError(f"job {job.ref} is not held")
        if job.hold == "admin" and not caller.admin:
            raise PermissionDenied(f"permission denied: job {job.ref} was held by an "
                                   "administrator; only an administrator can release it")
        job.hold, job.reason = "", "None"
        self._save(job, "hold", "reason")
        self.dirty = True

    def requeue(self, job: Job) -> None:
        """Slurm's requeue: a running job is stopped (SIGTERM, then SIGKILL after the grace time)
        and goes back to the queue as its next run; an ended one goes back at once."""
        if not job.spec.requeue:
            raise RefusedError(f"job {job.ref} was submitted with --no-requeue")
        if job.state == JobState.PENDING:
            raise RefusedError(f"job {job.ref} is pending: it has not run yet")
        if job.state == JobState.RUNNING:
            if job.reason not in STOPPING:
                job.reason = REQUEUED
                self._save(job, "reason")
                self._send_kill(job.alloc, job.id, job.restart_count, "TERM")
            return
        if job.holds_alloc:
            raise RefusedError(f"job {job.ref} is still stopping on its node(s); try again")
        job.state, job.reason, job.alloc, job.start_time = JobState.PENDING, "None", {}, None
        job.end_time = job.exit_code = None
        job.restart_count += 1
        job.node_fail_count = 0  # a person chose to run it again: its --retries start afresh
        self._save(job)
        self.ended.pop(job.id, None)
        self._track(job)
        self.dirty = True

    def _update(self, job: Job, caller: Caller, changes: dict[str, Any]) -> None:
        """scontrol update: a pending job's time limit, QOS and name (a running job's name only).
        Its owner may only lower the time limit and move to a QOS of no higher priority; an
        admin may do anything within the QOS's max_time."""
        if job.state.terminal:
            raise RefusedError(f"job {job.ref} has already finished ({job.state.value})")
        if job.state != JobState.PENDING and set(changes) != {"name"}:
            raise RefusedError(f"job {job.ref} is {job.state.value}: only a pending job's time "
                               "limit and QOS can be changed (a running job's name can)")
        old = job.spec
        qos_name = changes.get("qos", old.qos) or defaults.DEFAULT_QOS
        # A new spec (JobSpec is frozen; an array's tasks share one).
        new = dataclasses.replace(old, **{**changes, "qos": qos_name})
        qos = self.cfg.qos.get(qos_name)
        if new.qos != old.qos:
            if qos is None:
                raise RefusedError(f"unknown QOS {new.qos!r}; known: "
                                   f"{', '.join(sorted(self.cfg.qos))}")
            was = self.cfg.qos.get(old.qos or defaults.DEFAULT_QOS)
            if not caller.admin and was is not None and qos.priority > was.priority:
                raise PermissionDenied(
                    f"permission denied: QOS {new.qos!r} has a higher priority than "
                    f"{old.qos!r}; only an administrator can move job {job.ref} there")
        if new.time_limit_s != old.time_limit_s:
            if not caller.admin and (new.time_limit_s or math.inf) > (old.time_limit_s or math.inf):
                raise PermissionDenied(
                    f"permission denied: only an administrator can raise a time limit (job "
                    f"{job.ref} has {format_duration(old.time_limit_s or 0)}, asked for "
                    f"{format_duration(new.time_limit_s or 0)})")
        if qos is not None and qos.max_time_s and not 0 < (new.time_limit_s or 0) <= qos.max_time_s:
            raise RefusedError(f"time limit {format_duration(new.time_limit_s or 0)} is over the "
                               f"{new.qos!r} QOS maximum of {format_duration(qos.max_time_s)}")
        if new.qos != old.qos:
            self.queued.remove(job)  # counted again under its new QOS
            try:
                limits.check_submit(self.cfg, self.queued, [dataclasses.replace(new, array=None)])
            except RefusedError:
                self.queued.add(job)
                raise
        job.spec = new
        self.queued.add(job)  # under its new QOS (a no-op when that did not change)
        self._save(job, "time_limit_s", "qos", "name")
        self.reservations.pop(job.id, None)
        self.dirty = True

    def _signal(self, job: Job, name: str, batch_only: bool) -> None:
        """scancel --signal: the signal to a running job's processes (or only its script), which
        it is not ended by (unless the job dies of it)."""
        if job.state != JobState.RUNNING:
            raise RefusedError(f"job {job.ref} is not running ({job.state.value}): only a "
                               "running job can be signalled")
        if job.reason in STOPPING:
            # Its stop order must not be overwritten by a signal-only one.
            raise RefusedError(f"job {job.ref} is being stopped ({job.reason})")
        self._send_kill(job.alloc, job.id, job.restart_count, name, batch_only=batch_only,
                        no_kill=True)

    def cancel(self, job: Job, now: float) -> None:
        if job.state.terminal:
            raise RefusedError(f"job {job.ref} has already finished ({job.state.value})")
        was_running = job.state == JobState.RUNNING
        self._finish(job, JobState.CANCELLED, now, exit_code=None)
        if was_running:
            self._send_kill(job.alloc, job.id, job.restart_count, "TERM")

    def _req_queue(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        """Live jobs (and with `all`, or states past running, those ended in the last
        RECENT_S), oldest first: all of them, or with `limit` a page of those after `after`."""
        states = set(msg.get("states") or [])
        after = msg.get("after", 0)
        msg = {**msg, "user": tokens.listed_user(msg.get("user"), caller)}
        live = self.jobs
        jobs: Iterable[Job] = (live[i] for i in _ids_after(live, after)
                               if not live[i].state.terminal)
        if msg.get("all") or states - {"PENDING", "RUNNING"}:
            recent = {j.id: j for j in self.store.finished_jobs(since=now - RECENT_S)
                      if j.id > after}  # the store's record wins, as it is the later one
            jobs = heapq.merge((j for j in jobs if j.id not in recent), recent.values(),
                               key=lambda j: j.id)
        if user := msg.get("user"):
            jobs = (j for j in jobs if j.spec.user == user)
        if states:
            jobs = (j for j in jobs if j.state.value in states)
        fields = _fields(msg)
        if fields is None or "priority" in fields:
            jobs = self._shown(jobs, now)
        record = job_record(None if fields is None else tuple(fields))
        if not msg.get("start"):
            return _paged(jobs, record, msg.get("limit"))

        def with_start(job: Job) -> dict[str, Any]:
            # squeue --start: the scheduler's reservations of pending jobs
            data = record(job)
            if job.state == JobState.PENDING:
                data.update(self._expected(job))
            return data
        return _paged(jobs, with_start, msg.get("limit"))

    def _shown(self, jobs: Iterable[Job], now: float) -> Iterator[Job]:
        """`jobs`, each pending one given its priority at `now` as it goes by. A priority is a
        function of the job, the time and usage: worked out when shown, not by every pass for
        every queued job."""
        rank = None
        for job in jobs:
            if job.state == JobState.PENDING:
                if rank is None:
                    rank = priority_of(now, self.policy, self.usage.at(now))
                job.priority = rank(self._view(job))
            yield job

    def _expected(self, job: Job) -> dict[str, Any]:
        """When and where the last pass expects a pending job to start (None: no reservation)."""
        res = self.reservations.get(job.id)
        return {"expected_start": iso_time(res.start) if res else None,
                "expected_nodes": list(res.alloc) if res else None}

    def _req_show(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        [job] = self._shown([tokens.readable(self.lookup(_ref(msg["id"])), caller)], now)
        data = job.to_json()
        data.update(command=job.spec.args, script_lines=job.spec.script.count("\n") + 1,
                    cpus=job.spec.cpus, mem=job.spec.mem, gpu_mem=job.spec.gpu_mem,
                    **self._run_stats([job])(job))
        if job.state == JobState.PENDING:
            usage = self.usage.at(now)
            data["priority_factors"] = factors(_pending_view(job), now, self.policy, usage,
                                               sum(usage.values()), len(usage))
        if job.id in self.reservations:
            data.update(self._expected(job))
        return {"job": data}

    def _req_history(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        """Jobs of the store in sacct's window, by id: up to HISTORY_MAX of them, or with
        `limit` a page of those after `after`."""
        limit = msg.get("limit")
        jobs = self.store.history(msg["since"], msg["until"], msg.get("user"), msg.get("states"),
                                  after=msg.get("after", 0),
                                  limit=HISTORY_MAX if limit is None else limit + 1)
        record, stats = job_record(), self._run_stats(jobs)
        return _paged(jobs, lambda j: {**record(j), **stats(j)}, limit)

    def _run_stats(self, jobs: list[Job]) -> Callable[[Job], dict[str, Any]]:
        """Each job's latest run's peak memory and CPU time (None while it runs or unknown)."""
        known = self.store.run_stats((j.id, j.restart_count) for j in jobs
                                     if j.state.terminal)
        return lambda j: known.get(j.id, _NO_STATS)

    def _req_accounting(self, msg: dict[str, Any], caller: Caller, client: Any, now: float
                        ) -> dict:
        """GPU-seconds inside [since, until] by user, account, QOS and how the run ended
        (RUNNING for runs still going, counted up to now)."""
        since, until = msg["since"], min(msg["until"], now)
        rows = [{"user": u, "account": a, "qos": q, "state": st, "gpu_seconds": sec}
                for u, a, q, st, sec in self.store.run_usage(since, until)]
        for job_id in self.launches:
            job = self.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING or job.start_time is None:
                continue
            seconds = job.spec.gpus * job.spec.nodes * (until - max(since, job.start_time))
            if seconds > 0:
                rows.append({"user": job.spec.user, "account": job.spec.account or "",
                             "qos": job.spec.qos or "", "state": JobState.RUNNING.value,
                             "gpu_seconds": seconds})
        return {"rows": rows}

    def _req_nodes(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        holders: dict[tuple[str, int], int] = {}
        for job in self.index.placed():
            if job.holds_alloc:
                for node, gpus in job.alloc.items():
                    holders.update({(node, g): job.id for g in gpus})
        out = []
        for node in sorted(self.nodes.values(), key=lambda n: n.name):
            data = node.to_json()
            for gpu in data["gpus"]:
                gpu["job"] = holders.get((node.name, gpu["index"]))
            out.append(data)
        return {"nodes": out}

    def _req_drain(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        """Take nodes out of scheduling; running jobs carry on (Slurm's DRAIN)."""
        nodes = self._admin_nodes(msg, caller)
        if not msg["reason"].strip():
            raise UsageError("a drain needs a reason (--reason)")
        if msg["reason"].startswith(DISK_FULL):  # so that no admin's drain is ever lifted
            raise UsageError(f"drain reasons starting {DISK_FULL.strip()!r} are gqnode's own")
        for node in nodes:
            self._drain(node, msg["reason"])
        return {"nodes": [n.name for n in nodes]}

    def _drain(self, node: Node, reason: str) -> None:
        # A DOWN node stays DOWN with the reason; drain_reason brings it back drained.
        if node.state != NodeState.DOWN:
            node.state = NodeState.DRAIN
        node.reason = node.drain_reason = reason
        self.store.save_node(node)

    def _req_resume(self, msg: dict[str, Any], caller: Caller, client: Any, now: float) -> dict:
        nodes = self._admin_nodes(msg, caller)
        for node in nodes:
            if node.state == NodeState.DRAIN:
                node.state = NodeState.UP
            node.reason = "" if node.state == NodeState.UP else node.reason
            node.drain_reason = ""
            self.store.save_node(node)
        self.dirty = True
        return {"nodes": [n.name for n in nodes]}

    def _admin_nodes(self, msg: dict[str, Any], caller: Caller) -> list[Node]:
        if not caller.admin:
            raise PermissionDenied(f"permission denied: only admins manage nodes "
                                   f"({caller.user} is not in [auth] admins)")
        names = msg["nodes"]
        if not all(isinstance(n, str) for n in names):
            raise ProtocolError("nodes must be names")
        unknown = [n for n in names if n not in self.nodes]
        if unknown:
            raise NotFoundError(f"no such node: {', '.join(unknown)}")
        return [self.nodes[n] for n in names]

    def _req_wait(self, msg: dict[str, Any], caller: Caller, client: Any, now: float
                  ) -> dict | None:
        # An array's id waits for all its tasks.
        jobs = [job for raw in msg["ids"] for job in self._expand(_ref(raw))]
        ids = [job.id for job in jobs]
        if all(j.state.terminal for j in jobs):
            return {"done": True, "jobs": [j.to_json() for j in self._shown(jobs, now)]}
        timeout = min(float(msg.get("park_s", defaults.WAIT_POLL_S)), 300.0)
        self.parked.append(Parked(client=client, rid=msg["rid"], ids=ids,
                                  deadline=self.steady(now) + timeout))
        return None

    def _answer_parked(self, now: float) -> None:
        keep = []
        steady = self.steady(now)
        for p in self.parked:
            jobs = [self.jobs.get(i) or self.store.get_job(i) for i in p.ids]
            done = all(j is None or j.state.terminal for j in jobs)
            if done or steady >= p.deadline:
                self.deferred.append((p.client, protocol.ok(
                    p.rid, done=done,
                    jobs=[j.to_json() for j in self._shown(filter(None, jobs), now)])))
            else:
                keep.append(p)
        self.parked = keep

    # ------------------------------------------------------------ nodes

    def handle_node(self, name: str, msg: dict[str, Any], now: float) -> None:
        if msg["node"] != name:
            raise ProtocolError(f"node {name!r} sent a message signed {msg['node']!r}")
        kind = msg["type"]
        if kind == protocol.REGISTER:
            self._register(name, msg, now)
            return
        if name not in self.registered:
            # A head restart forgot this node's connection: ask it to register again.
            self.outbox_nodes.append((name, protocol.encode(protocol.REREGISTER)))
            return
        node = self.nodes[name]
        node.last_seen = now  # shown; liveness is `heard`
        self.heard[name] = self.steady(now)
        if node.state == NodeState.DOWN:
            node.state, node.reason = NodeState.UP, ""
            self.store.save_node(node)
            self.dirty = True
        if kind == protocol.HEARTBEAT:
            node.telemetry = {int(k): v for k, v in msg.get("telemetry", {}).items()
                              if str(k).isdigit() and isinstance(v, dict)}
            self._check_health(node, msg.get("health") or [], now)
            self._check_disk(node, msg.get("disk") or "")
        elif kind == protocol.REPORT:
            self._report(node, msg, now)
            self.outbox_nodes.append((name, protocol.encode(protocol.ACK, seq=msg["seq"])))

    def _register(self, name: str, msg: dict[str, Any], now: float) -> None:
        gpus = [Gpu(index=g["index"], type=str(g["type"]), memory=int(g["memory"]),
                    uuid=str(g.get("uuid", "")), name=str(g.get("name", "")))
                for g in msg["gpus"] if isinstance(g, dict)]
        old = self.nodes.get(name)
        node = Node(name=name, gpus=gpus, cpus=msg["cpus"], mem=msg["mem"], state=NodeState.UP,
                    last_seen=now, addr=msg.get("addr") or name)
        if old and (old.drain_reason or old.state == NodeState.DRAIN):
            drain = old.drain_reason or old.reason
            node.state, node.reason, node.drain_reason = NodeState.DRAIN, drain, drain
        self.nodes[name] = node
        self.registered.add(name)
        self.heard[name] = self.steady(now)
        self.store.save_node(node)
        self.dirty = True
        log.info("node %s registered: %d GPUs (%s)", name, len(gpus), msg.get("gpu_source", "?"))
        running = {(int(j), int(r)) for j, r in (e for e in msg["running"]
                                                 if isinstance(e, list) and len(e) == 2)}
        for job_id, restart in running:
            job = self.jobs.get(job_id)
            if job and job.state == JobState.RUNNING and job.restart_count == restart \
                    and name in job.alloc:
                if job_id not in self.launches:
                    self.launches[job_id] = Launch(self.steady(now), holding=set(job.alloc))
                    self._remind(job_id)
                self.launches[job_id].confirmed.add(name)
            else:
                # Not ours to run (cancelled, requeued, forgotten): stop it on the node.
                self._send_kill([name], job_id, restart, "KILL")
        for job in self._running_on(name):
            launch = self.launches[job.id]
            if (job.id, job.restart_count) not in running and name in launch.confirmed \
                    and name in launch.holding:
                # It started there and the node no longer has it, not even as an unacked end
                # (its state directory was lost): that run is gone.
                log.warning("node %s lost job %d run %d", name, job.id, job.restart_count)
                self._lose_job(job, now)

    def _running_on(self, name: str) -> list[Job]:
        return [j for j in self.index.on_node(name)
                if j.state == JobState.RUNNING and j.id in self.launches]

    def _check_health(self, node: Node, problems: list[Any], now: float) -> None:
        """Fail fast: a node whose GPU reports an error (XID, ECC, GPU lost) is drained with it,
        and its jobs are requeued rather than left to crash or compute garbage there."""
        found = [str(p)[:MAX_HEALTH_TEXT] for p in problems][:MAX_HEALTH_PROBLEMS]
        reason = "; ".join(found)
        if not found or (node.state == NodeState.DRAIN and node.reason == reason):
            return
        log.warning("node %s is unhealthy, draining it: %s", node.name, reason)
        self._drain(node, reason)
        for job in self._running_on(node.name):
            self._lose_job(job, now)
        self.dirty = True

    def _check_disk(self, node: Node, problem: str) -> None:
        """Issue 13 (disk-full drain): a node whose state disk is full takes no new jobs, but
        its running jobs go on (their ends still reach us): drained with DISK_FULL, which is
        lifted here once the node says it has room again. A node drained for anything else
        (an admin, a health problem) is left as it is."""
        ours = node.state == NodeState.DRAIN and node.drain_reason.startswith(DISK_FULL)
        if problem and node.state == NodeState.UP:
            reason = DISK_FULL + problem[:MAX_HEALTH_TEXT]
            log.warning("node %s: %s; draining it, its jobs go on", node.name, reason)
            self._drain(node, reason)
            self.dirty = True
        elif not problem and ours:
            log.info("node %s has room on its state disk again: resumed", node.name)
            node.state, node.reason, node.drain_reason = NodeState.UP, "", ""
            self.store.save_node(node)
            self.dirty = True

    def _report(self, node: Node, msg: dict[str, Any], now: float) -> None:
        job = self.jobs.get(msg["job_id"])
        launch = self.launches.get(msg["job_id"])
        if job is None or launch is None or job.restart_count != msg["restart"]:
            log.info("ignoring stale %s report for job %s run %s from %s", msg["event"],
                     msg["job_id"], msg["restart"], node.name)
            return
        if node.name not in job.alloc:
            # Issue 13 (report origin): only a node that holds the run speaks for it (each rank
            # of a gang job for itself: results are kept per node); another node's report,
            # forged or confused, is dropped (and acked, so it is not sent again).
            log.warning("dropping %s report for job %d run %d from node %s, which does not hold "
                        "it (it runs on %s)", msg["event"], job.id, job.restart_count, node.name,
                        ",".join(job.alloc))
            return
        if msg["event"] == protocol.STARTED:
            launch.confirmed.add(node.name)
        elif msg["event"] == protocol.FINISHED:
            launch.confirmed.add(node.name)
            launch.holding.discard(node.name)
            launch.results[node.name] = (str(msg.get("state") or "FAILED"), msg.get("exit_code"))
            launch.add_usage(msg)
            self._rank_finished(job, launch, now)
            if launch.max_rss is not None or launch.cpu_s is not None:
                # Onto the run's row (made when its last rank, or its first failed one, ended).
                self.store.set_run_stats(job.id, msg["restart"], launch.max_rss, launch.cpu_s)
            if msg.get("note") and job.state.terminal and not job.reason:
                # Why it could not start (its output file, say): shown by `gq show`.
                job.reason = str(msg["note"])[:protocol.MAX_NOTE]
                self._save(job, "reason")

    def _rank_finished(self, job: Job, launch: Launch, now: float) -> None:
        if job.state == JobState.RUNNING and job.reason in STOPPING:
            if not launch.holding:
                self._requeue_preempted(job, now)
            return
        if job.state == JobState.RUNNING and any(
                s == JobState.NODE_FAIL.value for s, _ in launch.results.values()):
            # The run died with its node (a reboot killed its shepherd, the node cannot launch):
            # not the job's fault, so the node-fault path: requeued within its --retries.
            log.warning("job %d run %d was lost on its node", job.id, job.restart_count)
            self._lose_job(job, now)
            return
        if job.state == JobState.RUNNING:
            failed = [(s, c) for s, c in launch.results.values() if s != JobState.COMPLETED.value]
            if failed or len(launch.results) == len(job.alloc):
                state, code = failed[0] if failed else (JobState.COMPLETED.value, 0)
                self._finish(job, JobState(state) if state in JobState.__members__
                             else JobState.FAILED, now, exit_code=code)
                # A gang job ends with its first failed rank.
                self._send_kill(launch.holding, job.id, job.restart_count, "TERM")
        if not launch.holding:
            self._release(job)

    def _requeue_preempted(self, job: Job, now: float) -> None:
        """A preempted (or `gq requeue`d) job has stopped on every node: back in the queue as
        its next run."""
        self.launches.pop(job.id, None)
        if not job.spec.requeue:
            job.holds_alloc = False
            self._finish(job, JobState.PREEMPTED, now, exit_code=None)
            return
        self.usage.charge(job, now)
        self.store.insert_run(job, now, "REQUEUED" if job.reason == REQUEUED else "PREEMPTED")
        job.state, job.reason, job.alloc, job.start_time = JobState.PENDING, "", {}, None
        job.holds_alloc = False
        job.restart_count += 1
        self._save(job)
        self.dirty = True
        log.info("job %d preempted and requeued (run %d next)", job.id, job.restart_count)

    def _finish(self, job: Job, state: JobState, now: float, exit_code: int | None) -> None:
        if job.state == JobState.RUNNING:
            self.usage.charge(job, now)
            self.store.insert_run(job, now, state.value)
        job.state, job.end_time, job.exit_code, job.reason = state, now, exit_code, ""
        self.queued.remove(job)
        if job.id not in self.launches:
            job.holds_alloc = False
        self._save(job, "state", "end_time", "exit_code", "reason", "holds_alloc")
        if not job.holds_alloc:
            self._untrack(job)
        self.dirty = True
        log.info("job %d %s (exit %s)", job.id, state.value, exit_code)

    def _release(self, job: Job) -> None:
        """The nodes no longer run any rank of `job`: its GPUs are free."""
        self.launches.pop(job.id, None)
        job.holds_alloc = False
        self._save(job, "holds_alloc")
        if job.state.terminal:
            self._untrack(job)
        self.dirty = True

    # ------------------------------------------------------------ timers and scheduling

    def tick(self, now: float) -> None:
        """Timers: node timeouts, unconfirmed launches, parked waits."""
        timeout = self.cfg.head.node_timeout_s
        steady = self.steady(now)
        for node in self.nodes.values():
            silent = steady - self.heard.get(node.name, steady)
            if node.name in self.registered and node.state != NodeState.DOWN and silent > timeout:
                self.node_down(node, f"no heartbeat for {silent:.0f}s", now)
        while self.resends and steady - self.resends[0][0] > LAUNCH_RESEND_S:
            sent_at, job_id = heapq.heappop(self.resends)
            launch, job = self.launches.get(job_id), self.jobs.get(job_id)
            # Once its job stops running or all its nodes confirmed, a launch is never resent.
            if launch and launch.sent_at == sent_at and job and job.state == JobState.RUNNING:
                missing = set(job.alloc) - launch.confirmed
                if missing:
                    self._send_launch(job, now, only=missing)
        if self.wake_at is not None and now >= self.wake_at:
            self.wake_at, self.dirty = None, True
        self._answer_parked(now)
        self.feed.prune(now, self.cfg.head.events_keep_s, self.cfg.head.events_keep_rows)

    def node_down(self, node: Node, reason: str, now: float) -> None:
        log.warning("node %s is DOWN: %s", node.name, reason)
        if node.state == NodeState.DRAIN:
            node.drain_reason = node.drain_reason or node.reason
        node.state, node.reason = NodeState.DOWN, reason + (
            f" (drained: {node.drain_reason})" if node.drain_reason else "")
        self.registered.discard(node.name)
        self.store.save_node(node)
        for job in [j for j in self.index.on_node(node.name) if j.holds_alloc]:
            if job.state == JobState.RUNNING:
                self._lose_job(job, now)
            else:
                self._release(job)
        self.dirty = True

    def _lose_job(self, job: Job, now: float) -> None:
        """The job's run cannot go on (a node is down or unhealthy): kill what is left of it on
        every node, at once or when a node comes back (a gang job's other ranks too), and free
        its GPUs; then requeue it as a new run, or end it NODE_FAIL."""
        self._send_kill(job.alloc, job.id, job.restart_count, "KILL")
        self.launches.pop(job.id, None)
        job.holds_alloc = False
        self._node_failed(job, now)

    def _node_failed(self, job: Job, now: float) -> None:
        """A running job lost its node: requeue it as a new run while its --retries last, else
        end it NODE_FAIL."""
        retries = job.spec.retries if job.spec.retries is not None else \
            self.cfg.head.default_retries  # a job stored before --retries existed
        if job.spec.requeue and job.node_fail_count < retries:
            self.store.insert_run(job, now, JobState.NODE_FAIL.value)
            job.state, job.reason, job.alloc = JobState.PENDING, "NodeFail", {}
            job.restart_count += 1
            job.node_fail_count += 1
            job.start_time = None
            self._save(job)
            self.dirty = True
        else:
            self._finish(job, JobState.NODE_FAIL, now, exit_code=None)
            if job.spec.requeue:
                job.reason = f"node fault, no retries left (--retries {retries})"
                self._save(job, "reason")

    def schedule(self, now: float) -> None:
        """One pass of the pure scheduler; its starts are persisted here and launched after commit."""
        # A pass makes tens of thousands of short-lived objects (keys, views, lists), which set
        # off many collections, each walking the head's long-lived ones (every job): a fifth of
        # a pass on a 10,000-job queue. What a pass drops is freed by reference counting; the
        # rare cycle waits for the next collection after it.
        with gcpause.paused():
            self._pass(now)

    def _pass(self, now: float) -> None:
        self.dirty = False
        # Held jobs are screened once after their hold (their reason changes with it only).
        screen = gate.screen([*self.index.ready(), *self.index.take_fresh()], now, self._parent,
                             self.index.live())
        self.wake_at = screen.wake_at
        eligible, held = limits.screen(screen.eligible, self.index.placed(), self.cfg.qos)
        self._set_reasons([*screen.waiting, *((j, limits.QOS_LIMIT) for j in held)])
        for job in screen.invalid:  # --kill-on-invalid-dep
            self.cancel(job, now)
            job.reason = gate.NEVER
            self._save(job, "reason")
        pending = self._views(eligible)
        if not pending:
            self.reservations = {}
            return
        usage = self.usage.at(now)
        self.queue_index.sync(pending)
        result = plan(Snapshot(nodes=self._node_views(), pending=pending,
                               running=self._running_views(), usage=usage,
                               queue=self.queue_index), now, self.policy)
        self.reservations = result.reservations
        for preempt in result.preemptions:
            self._preempt(self.jobs[preempt.victim], preempt.for_job)
        started = {start.job_id for start in result.starts}
        # Every job that did not start gets the pass's reason for it (Plan.reason), written out:
        # this runs for every queued job. A job the pass left out has its shape's (`behind`).
        one_each = {view.shape: view for view in pending}
        behind = {shape: result.behind(view) for shape, view in one_each.items()} \
            if result.behind is not None else dict.fromkeys(one_each)
        get = result.reasons.get
        changed = [(job, reason) for job, view in zip(eligible, pending)
                   if (reason := get(job.id) or (None if job.id in started
                                                 else behind[view.shape])) is not None
                   and job.reason != reason]
        for job, reason in changed:
            job.reason = reason
        self.store.update_jobs([job for job, _ in changed], "reason")
        # A pending job's priority is worked out when shown (_shown); a running one shows the
        # priority it started with.
        rank = priority_of(now, self.policy, usage)
        for start in result.starts:
            job = self.jobs[start.job_id]
            job.priority = rank(self._view(job))
            job.state, job.reason, job.start_time = JobState.RUNNING, "", now
            job.alloc = {n: list(g) for n, g in start.alloc.items()}
            job.holds_alloc = True
            self._save(job, "state", "reason", "start_time", "alloc", "holds_alloc")
            self.launches[job.id] = Launch(sent_at=self.steady(now), holding=set(job.alloc))
            self._send_launch(job, now)

    def _view(self, job: Job) -> PendingJob:
        """The scheduler's view of a pending job, made once per spec (`gq update` replaces the
        spec): every pass reads all the queue's, and a kept view keeps its cached shape."""
        return self._views((job,))[0]

    def _views(self, jobs: Iterable[Job]) -> tuple[PendingJob, ...]:
        """_view of each of `jobs`, written out: a pass asks for the whole queue's."""
        views, out = self.views, []
        for job in jobs:
            kept = views.get(job.id)
            if kept is None or kept[0] is not job.spec:
                kept = views[job.id] = (job.spec, _pending_view(job))
            out.append(kept[1])
        return tuple(out)

    def _set_reasons(self, reasons: Iterable[tuple[Job, str]]) -> None:
        """Give pending jobs their reason; the changed ones are written in one statement."""
        changed = []
        for job, reason in reasons:
            if job.reason != reason:
                job.reason = reason
                changed.append(job)
        self.store.update_jobs(changed, "reason")

    def _parent(self, job_id: int) -> ParentState:
        """A dependency's parent job as gate.screen needs it."""
        job = self.jobs.get(job_id)
        if job is None:
            if (known := self.ended.get(job_id)) is not None:
                return known
            job = self.store.get_job(job_id)
            if job is None:  # gone from the store: it cannot succeed any more
                return ParentState(JobState.CANCELLED.value, started=False)
        state = ParentState(job.state.value, started=job.start_time is not None
                            or job.restart_count > 0)
        if job.state.terminal and job.id not in self.jobs:
            self.ended[job_id] = state
        return state

    def _preempt(self, victim: Job, for_job: int) -> None:
        """Signal the victim (its --signal, else SIGTERM), give it its QOS's grace time, then
        SIGKILL, on the node; it is requeued when it has ended."""
        sig = parse_signal(victim.spec.signal) if victim.spec.signal else None
        qos = self.cfg.qos.get(victim.spec.qos or defaults.DEFAULT_QOS)
        grace = qos.grace_s if qos else self.cfg.head.kill_grace_s  # its QOS left the config
        name = sig.name if sig else "TERM"
        log.info("preempting job %d for job %d (SIG%s, grace %gs)", victim.id, for_job, name, grace)
        victim.reason = PREEMPTED
        self._save(victim, "reason")
        self._send_kill(victim.alloc, victim.id, victim.restart_count, name,
                        batch_only=bool(sig and sig.batch_only), grace_s=grace)

    def _send_kill(self, nodes: Iterable[str], job_id: int, restart: int, signal: str,
                   **extra: Any) -> None:
        """Order each of `nodes` to stop run `restart` of the job (sent after the commit)."""
        for node in nodes:
            self.outbox_nodes.append((node, protocol.encode(
                protocol.KILL, job_id=job_id, restart=restart, signal=signal, **extra)))

    def _running_views(self) -> tuple[RunningJob, ...]:
        return tuple(self._running_view(j) for j in self.index.placed() if j.holds_alloc)

    def _running_view(self, job: Job) -> RunningJob:
        """The scheduler's view of a job holding GPUs, made again only when what it shows
        changed (a new run or spec, or it began to end): every pass reads thousands of them on
        a big cluster, and few change between two passes."""
        ending = job.state != JobState.RUNNING or job.reason in STOPPING
        kept = self.running_views.get(job.id)
        # A job's spec and alloc are replaced, never changed in place: `is` tells a change.
        if kept is None or kept[0] is not job.spec or kept[1] is not job.alloc \
                or kept[2] != (job.start_time, ending):
            kept = self.running_views[job.id] = (job.spec, job.alloc, (job.start_time, ending),
                                                 _running_view(job, ending))
        return kept[3]

    def _node_views(self) -> tuple[NodeView, ...]:
        used: dict[str, set[int]] = {n: set() for n in self.nodes}
        cpus: dict[str, int] = dict.fromkeys(self.nodes, 0)
        mem: dict[str, int] = dict.fromkeys(self.nodes, 0)
        for job in self.index.placed():
            if job.holds_alloc:
                for node, gpus in job.alloc.items():
                    if node in used:
                        used[node].update(gpus)
                        cpus[node] += job.spec.cpus
                        mem[node] += job.spec.mem
        views = []
        for n in self.nodes.values():
            made_of = (frozenset(used[n.name]), n.cpus - cpus[n.name], n.mem - mem[n.name],
                       n.state == NodeState.UP)
            kept = self.node_views.get(n.name)
            # Most nodes are as they were in the last pass; a kept view also keeps its GPU
            # tuple, which the scheduler's caches key on. (A node's GPU list is replaced when
            # it registers, never changed in place: `is` tells a change.)
            if kept is None or kept[0] is not n.gpus or kept[1] != made_of:
                gpus = kept[2].gpus if kept is not None and kept[0] is n.gpus else tuple(n.gpus)
                kept = self.node_views[n.name] = (n.gpus, made_of, NodeView(
                    name=n.name, gpus=gpus, free=frozenset(g.index for g in gpus) - made_of[0],
                    cpus_free=made_of[1], mem_free=made_of[2], schedulable=made_of[3]))
            views.append(kept[2])
        return tuple(views)

    def _remind(self, job_id: int) -> None:
        """Look at the job's launch again LAUNCH_RESEND_S after it was sent."""
        heapq.heappush(self.resends, (self.launches[job_id].sent_at, job_id))

    def _send_launch(self, job: Job, now: float, only: set[str] | None = None) -> None:
        self.launches[job.id].sent_at = self.steady(now)
        self._remind(job.id)
        nodelist = list(job.alloc)
        job_json = job.to_json()
        for rank, (node, gpus) in enumerate(job.alloc.items()):
            if only is None or node in only:
                self.outbox_nodes.append((node, protocol.encode(
                    protocol.LAUNCH, job_id=job.id, restart=job.restart_count,
                    spec=job.spec.to_dict(), gpus=gpus, rank=rank, nodelist=nodelist,
                    time_limit_s=job.spec.time_limit_s or 0, stdout=job.output_path("output"),
                    stderr=job.output_path("error"), job=job_json,
                    grace_s=self.cfg.head.kill_grace_s, checkpoint_dir=self._checkpoint_dir(job),
                    master_addr=self.nodes[nodelist[0]].addr if nodelist[0] in self.nodes else "")))

    def _checkpoint_dir(self, job: Job) -> str:
        root = self.cfg.head.checkpoint_root
        return f"{root.rstrip('/')}/{job.spec.user}/{job.id}" if root else ""


_NO_STATS = {"max_rss": None, "total_cpu_s": None}


class _Errors(dict):  # type: ignore[type-arg]
    """Job reference -> why an action was refused, with each refusal's error code (`codes`)."""

    def __init__(self) -> None:
        super().__init__()
        self.codes: dict[str, str] = {}


def _ref(raw: Any) -> int | str:
    """A job reference from a request: a job id, or `123_7` for an array task."""
    if isinstance(raw, str):
        return parse_ref(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
        raise ProtocolError("job ids must be positive integers or ARRAYID_INDEX strings")
    return raw


def _ids_after(jobs: dict[int, Job], after: int) -> list[int]:
    """The ids of `jobs` past `after`, in order (the dict is nearly in id order already, which
    sorts in linear time)."""
    ids = sorted(jobs)
    return ids[bisect.bisect_right(ids, after):]


def _fields(msg: dict[str, Any]) -> list[str] | None:
    """The job fields a listing asks for (None: all of them)."""
    fields = msg.get("fields")
    if fields is not None:
        for name in fields:
            if not isinstance(name, str) or name not in JOB_FIELDS:
                raise ProtocolError(f"{msg['type']}: unknown job field {name!r}")
    return fields


def _paged(jobs: Iterable[Job], record: Callable[[Job], dict[str, Any]],
           limit: int | None) -> dict[str, Any]:
    """A listing's reply: the records of all `jobs`; or with `limit`, of the first `limit` of
    them that fit in PAGE_BYTES, and `next`, the id to ask for the rest after (None: none
    left). A client that pages never meets the message size limit, however many jobs."""
    with gcpause.paused():  # thousands of new records: see gq.gcpause
        if limit is None:
            return {"jobs": [record(j) for j in jobs]}
        out: list[dict[str, Any]] = []
        parts: list[bytes] = []  # each record packed, to measure it and then to send as it is
        pack = protocol.packer()
        size, last, more = 0, None, False
        for job in jobs:
            if len(out) == limit:
                more = True
                break
            data = record(job)
            packed = pack(data)
            size += len(packed)
            if out and size > PAGE_BYTES:
                more = True
                break
            out.append(data)
            parts.append(packed)
            last = job.id
        return {"jobs": protocol.PackedItems(out, parts), "next": last if more else None}


def _pending_view(job: Job) -> PendingJob:
    s = job.spec
    return PendingJob(id=job.id, qos=s.qos or defaults.DEFAULT_QOS, submit_time=job.submit_time,
                      nodes=s.nodes, gpus=s.gpus, gpu_type=s.gpu_type, gpu_mem=s.gpu_mem,
                      cpus=s.cpus, mem=s.mem, time_limit_s=s.time_limit_s or 0, user=s.user,
                      share=s.share)


def _running_view(job: Job, ending: bool) -> RunningJob:
    s = job.spec
    return RunningJob(id=job.id, qos=s.qos or defaults.DEFAULT_QOS,
                      alloc={n: tuple(g) for n, g in job.alloc.items()},
                      start_time=job.start_time or 0.0, time_limit_s=s.time_limit_s or 0,
                      cpus=s.cpus, mem=s.mem, user=s.user,
                      share_mem=(s.gpu_mem or 0) if s.share else 0, ending=ending)


def _primary_gid(uid: int) -> int | None:
    """The uid's primary group, or None when the passwd database does not know the uid."""
    import pwd
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return None

