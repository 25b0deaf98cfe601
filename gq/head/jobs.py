"""The job table: gqd's live jobs in memory, and the only code that changes one.

It holds every form a live job takes in memory: the Job objects, their index entries (index.py),
the per-user counts (limits.Queued), the arrays' task maps, the runs sent out and when to look
at them again (launches.py), the scheduler's views (views.py), the last pass's reservations, the
ended parents of dependencies and fair-share usage. A job changes only through the transitions below;
each writes it through to the store, files it anew, marks the table `dirty` when a pass may now
decide differently, journals how to undo all of that (journal.py: a failed request or batch
takes it back, with no reload), and returns what the nodes must be told (orders.py), which the
daemon sends once the turn commits.

    admit     jobs already in the store (a submit's rows) enter memory, PENDING
    start     PENDING -> RUNNING on an allocation: launch orders
    stop      RUNNING on its way back to the queue (`preempt`; REQUEUED): stop orders; then
              `stopped`, once no node holds it: PENDING as its next run (or PREEMPTED)
    end       PENDING or RUNNING -> a terminal state (`cancel`: with stop orders)
    requeue   an ended job -> PENDING, as its next run
    lose      RUNNING on a failed node -> PENDING as its next run, or NODE_FAIL: kill orders
    release   no node holds a rank of it any more: its GPUs are free
and hold, unhold, respec (`gq update`), the reasons of pending jobs, and what nodes report of
runs (adopt, rank_started, rank_ended; resend_due). Who may ask for what the callers check
(actions.py, nodes.py); what a state allows, the table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gq import defaults, messages
from gq.arrays import split_ref
from gq.config import Config
from gq.deps import ParentState
from gq.errors import GqError, NotFoundError, RefusedError
from gq.head import gate, limits, reasons
from gq.head.index import JobIndex
from gq.head.journal import Journal
from gq.head.launches import Launch, Launches
from gq.head.mail import Mailer
from gq.head.orders import Order, kills
from gq.head.usage import Usage
from gq.head.views import Limits, Views
from gq.hostlist import natural_key
from gq.model import Job, JobSpec, JobState, Node, parse_signal
from gq.sched import NodeView, PendingJob, Policy, Reservation, RunningJob
from gq.sched.priority import priority_of
from gq.store import Store

log = logging.getLogger("gq.head")


class JobTable:
    def __init__(self, store: Store, cfg: Config, addr_of: Callable[[str], str],
                 steady: Callable[[float], float]):
        self.store = store
        self.cfg = cfg
        #: The steady clock for intervals (launch resends) from `now`: time.monotonic() in gqd,
        #: so that a step of the wall clock holds back no resend (issue 13).
        self.steady = steady
        #: A node's address for its peers (a gang job's MASTER_ADDR); "" when unknown.
        self.addr_of = addr_of
        self.journal = Journal()
        #: Something a pass reads changed since the last pass began.
        self.dirty = True
        self.views = Views()
        #: Mails of the turn's changes (--mail-type), sent by the daemon after the commit.
        self.mailer = Mailer(cfg.head.mail_program)
        self._reordered = False

    def load(self, now: float) -> None:
        """Build memory from the store, at gqd's start."""
        self.jobs: dict[int, Job] = {}
        #: Array job id -> task index -> job id, for the arrays' tasks in `jobs`.
        self.arrays: dict[int, dict[int, int]] = {}
        self.queued = limits.Queued()
        self.index = JobIndex()
        for job in self.store.live_jobs():
            self._add(job)
        #: Parents of dependencies that have ended, as the store has them (read once each).
        self.ended: dict[int, ParentState] = {}
        #: The last pass's reservations of pending jobs (squeue --start).
        self.reservations: dict[int, Reservation] = {}
        self.usage = Usage(self.cfg.scheduler.fairshare_half_life_s)
        for job in self.store.finished_jobs(since=now - 4 * self.usage.half_life_s, limit=100_000):
            self.usage.charge(job, job.end_time or now)
        self.launches = Launches(self.journal)
        for job in self.index.placed():
            if job.holds_alloc:
                self.launches[job.id] = Launch(sent_at=0.0, holding=set(job.alloc))
                self.launches.remind(job.id)
        self.journal.commit()
        self.dirty = True

    # ------------------------------------------------------------ commits and rollbacks

    def committed(self) -> None:
        """The store committed: what memory did since is kept for good."""
        self.journal.commit()

    def rollback(self, mark: int = 0) -> None:
        """Take memory back to where it was at `mark` (0: the last commit), as the store was
        taken back; a pass looks again."""
        self._reordered = False
        self.journal.rollback(mark)
        if self._reordered:  # jobs that left and came back: back in their first place
            seq = self.index.seq
            ordered = sorted(self.jobs.items(), key=lambda item: seq(item[0]))
            self.jobs.clear()
            self.jobs.update(ordered)
        self.dirty = True

    @contextlib.contextmanager
    def isolated(self, name: str, keep: tuple[type[BaseException], ...] = (GqError,)
                 ) -> Iterator[None]:
        """A savepoint in the open transaction: an exception takes back what was done since,
        in the store and in memory; one of `keep` (a refusal, raised after its checks) keeps it."""
        mark = self.journal.mark()
        try:
            with self.store.savepoint(name, keep):
                yield
        except keep:
            raise
        except BaseException:
            self.rollback(mark)
            raise

    def touch(self) -> None:
        """Something other than a job that a pass reads changed (a node, the configuration,
        the clock reached a --begin time)."""
        self.dirty = True

    # ------------------------------------------------------------ reads

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

    def expand(self, ref: int | str) -> list[Job]:
        """The jobs a reference names: an array's live tasks for its id, else the one job."""
        if isinstance(ref, int) and ref in self.arrays:
            return [self.jobs[i] for _, i in sorted(self.arrays[ref].items())]
        return [self.lookup(ref)]

    def known(self, job_id: int) -> bool:
        return job_id in self.jobs or self.store.get_job(job_id) is not None

    def running_on(self, node: str) -> list[Job]:
        return [j for j in self.index.on_node(node)
                if j.state == JobState.RUNNING and j.id in self.launches]

    def parent(self, job_id: int) -> ParentState:
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
            self.journal.record(lambda: self.ended.pop(job_id, None))
            self.ended[job_id] = state
        return state

    def view(self, job: Job) -> PendingJob:
        """The scheduler's view of a pending job."""
        return self.views.of_pending((job,))[0]

    def running_views(self) -> tuple[RunningJob, ...]:
        of_running = self.views.of_running
        return tuple(of_running(j) for j in self.index.placed() if j.holds_alloc)

    def node_views(self, nodes: Iterable[Node], telemetry: Limits | None = None
                   ) -> tuple[NodeView, ...]:
        return self.views.of_nodes(nodes, self.index, telemetry)

    def shown(self, jobs: Iterable[Job], now: float, policy: Policy) -> Iterator[Job]:
        """`jobs`, each pending one given its priority at `now` as it goes by. A priority is a
        function of the job, the time and usage: worked out when shown (and not journaled: it
        is shown, not kept), not by every pass for every queued job."""
        rank = None
        for job in jobs:
            if job.state == JobState.PENDING:
                if rank is None:
                    rank = priority_of(now, policy, self.usage.at(now))
                job.priority = rank(self.view(job))
            yield job

    def take_fresh(self) -> list[Job]:
        """The index's held jobs a pass has not seen (see JobIndex.take_fresh)."""
        fresh = self.index.take_fresh()
        if fresh:
            self.journal.record(lambda: self.index.untake(fresh))
        return fresh

    def check_move(self, job: Job, new: JobSpec) -> None:
        """Refuse, naming the limit, moving a live job to the QOS of `new`."""
        self.queued.remove(job)  # counted under its new QOS instead
        try:
            limits.check_submit(self.cfg, self.queued, [_one(new)])
        finally:
            self.queued.add(job)

    # ------------------------------------------------------------ transitions

    def admit(self, jobs: Iterable[Job]) -> None:
        """New jobs enter memory: their rows are in the store already (submits.py)."""
        jobs = list(jobs)
        self.journal.record(lambda: self._remove_all(reversed(jobs)))  # one undo a chunk
        for job in jobs:
            self._add(job)
        self.dirty = True

    def start(self, job: Job, alloc: dict[str, Any], priority: int, now: float
              ) -> list[Order]:
        """A pass starts a pending job on `alloc`; it shows the priority it started with."""
        self._keep(job)
        job.priority = priority
        job.state, job.reason, job.start_time = JobState.RUNNING, "", now
        self._mail(self.mailer.began, job, now)
        # Ranks in name order, as Slurm's: rank 0 is the first of SLURM_JOB_NODELIST.
        job.alloc = {n: list(g) for n, g in sorted(alloc.items(),
                                                  key=lambda item: natural_key(item[0]))}
        job.holds_alloc = True
        self._save(job, "state", "reason", "start_time", "alloc", "holds_alloc")
        self.launches.put(job.id, Launch(sent_at=self.steady(now), holding=set(job.alloc)))
        return self._launch(job, now)

    def stop(self, job: Job, reason: str, signal: str, **extra: Any) -> list[Order]:
        """A running job is stopped to go back to the queue (`reason`: PREEMPTED, REQUEUED);
        `stopped` follows once no node holds it."""
        self._keep(job)
        job.reason = reason
        self._save(job, "reason")
        return kills(job.alloc, job, signal, **extra)

    def preempt(self, victim: Job, for_job: int) -> list[Order]:
        """Signal the victim (its --signal, else SIGTERM), give it its QOS's grace time, then
        SIGKILL, on the node; it is requeued when it has ended."""
        sig = parse_signal(victim.spec.signal) if victim.spec.signal else None
        qos = self.cfg.qos.get(victim.spec.qos or defaults.DEFAULT_QOS)
        grace = qos.grace_s if qos else self.cfg.head.kill_grace_s  # its QOS left the config
        name = sig.name if sig else "TERM"
        log.info("preempting job %d for job %d (SIG%s, grace %gs)", victim.id, for_job, name, grace)
        return self.stop(victim, reasons.PREEMPTED, name, batch_only=bool(sig and sig.batch_only),
                         grace_s=grace)

    def checkpointed(self, job: Job, when: float) -> None:
        """Its running run saved its progress at `when` (gq/head/checkpoints.py wrote it)."""
        self._keep(job)
        job.checkpoint_time = when

    def end(self, job: Job, state: JobState, now: float, exit_code: int | None) -> None:
        """A live job ends in `state`; it leaves memory once it holds no GPUs."""
        self._keep(job)
        if job.state == JobState.RUNNING:
            self._charge(job, now)
            self.store.insert_run(job, now, state.value)
        self._mail(self.mailer.ended, job, state, now, exit_code)
        job.state, job.end_time, job.exit_code, job.reason = state, now, exit_code, ""
        if job.id not in self.launches:
            job.holds_alloc = False
        self._save(job, "state", "end_time", "exit_code", "reason", "holds_alloc")
        if not job.holds_alloc:
            self._untrack(job)
        self.dirty = True
        log.info("job %d %s (exit %s)", job.id, state.value, exit_code)

    def cancel(self, job: Job, now: float) -> list[Order]:
        if job.state.terminal:
            raise RefusedError(f"job {job.ref} has already finished ({job.state.value})")
        was_running = job.state == JobState.RUNNING
        self.end(job, JobState.CANCELLED, now, exit_code=None)
        return kills(job.alloc, job, "TERM") if was_running else []

    def requeue(self, job: Job) -> None:
        """An ended job (holding no GPUs) goes back to the queue as its next run."""
        self._keep(job)
        job.state, job.reason, job.alloc, job.start_time = JobState.PENDING, reasons.NONE, {}, None
        job.end_time = job.exit_code = None
        job.restart_count += 1
        job.node_fail_count = 0  # a person chose to run it again: its --retries start afresh
        self._save(job)
        if job.id in self.ended:
            was = self.ended.pop(job.id)
            self.journal.record(lambda: self.ended.__setitem__(job.id, was))
        self._track(job)
        self.dirty = True

    def stopped(self, job: Job, now: float) -> None:
        """A preempted (or `gq requeue`d) job has stopped on every node: back in the queue as
        its next run."""
        self.launches.drop(job.id)
        if not job.spec.requeue:
            self._keep(job)
            job.holds_alloc = False
            self.end(job, JobState.PREEMPTED, now, exit_code=None)
            return
        self._charge(job, now)
        self.store.insert_run(job, now, "REQUEUED" if job.reason == reasons.REQUEUED
                              else "PREEMPTED")
        self._mail(self.mailer.requeued, job, now)
        self._keep(job)
        job.state, job.reason, job.alloc, job.start_time = JobState.PENDING, "", {}, None
        job.holds_alloc = False
        job.restart_count += 1
        self._save(job)
        self.dirty = True
        log.info("job %d preempted and requeued (run %d next)", job.id, job.restart_count)

    def lose(self, job: Job, now: float) -> list[Order]:
        """The job's run cannot go on (a node is down or unhealthy): kill what is left of it on
        every node, at once or when a node comes back (a gang job's other ranks too), and free
        its GPUs; then requeue it as a new run while its --retries last, else end it NODE_FAIL."""
        out = kills(job.alloc, job, "KILL")
        self.launches.drop(job.id)
        self._keep(job)
        job.holds_alloc = False
        retries = job.spec.retries if job.spec.retries is not None else \
            self.cfg.head.default_retries  # a job stored before --retries existed
        if job.spec.requeue and job.node_fail_count < retries:
            self.store.insert_run(job, now, JobState.NODE_FAIL.value)
            self._mail(self.mailer.requeued, job, now)
            job.state, job.reason, job.alloc = JobState.PENDING, reasons.NODE_FAIL, {}
            job.restart_count += 1
            job.node_fail_count += 1
            job.start_time = None
            self._save(job)
            self.dirty = True
        else:
            self.end(job, JobState.NODE_FAIL, now, exit_code=None)
            if job.spec.requeue:
                self.set_reason(job, f"node fault, no retries left (--retries {retries})")
        return out

    def release(self, job: Job) -> None:
        """The nodes no longer run any rank of `job`: its GPUs are free."""
        self.launches.drop(job.id)
        self._keep(job)
        job.holds_alloc = False
        self._save(job, "holds_alloc")
        if job.state.terminal:
            self._untrack(job)
        self.dirty = True

    def hold(self, job: Job, kind: str) -> None:
        """A pending job is held (`kind`: "user" or "admin") until released."""
        self._keep(job)
        job.hold = kind
        job.reason = gate.HELD[kind]
        self._save(job, "hold", "reason")
        self._unreserve(job.id)
        self.dirty = True

    def unhold(self, job: Job) -> None:
        self._keep(job)
        job.hold, job.reason = "", reasons.NONE
        self._save(job, "hold", "reason")
        self.dirty = True

    def respec(self, job: Job, new: JobSpec) -> None:
        """`gq update`: the job's spec is replaced by `new` (time limit, QOS, name)."""
        self._keep(job)
        job.spec = new
        self._save(job, "time_limit_s", "qos", "name")
        self._unreserve(job.id)
        self.dirty = True

    def set_reason(self, job: Job, reason: str) -> None:
        self._keep(job)
        job.reason = reason
        self._save(job, "reason")

    def set_reasons(self, pairs: Iterable[tuple[Job, str]]) -> None:
        """Give jobs their reason; the changed ones are written in one statement (a pass gives
        every queued job its reason: this runs for each)."""
        changed, was = [], []
        for job, reason in pairs:
            if job.reason != reason:
                was.append((job, job.reason))
                job.reason = reason
                changed.append(job)
        if was:
            self.journal.record(lambda: _put_reasons(was))
        self.store.update_jobs(changed, "reason")

    def planned(self, reservations: dict[int, Reservation]) -> None:
        """A pass's reservations replace the last one's."""
        was = self.reservations
        self.journal.record(lambda: setattr(self, "reservations", was))
        self.reservations = reservations

    # ------------------------------------------------------------ what nodes report

    def adopt(self, job: Job, node: str, now: float) -> None:
        """A registering node runs this run of `job` (after a head restart, say)."""
        if job.id not in self.launches:
            self.launches.put(job.id, Launch(self.steady(now), holding=set(job.alloc)))
            self.launches.remind(job.id)
        self.launches.confirm(job.id, node)

    def rank_started(self, job: Job, node: str) -> None:
        self.launches.confirm(job.id, node)

    def rank_ended(self, job: Job, node: str, state: str, code: int | None, now: float,
                   rss: int | None = None, cpu: float | None = None) -> list[Order]:
        """The run's rank on `node` has ended (`state`, `code`; it used `rss` and `cpu` where
        the node says): the job ends with its first failed rank or its last one, goes back to
        the queue if it was being stopped, or is lost if its node failed under it. The run's
        peak memory and CPU time go onto its row (made when it ended here)."""
        restart = job.restart_count
        launch = self.launches.rank_ended(job.id, node, state, code, rss, cpu)
        orders = self._rank_ended(job, launch, now)
        if launch.max_rss is not None or launch.cpu_s is not None:
            self.store.set_run_stats(job.id, restart, launch.max_rss, launch.cpu_s)
        return orders

    def _rank_ended(self, job: Job, launch: Launch, now: float) -> list[Order]:
        if job.state == JobState.RUNNING and job.reason in reasons.STOPPING:
            if not launch.holding:
                self.stopped(job, now)
            return []
        if job.state == JobState.RUNNING and any(
                s == JobState.NODE_FAIL.value for s, _ in launch.results.values()):
            # The run died with its node (a reboot killed its shepherd, the node cannot launch):
            # not the job's fault, so the node-fault path: requeued within its --retries.
            log.warning("job %d run %d was lost on its node", job.id, job.restart_count)
            return self.lose(job, now)
        out: list[Order] = []
        if job.state == JobState.RUNNING:
            # The batch script runs on the first node (the others hold the allocation for
            # steps): the job ends with it, or with the first node that failed before it.
            first = next(iter(job.alloc), "")
            failed = [(s, c) for s, c in launch.results.values() if s != JobState.COMPLETED.value]
            if failed or first in launch.results or len(launch.results) == len(job.alloc):
                end, exit_code = launch.results.get(first) or failed[0]
                self.end(job, JobState(end) if end in JobState.__members__ else JobState.FAILED,
                         now, exit_code=exit_code)
                # A gang job ends with its first failed rank.
                out = kills(launch.holding, job, "TERM")
        if not launch.holding:
            self.release(job)
        return out

    def resend_due(self, now: float) -> list[Order]:
        """Launches unconfirmed for LAUNCH_RESEND_S, sent again to the nodes yet to confirm."""
        out: list[Order] = []
        for job_id in self.launches.due(self.steady(now)):
            job = self.jobs.get(job_id)
            # Once its job stops running or all its nodes confirmed, a launch is never resent.
            if job is not None and job.state == JobState.RUNNING:
                missing = set(job.alloc) - self.launches[job_id].confirmed
                if missing:
                    out += self._launch(job, now, only=missing)
        return out

    # ------------------------------------------------------------ the parts of a transition

    def _mail(self, queue: Callable[..., None], *args: Any) -> None:
        """Queue a job's mail (sent after the commit); a rolled-back change takes it back."""
        queued = self.mailer.queued
        had = len(queued)
        queue(*args)
        if len(queued) > had:
            self.journal.record(lambda: queued.__delitem__(slice(had, None)))

    def _keep(self, job: Job) -> None:
        """Journal all of `job`'s fields as they are now, before a transition changes any."""
        was, seen = job.__dict__.copy(), self.index.seen(job.id)
        self.journal.record(lambda: self._restore(job, was, seen))

    def _restore(self, job: Job, was: dict[str, Any], seen: bool) -> None:
        job.__dict__.update(was)
        self._refile(job)
        if seen:  # refiled held, it would be screened again as if newly held
            self.index.see(job)

    def _save(self, job: Job, *columns: str) -> None:
        """Write a changed job through to the store (only `columns`, or all of it) and file it
        anew."""
        self.store.update_job(job, *columns)
        self._refile(job)

    def _refile(self, job: Job) -> None:
        """File a job in memory anew under its fields now (its index entry, its count)."""
        if self.jobs.get(job.id) is job:
            self.index.update(job)
            self.queued.remove(job)
            self.queued.add(job)  # under its QOS now; not at all once it ended

    def _add(self, job: Job, seq: int | None = None) -> None:
        self.jobs[job.id] = job
        self.index.add(job, seq)
        self.queued.add(job)
        if job.array_job_id is not None:
            self.arrays.setdefault(job.array_job_id, {})[job.array_index or 0] = job.id

    def _remove(self, job: Job) -> None:
        self.jobs.pop(job.id, None)
        self.index.drop(job)
        self.views.forget(job.id)
        self.queued.remove(job)
        tasks = self.arrays.get(job.array_job_id) if job.array_job_id is not None else None
        if tasks is not None:
            tasks.pop(job.array_index or 0, None)
            if not tasks:
                del self.arrays[job.array_job_id]  # type: ignore[arg-type]

    def _remove_all(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self._remove(job)

    def _track(self, job: Job) -> None:
        self.journal.record(lambda: self._remove(job))
        self._add(job)

    def _untrack(self, job: Job) -> None:
        seq, seen = self.index.seq(job.id), self.index.seen(job.id)
        self.journal.record(lambda: self._readd(job, seq, seen))
        self._remove(job)

    def _readd(self, job: Job, seq: int, seen: bool) -> None:
        self._add(job, seq)
        if seen:
            self.index.see(job)
        self._reordered = True

    def _unreserve(self, job_id: int) -> None:
        if job_id in self.reservations:
            was = self.reservations.pop(job_id)
            self.journal.record(lambda: self.reservations.__setitem__(job_id, was))

    def _charge(self, job: Job, end: float) -> None:
        """Charge the run's GPU time to its user's fair-share usage."""
        user = job.spec.user
        was = self.usage.entry(user)
        self.journal.record(lambda: self.usage.restore(user, was))
        self.usage.charge(job, end)

    def _launch(self, job: Job, now: float, only: set[str] | None = None) -> list[Order]:
        """The launch orders of the job's run (for the nodes in `only`, else all of them)."""
        self.launches.sent(job.id, self.steady(now))
        nodelist = tuple(job.alloc)
        head = self.cfg.head
        root = head.checkpoint_root
        checkpoint_dir = f"{root.rstrip('/')}/{job.spec.user}/{job.id}" if root else ""
        master_addr = self.addr_of(nodelist[0])
        # Of the job's spec, the run's part (gqnode and the shepherd read no more).
        spec = messages.RunSpec.of(job.spec)
        # Of the job's record, the shepherd needs only which array task it is.
        task = messages.ArrayTask(job.array_job_id, job.array_index)
        return [Order(node, messages.Launch(
            job_id=job.id, restart=job.restart_count, spec=spec, gpus=tuple(gpus), rank=rank,
            nodelist=nodelist, time_limit_s=job.spec.time_limit_s or 0,
            stdout=job.output_path("output"), stderr=job.output_path("error"), job=task,
            grace_s=head.kill_grace_s, checkpoint_dir=checkpoint_dir, master_addr=master_addr,
            cluster=head.cluster_name))
            for rank, (node, gpus) in enumerate(job.alloc.items())
            if only is None or node in only]


def _one(spec: JobSpec) -> JobSpec:
    """`spec` counted as one job (an array task's spec still names its array)."""
    return dataclasses.replace(spec, array=None)


def _put_reasons(was: list[tuple[Job, str]]) -> None:
    for job, reason in was:
        job.reason = reason
