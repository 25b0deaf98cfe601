"""The requests that act on named jobs (cancel, signal, update, hold, release, requeue): who may
do what to which job, and what each asks of the job table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from gq import defaults, requests
from gq.arrays import parse_ref
from gq.config import Config
from gq.errors import PermissionDenied, ProtocolError, RefusedError, UsageError
from gq.head import select
from gq.head import tokens
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.orders import Order, kills
from gq.head.reasons import REQUEUED, STOPPING
from gq.model import Job, JobState, format_duration, parse_signal


class Actions:
    def __init__(self, cfg: Config, table: JobTable, send: Callable[[list[Order]], None]):
        self.cfg = cfg
        self.table = table
        #: Queues orders for nodes (sent once the turn commits).
        self.send = send

    def req_cancel(self, msg: requests.Cancel, caller: Caller, client: Any, now: float) -> dict:
        ids: Sequence[Any] = msg.ids
        if msg.filter is not None:  # scancel -u/-t/-n/-p: the live jobs it names
            ids = select.matching(self.table.jobs.values(), select.check(msg.filter), caller,
                                  list(ids) or None)
        if msg.signal:
            sig = parse_signal(msg.signal)  # a bad name is the caller's usage error
            batch = msg.batch_only or sig.batch_only  # -b, or B:USR1
            done, errors = self._act(ids, caller, lambda job: self._signal(job, sig.name, batch))
        else:
            done, errors = self._act(ids, caller,
                                     lambda job: self.send(self.table.cancel(job, now)))
        return {"cancelled": done, "errors": errors}

    def req_update(self, msg: requests.Update, caller: Caller, client: Any, now: float) -> dict:
        changes: dict[str, Any] = {k: v for k, v in (
            ("time_limit_s", msg.time_limit_s), ("qos", msg.qos), ("name", msg.name))
            if v is not None}
        if not changes:
            raise UsageError("nothing to update: give --time, --qos or --name")
        if "name" in changes and not changes["name"].strip():
            raise UsageError("a job's name cannot be empty")
        done, errors = self._act(msg.ids, caller, lambda job: self._update(job, caller, changes))
        return {"done": done, "errors": errors}

    def req_hold(self, msg: requests.Hold, caller: Caller, client: Any, now: float) -> dict:
        done, errors = self._act(msg.ids, caller, lambda job: self._hold(job, caller))
        return {"done": done, "errors": errors}

    def req_release(self, msg: requests.Release, caller: Caller, client: Any, now: float
                    ) -> dict:
        done, errors = self._act(msg.ids, caller, lambda job: self._unhold(job, caller))
        return {"done": done, "errors": errors}

    def req_requeue(self, msg: requests.Requeue, caller: Caller, client: Any, now: float
                    ) -> dict:
        done, errors = self._act(msg.ids, caller, self._requeue)
        return {"done": done, "errors": errors}

    def _act(self, refs: Sequence[Any], caller: Caller, action: Callable[[Job], None]
             ) -> tuple[list[Any], dict[str, str]]:
        """Apply `action` to each job named, and to every live task of an array named by its id
        (tasks it cannot apply to, such as running ones for a hold, are skipped unless all are).
        A job the caller may not touch, or that `action` refuses, is an entry in the errors."""
        done, errors = [], tokens.Refusals()
        for raw in refs:
            try:
                jobs = [self._owned(job, caller) for job in self.table.expand(ref(raw))]
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
                errors.refuse(str(raw), exc)
        return done, errors

    def _owned(self, job: Job, caller: Caller) -> Job:
        if not caller.admin and job.spec.uid != caller.uid:
            raise PermissionDenied(f"permission denied: job {job.ref} belongs to {job.spec.user}")
        if not job.state.terminal and job.id not in self.table.jobs:
            # Committed by a submit still entering memory (and not answered yet): acting on
            # the store's copy would be undone when memory takes the submit's own.
            raise RefusedError(f"job {job.ref} is still being submitted; try again")
        return job

    def _hold(self, job: Job, caller: Caller) -> None:
        """Slurm's hold: a pending job is not scheduled until released. An admin's hold on
        someone else's job (JobHeldAdmin) only an admin can release."""
        if job.state != JobState.PENDING:
            raise RefusedError(f"job {job.ref} is not pending ({job.state.value}): only "
                               "pending jobs can be held")
        self.table.hold(job, "admin" if caller.admin and job.spec.uid != caller.uid else "user")

    def _unhold(self, job: Job, caller: Caller) -> None:
        if not job.hold or job.state != JobState.PENDING:
            raise RefusedError(f"job {job.ref} is not held")
        if job.hold == "admin" and not caller.admin:
            raise PermissionDenied(f"permission denied: job {job.ref} was held by an "
                                   "administrator; only an administrator can release it")
        self.table.unhold(job)

    def _requeue(self, job: Job) -> None:
        """Slurm's requeue: a running job is stopped (SIGTERM, then SIGKILL after the grace time)
        and goes back to the queue as its next run; an ended one goes back at once."""
        if not job.spec.requeue:
            raise RefusedError(f"job {job.ref} was submitted with --no-requeue")
        if job.state == JobState.PENDING:
            raise RefusedError(f"job {job.ref} is pending: it has not run yet")
        if job.state == JobState.RUNNING:
            if job.reason not in STOPPING:
                self.send(self.table.stop(job, REQUEUED, "TERM"))
            return
        if job.holds_alloc:
            raise RefusedError(f"job {job.ref} is still stopping on its node(s); try again")
        self.table.requeue(job)

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
            self.table.check_move(job, new)
        self.table.respec(job, new)

    def _signal(self, job: Job, name: str, batch_only: bool) -> None:
        """scancel --signal: the signal to a running job's processes (or only its script), which
        it is not ended by (unless the job dies of it)."""
        if job.state != JobState.RUNNING:
            raise RefusedError(f"job {job.ref} is not running ({job.state.value}): only a "
                               "running job can be signalled")
        if job.reason in STOPPING:
            # Its stop order must not be overwritten by a signal-only one.
            raise RefusedError(f"job {job.ref} is being stopped ({job.reason})")
        self.send(kills(job.alloc, job, name, batch_only=batch_only, no_kill=True))


def ref(raw: Any) -> int | str:
    """A job reference from a request: a job id, or `123_7` for an array task."""
    if isinstance(raw, str):
        return parse_ref(raw)
    if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
        raise ProtocolError("job ids must be positive integers or ARRAYID_INDEX strings")
    return raw
