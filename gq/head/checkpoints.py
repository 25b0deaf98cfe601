"""Checkpoints in gqd: a running job says it saved its progress, and a preemption then loses
only the work since (the scheduler's victims by lost work, `gq report`'s waste).

Two ways in: `gq checkpoint` inside the job (a CHECKPOINT request, its owner's: gqd's time),
and the marker file `$GQ_CHECKPOINT_DIR/.gq-checkpoint`, whose mtime the job's nodes send with
every heartbeat (gq.messages.Mark; the node's clock). Either counts only for the job's current
run, inside it (no earlier than its start, no later than now): a marker left by an earlier run
in the same directory, or a report of a run gqd has moved on from, is ignored. Each run's
latest time is written through (gq/ckptstore.py) and kept on the job (`checkpoint_time`).
"""

from __future__ import annotations

import logging
from typing import Any

from gq import ckptstore, requests
from gq.errors import NotFoundError, PermissionDenied, RefusedError
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.messages import Mark
from gq.model import Job, JobState, iso_time
from gq.store import Store

log = logging.getLogger("gq.head.checkpoints")


class Checkpoints:
    def __init__(self, table: JobTable, store: Store):
        self.table, self.store = table, store

    def load(self) -> None:
        """At gqd's start: the live jobs' latest checkpoints, as the store has them."""
        found = ckptstore.latest(self.store.conn, self.table.jobs)
        for job_id, when in found.items():
            self.table.jobs[job_id].checkpoint_time = when

    def request(self, msg: requests.Checkpoint, caller: Caller, client: Any, now: float
                ) -> dict[str, Any]:
        """CHECKPOINT: only the job's owner (or an admin) reports it, for its running run."""
        job = self.table.jobs.get(msg.job_id)
        if job is None and self.store.get_job(msg.job_id) is None:
            raise NotFoundError(f"no job {msg.job_id}")
        if job is not None and not caller.admin and job.spec.uid != caller.uid:
            raise PermissionDenied(f"permission denied: job {msg.job_id} belongs to "
                                   f"{job.spec.user}")
        if job is None or not self._current(job, msg.restart):
            raise RefusedError(f"job {msg.job_id} run {msg.restart} is not running (an ended or "
                               "earlier run's checkpoint is ignored)")
        recorded = self._record(job, now, now)
        return {"job_id": job.id, "restart": msg.restart, "recorded": recorded,
                "time": iso_time(job.checkpoint_time)}

    def from_node(self, node: str, marks: tuple[Mark, ...], now: float) -> None:
        """A heartbeat's markers: each of a run of a job running on that node (a node speaks
        for no other job's runs)."""
        for mark in marks:
            job = self.table.jobs.get(mark.job_id)
            if job is not None and node in job.alloc and self._current(job, mark.restart):
                self._record(job, mark.time, now)

    @staticmethod
    def _current(job: Job, restart: int) -> bool:
        return job.state == JobState.RUNNING and job.restart_count == restart \
            and job.start_time is not None

    def _record(self, job: Job, when: float, now: float) -> bool:
        """Keep `when` as the run's checkpoint if it falls inside the run and is its latest."""
        start = job.start_time or 0.0
        if when < start:  # an earlier run's marker, still in the job's directory
            return False
        when = min(when, now)  # a node's clock ahead of ours, or a marker touched to the future
        if job.checkpoint_time is not None and when <= job.checkpoint_time:
            return False
        ckptstore.put(self.store.conn, job.id, job.restart_count, when)
        self.table.checkpointed(job, when)
        log.debug("job %d run %d checkpointed at %.3f", job.id, job.restart_count, when)
        return True
