"""Submit requests, worked through in slices of gqd's loop turns.

Checking, inserting and indexing a request of 5,000 specs or a 10,000-task array takes gqd
hundreds of milliseconds; done in one turn, every heartbeat and job end waits behind it. Here
each submit is a generator that yields every few dozen specs or rows, and the loop gives submits
at most SLICE_S of a turn, then reads its sockets again.

A submit stays all or none and is answered only once committed: the rows it inserts in one turn
are staged (Store.stage_jobs: no reader sees them, a restart drops them) until the turn that
inserts its last row and ends the staging commits. Its jobs enter memory (passes, listings,
cancels) only from that turn on, never before they are in the store. Submits are worked one at
a time in arrival order, so each one's ids are consecutive, as before.

Each step of a submit is a savepoint of its own: one that fails takes back what it did (rows and
memory), and the submit fails alone. A turn that fails to commit takes memory back with the store
(the job table's journal); a submit whose staging had ended in an earlier turn keeps its jobs and
takes the rest of them into memory from where the last commit left it.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

from gq import protocol
from gq.arrays import parse_array
from gq.config import Config
from gq.errors import GqError, StoreError, UsageError
from gq.head import gate, limits
from gq.head.jobs import JobTable
from gq.model import Job, JobSpec
from gq.store import Store, spec_blob

log = logging.getLogger("gq.head")

#: Most of one loop turn that submits may take, in seconds: what a heartbeat or a job end that
#: arrives meanwhile waits for them (a slice ends at the first look at the clock past it).
SLICE_S = 0.02
#: Specs checked between looks at the clock (~60 µs each).
CHECK_CHUNK = 64
#: Rows inserted in one statement, or jobs indexed, between looks at the clock.
ROW_CHUNK = 250


@dataclass
class Submission:
    rid: int
    client: Any
    now: float
    work: Generator[None, None, None] | None = None
    #: The ids to answer with: each spec's first job's (an array's id).
    ids: list[int] = field(default_factory=list)
    #: How many jobs (array tasks each count) it made.
    jobs: int = 0
    #: It wrote staged rows.
    staged: bool = False
    #: Its last row and the end of its staging are in the store (committed or not yet).
    ended: bool = False
    #: ... and committed: its jobs are kept whatever happens next.
    durable: bool = False
    #: Its jobs, once staging ended; the first `admitted` of them are in memory.
    made: list[Job] = field(default_factory=list)
    admitted: int = 0
    done: bool = False
    error: GqError | None = None
    #: What gqd does otherwise than asked (filled in by `accept`), for the reply.
    warnings: list[str] = field(default_factory=list)

    def reply(self) -> dict[str, Any]:
        if not self.warnings:
            return {"ids": self.ids}
        return {"ids": self.ids, "warnings": list(dict.fromkeys(self.warnings))}


class Submits:
    """The head's submits in arrival order; the first one is being worked on."""

    def __init__(self, table: JobTable, store: Store, cfg: Config):
        self.table = table
        self.store = store
        self.cfg = cfg
        self.queue: deque[Submission] = deque()
        #: time.perf_counter() by which this turn's submit work stops; set by the loop each
        #: turn. None: no limit (a Head driven in-process finishes each submit at once).
        self.deadline: float | None = None
        #: Submits finished (or failed) in this turn, answered once the turn commits.
        self.finished: list[Submission] = []
        #: Jobs accepted by submits answered directly in this turn.
        self.accepted = 0

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    def submit(self, rid: int, client: Any, raws: Sequence[Any], accept: Callable[[Any], JobSpec],
               now: float, warnings: list[str] | None = None) -> dict[str, Any] | None:
        """A submit request: its reply data when it is done within this turn's slice, else
        None (it is answered from a later turn through `committed`). `accept` checks a raw spec
        and binds it to the caller."""
        sub = Submission(rid, client, now, warnings=warnings if warnings is not None else [])
        sub.work = self._work(sub, raws, accept, now)
        self.queue.append(sub)
        if len(self.queue) > 1:
            return None  # behind another: its turn comes
        self._advance(sub)
        if not sub.done:
            return None
        self.queue.popleft()
        if sub.error is not None:
            raise sub.error
        self.accepted += sub.jobs
        return sub.reply()

    def work(self) -> int:
        """Advance the queued submits until the turn's deadline; how many finished."""
        finished = 0
        while self.queue and not self._late():
            sub = self.queue[0]
            self._advance(sub)
            if not sub.done:
                break
            self.queue.popleft()
            self.finished.append(sub)
            finished += 1
        return finished

    def committed(self) -> tuple[list[tuple[Any, bytes]], int]:
        """After the turn committed: the replies to send, and how many jobs were accepted."""
        if self.queue and self.queue[0].ended:
            self.queue[0].durable = True
        for sub in self.finished:
            sub.durable = sub.ended
        return self._answer()

    def aborted(self, exc: StoreError) -> tuple[list[tuple[Any, bytes]], int]:
        """After the turn's transaction failed (and memory went back to the last commit with
        the store): the submit being worked on fails unless it was committed already, its
        staged rows are dropped, and those finished in this turn fail too. A committed one
        finished in this turn is worked on again: the jobs it took into memory were taken back."""
        self.accepted = 0
        durable = [sub for sub in self.finished if sub.durable and sub.admitted < len(sub.made)]
        if self.queue and not self.queue[0].durable:
            sub = self.queue.popleft()
            if sub.work is not None:
                sub.work.close()
            sub.done, sub.error = True, exc
            self.finished.append(sub)
            if sub.staged:
                try:
                    with self.store.tx():
                        self.store.drop_staged()
                except StoreError as again:  # readers skip them; the next stage_jobs drops them
                    log.error("cannot drop a failed submit's staged jobs yet: %s", again)
        for sub in durable:
            self.finished.remove(sub)
            sub.done = False
        self.queue.extendleft(reversed(durable))
        for sub in self.finished:
            if sub.error is None and not sub.durable:
                sub.error = exc
        return self._answer()

    def _answer(self) -> tuple[list[tuple[Any, bytes]], int]:
        replies, accepted = [], self.accepted
        for sub in self.finished:
            if sub.error is not None:
                replies.append((sub.client, protocol.error(sub.rid, sub.error.code,
                                                           str(sub.error))))
            else:
                replies.append((sub.client, protocol.ok(sub.rid, **sub.reply())))
                accepted += sub.jobs
        self.finished.clear()
        self.accepted = 0
        return replies, accepted

    def _late(self) -> bool:
        return self.deadline is not None and time.perf_counter() >= self.deadline

    def _advance(self, sub: Submission) -> None:
        """Work on `sub` until it is done or the turn's slice is up; a step that fails takes
        back what it did and fails the submit (a bug in it fails it alone, gqd goes on)."""
        assert sub.work is not None
        try:
            with self.table.isolated("submit", keep=()):
                self._steps(sub)
        except sqlite3.Error:
            raise  # the turn's transaction fails: the loop's store-failure path answers it
        except GqError as exc:
            self._fail(sub, exc)
        except Exception as exc:
            log.exception("internal error handling a submit")
            self._fail(sub, GqError(f"internal error in gqd: {type(exc).__name__}: {exc}"))

    def _steps(self, sub: Submission) -> None:
        assert sub.work is not None
        if not sub.ended:
            try:
                while True:
                    next(sub.work)
                    if self._late():
                        return
            except StopIteration:
                pass
        while sub.admitted < len(sub.made):
            chunk = sub.made[sub.admitted:sub.admitted + ROW_CHUNK]
            self.table.admit(chunk)
            self._admitted(sub, sub.admitted + len(chunk))
            if self._late() and sub.admitted < len(sub.made):
                return
        sub.done = True

    def _admitted(self, sub: Submission, count: int) -> None:
        """The first `count` of the submit's jobs are in memory (journaled: a rolled-back turn
        takes them out again, and the submit takes them in again from there)."""
        was = sub.admitted
        self.table.journal.record(lambda: setattr(sub, "admitted", was))
        sub.admitted = count

    def _fail(self, sub: Submission, exc: GqError) -> None:
        """The step was taken back. A submit committed in an earlier turn keeps its jobs (it
        is answered with them): those memory could not take are taken one by one."""
        sub.done = True
        if sub.durable:
            self._admit_each(sub)
            return
        sub.error, sub.ended, sub.made = exc, False, []
        if sub.staged:
            self.store.drop_staged()

    def _admit_each(self, sub: Submission) -> None:
        for job in sub.made[sub.admitted:]:
            try:
                with self.table.isolated("submit", keep=()):
                    self.table.admit([job])
                    self._admitted(sub, sub.admitted + 1)
            except Exception:
                log.exception("job %d is in the store but gqd could not take it into memory; "
                              "it is taken when gqd starts again", job.id)

    def _work(self, sub: Submission, raws: Sequence[Any], accept: Callable[[Any], JobSpec],
              now: float) -> Generator[None, None, None]:
        """Check the specs, then stage their rows: yields every few dozen specs or rows. Its
        jobs are `sub.made` once staging ended (in this turn's transaction)."""
        store = self.store
        specs = []
        for raw in raws:
            specs.append(accept(raw))
            if len(specs) % CHECK_CHUNK == 0:
                yield
        if not specs:
            raise UsageError("nothing to submit")
        limits.check_submit(self.cfg, self.table.queued, specs)
        yield
        next_id = store.stage_jobs()
        sub.staged = True
        jobs: list[Job] = []
        rows: list[tuple[Job, bytes]] = []
        for spec in specs:
            hold = "user" if spec.hold else ""
            # A held job's reason is known now: the pass after need not write it.
            reason = gate.held_reason(hold) if hold else "None"
            blob = spec_blob(spec)
            sub.ids.append(next_id)
            first = next_id
            indices = parse_array(spec.array).indices if spec.array else (None,)
            for index in indices:
                job = Job(id=next_id, spec=spec, submit_time=now, reason=reason, hold=hold,
                          array_index=index, array_job_id=None if index is None else first)
                # An array's tasks after its first share the first's spec (see add_staged).
                rows.append((job, blob if next_id == first else b""))
                jobs.append(job)
                next_id += 1
                if len(rows) == ROW_CHUNK:
                    store.add_staged(rows)
                    rows = []
                    yield
        store.add_staged(rows)
        store.unstage()
        sub.ended, sub.jobs, sub.made = True, len(jobs), jobs
