"""The requests that read jobs: queue, show, history, accounting, and waits answered later. Live
jobs come from the job table, ended ones from the store; a listing is paged to fit a message."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gq import ckptstore, defaults, gcpause, protocol, requests
from gq.errors import ProtocolError
from gq.head.actions import ref
from gq.head import records, tokens
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.steps import step_record
from gq.head.views import pending_view
from gq.model import JOB_FIELDS, Job, JobState, iso_time, job_record
from gq.sched import Policy
from gq.sched.priority import factors
from gq.store import Store

#: Finished jobs stay visible in `gq queue --all` this long, in seconds (Slurm's MinJobAge).
RECENT_S = 300.0
#: A page of a listing holds records of at most this many bytes (msgpack), half the message
#: limit: the rest of the reply always fits.
PAGE_BYTES = defaults.MAX_MESSAGE_BYTES // 2
#: Most jobs one `history` reply holds when the client asks for no page (older clients).
HISTORY_MAX = 100_000


@dataclass
class Parked:
    """A client `wait` request answered later."""

    client: Any
    rid: int
    ids: list[int]
    #: On the steady clock (JobTable.steady): a step of the wall clock answers no wait early.
    deadline: float


class Listings:
    def __init__(self, table: JobTable, store: Store, policy: Policy):
        self.table = table
        self.store = store
        #: Pending jobs' priorities are shown under it (the head's, set again on SIGHUP).
        self.policy = policy
        self.parked: list[Parked] = []

    def req_queue(self, msg: requests.Queue, caller: Caller, client: Any, now: float) -> dict:
        """Live jobs (and with `all`, or states past running, those ended in the last
        RECENT_S), oldest first: all of them, or with `limit` a page of those after `after`."""
        states = set(msg.states or ())
        after = msg.after
        user = tokens.listed_user(msg.user, caller)
        live = self.table.jobs
        jobs: Iterable[Job] = (live[i] for i in _ids_after(live, after)
                               if not live[i].state.terminal)
        if msg.all or states - {"PENDING", "RUNNING"}:
            recent = {j.id: j for j in self.store.finished_jobs(since=now - RECENT_S)
                      if j.id > after}  # the store's record wins, as it is the later one
            jobs = heapq.merge((j for j in jobs if j.id not in recent), recent.values(),
                               key=lambda j: j.id)
        if user:
            jobs = (j for j in jobs if j.spec.user == user)
        if states:
            jobs = (j for j in jobs if j.state.value in states)
        fields = _fields(msg.fields, msg.TYPE)
        if fields is None or "priority" in fields:
            jobs = self.table.shown(jobs, now, self.policy)
        key = None if fields is None else tuple(fields)
        if msg.text:
            if msg.start or fields is not None or msg.limit is None:
                raise ProtocolError("queue: text is for a paged listing of whole records, "
                                    "without start or fields")
            return _texts(jobs, msg.limit)
        record = job_record(key)
        if not msg.start:
            return _paged(jobs, record, msg.limit, records.packed(key))

        def with_start(job: Job) -> dict[str, Any]:
            # squeue --start: the scheduler's reservations of pending jobs
            data = record(job)
            if job.state == JobState.PENDING:
                data.update(self._expected(job))
            return data
        return _paged(jobs, with_start, msg.limit)

    def _expected(self, job: Job) -> dict[str, Any]:
        """When and where the last pass expects a pending job to start (None: no reservation)."""
        res = self.table.reservations.get(job.id)
        return {"expected_start": iso_time(res.start) if res else None,
                "expected_nodes": list(res.alloc) if res else None}

    def req_show(self, msg: requests.Show, caller: Caller, client: Any, now: float) -> dict:
        [job] = self.table.shown([tokens.readable(self.table.lookup(ref(msg.id)), caller)],
                                 now, self.policy)
        data = job.to_json()
        data.update(command=job.spec.args, script_lines=job.spec.script.count("\n") + 1,
                    cpus=job.spec.cpus, mem=job.spec.mem, gpu_mem=job.spec.gpu_mem,
                    **self._run_stats([job])(job))
        if job.state == JobState.PENDING:
            usage = self.table.usage.at(now)
            data["priority_factors"] = factors(pending_view(job), now, self.policy, usage,
                                               sum(usage.values()), len(usage))
        if job.id in self.table.reservations:
            data.update(self._expected(job))
        data["steps"] = [step_record(s) for s in self.store.steps_of([job.id]).get(job.id, [])]
        if self.table.jobs.get(job.id) is not job:  # ended: its checkpoints are in the store
            data["last_checkpoint"] = iso_time(
                ckptstore.latest(self.store.conn, [job.id]).get(job.id))
        return {"job": data}

    def req_history(self, msg: requests.History, caller: Caller, client: Any, now: float
                    ) -> dict:
        """Jobs of the store in sacct's window, by id: up to HISTORY_MAX of them, or with
        `limit` a page of those after `after`."""
        limit = msg.limit
        jobs = self.store.history(msg.since, msg.until, msg.user,
                                  None if msg.states is None else list(msg.states),
                                  after=msg.after,
                                  limit=HISTORY_MAX if limit is None else limit + 1,
                                  ids=None if msg.ids is None else list(msg.ids),
                                  partition=msg.partition)
        record, stats = job_record(), self._run_stats(jobs)
        steps = {job_id: [step_record(s) for s in rows]
                 for job_id, rows in self.store.steps_of(j.id for j in jobs).items()}
        return _paged(jobs, lambda j: {**record(j), **stats(j), "steps": steps.get(j.id, [])},
                      limit)

    def _run_stats(self, jobs: list[Job]) -> Callable[[Job], dict[str, Any]]:
        """Each job's latest run's peak memory and CPU time (None while it runs or unknown)."""
        known = self.store.run_stats((j.id, j.restart_count) for j in jobs
                                     if j.state.terminal)
        return lambda j: known.get(j.id, _NO_STATS)

    def req_accounting(self, msg: requests.Accounting, caller: Caller, client: Any, now: float
                       ) -> dict:
        """GPU-seconds inside [since, until] by user, account, QOS and how the run ended
        (RUNNING for runs still going, counted up to now); saved_gpu_seconds: those of a
        preempted (or node-lost) run before its last checkpoint, which are use, not waste."""
        since, until = msg.since, min(msg.until, now)
        saved = {tuple(r[:4]): r[4] for r in ckptstore.saved_usage(self.store.conn, since, until)}
        rows = [{"user": u, "account": a, "qos": q, "state": st, "gpu_seconds": sec,
                 "saved_gpu_seconds": saved.get((u, a, q, st), 0.0)}
                for u, a, q, st, sec in self.store.run_usage(since, until)]
        for job_id in self.table.launches:
            job = self.table.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING or job.start_time is None:
                continue
            seconds = job.spec.gpus * job.spec.nodes * (until - max(since, job.start_time))
            if seconds > 0:
                rows.append({"user": job.spec.user, "account": job.spec.account or "",
                             "qos": job.spec.qos or "", "state": JobState.RUNNING.value,
                             "gpu_seconds": seconds})
        return {"rows": rows}

    def req_wait(self, msg: requests.Wait, caller: Caller, client: Any, now: float
                 ) -> dict | None:
        # An array's id waits for all its tasks.
        jobs = [job for raw in msg.ids for job in self.table.expand(ref(raw))]
        ids = [job.id for job in jobs]
        if all(j.state.terminal for j in jobs):
            return {"done": True,
                    "jobs": [j.to_json() for j in self.table.shown(jobs, now, self.policy)]}
        park_s = defaults.WAIT_POLL_S if msg.park_s is None else msg.park_s
        timeout = min(float(park_s), 300.0)
        self.parked.append(Parked(client=client, rid=msg.rid, ids=ids,
                                  deadline=self.table.steady(now) + timeout))
        return None

    def answer_parked(self, now: float) -> list[tuple[Any, bytes]]:
        """Replies to the waits whose jobs have all ended or whose time is up (a turn that
        fails to commit sends none of them: they wait again, as what they saw was taken back)."""
        keep, out = [], []
        steady = self.table.steady(now)
        for p in self.parked:
            jobs = [self.table.jobs.get(i) or self.store.get_job(i) for i in p.ids]
            done = all(j is None or j.state.terminal for j in jobs)
            if done or steady >= p.deadline:
                out.append((p.client, protocol.ok(
                    p.rid, done=done,
                    jobs=[j.to_json() for j in self.table.shown(filter(None, jobs), now,
                                                                 self.policy)])))
            else:
                keep.append(p)
        if out:
            was = self.parked
            self.table.journal.record(lambda: setattr(self, "parked", was))
            self.parked = keep
        return out


def _ids_after(jobs: dict[int, Job], after: int) -> list[int]:
    """The ids of `jobs` past `after`, in order (the dict is nearly in id order already, which
    sorts in linear time)."""
    ids = sorted(jobs)
    return ids[bisect.bisect_right(ids, after):]


def _fields(fields: Sequence[str] | None, kind: str) -> Sequence[str] | None:
    """The job fields a listing (of request type `kind`) asks for (None: all of them)."""
    if fields is not None:
        for name in fields:
            if not isinstance(name, str) or name not in JOB_FIELDS:
                raise ProtocolError(f"{kind}: unknown job field {name!r}")
    return fields


def _paged(jobs: Iterable[Job], record: Callable[[Job], dict[str, Any]],
           limit: int | None, kept: Callable[[Job], bytes] | None = None) -> dict[str, Any]:
    """A listing's reply: the records of all `jobs`; or with `limit`, of the first `limit` of
    them that fit in PAGE_BYTES, and `next`, the id to ask for the rest after (None: none
    left). A client that pages never meets the message size limit, however many jobs.
    `kept`: each job's record packed, kept between listings (gq/head/records.py)."""
    with gcpause.paused():  # thousands of new records: see gq.gcpause
        if limit is None:
            return {"jobs": [record(j) for j in jobs]}
        if kept is not None:  # records packed already: each is its own item
            return _page(jobs, lambda job: (kept(job),) * 2, limit)
        pack = protocol.packer()

        def fresh(job: Job) -> tuple[Any, bytes]:
            data = record(job)
            return data, pack(data)
        return _page(jobs, fresh, limit)


def _texts(jobs: Iterable[Job], limit: int) -> dict[str, Any]:
    """A page of the jobs' kept `--json` texts (records.texts), each sent as a bin."""
    text = records.texts()
    with gcpause.paused():
        return _page(jobs, lambda job: (text(job),) * 2, limit)


def _page(jobs: Iterable[Job], item: Callable[[Job], tuple[Any, bytes]], limit: int
          ) -> dict[str, Any]:
    """A page of `limit` jobs at most and PAGE_BYTES packed (at least one job), from `item`
    (a job's record and its packed bytes, sent as they are), and where the next page starts."""
    out: list[Any] = []
    parts: list[bytes] = []
    size, last, more = 0, None, False
    for job in jobs:
        if len(parts) == limit:
            more = True
            break
        data, packed = item(job)
        size += len(packed)
        if parts and size > PAGE_BYTES:
            more = True
            break
        out.append(data)
        parts.append(packed)
        last = job.id
    return {"jobs": protocol.PackedItems(out, parts), "next": last if more else None}


_NO_STATS = {"max_rss": None, "total_cpu_s": None}
