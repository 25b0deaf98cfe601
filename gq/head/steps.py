"""Job steps in gqd: `srun` inside a running job asks for one (STEP_LAUNCH); gqd lays it out
on the job's nodes (gq.steps), orders each node to start its tasks, and keeps the step until
every node has reported its tasks' end: the step's exit code is the worst of its tasks'
(Slurm's), and with --kill-on-bad-exit a failing node's report ends the step on the others.

Owns the live steps (memory, journaled as the job table's changes are) and their rows
(gq/stepstore.py). A step outlives no job: once its job stops running, a step still live
ends CANCELLED (the job's own stop killed its tasks on every node).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gq import messages, protocol, requests, stepstore
from gq import steps as layout_mod
from gq.errors import NotFoundError, PermissionDenied, ProtocolError, RefusedError
from gq.head import reasons
from gq.head.auth import Caller
from gq.head.jobs import JobTable
from gq.head.orders import Order
from gq.messages import STEP_STARTED, Report, StepKill
from gq.model import Job, JobState, expand_pattern, iso_time
from gq.store import Store

log = logging.getLogger("gq.head.steps")

#: Most live steps of one job (each holds processes on its nodes).
MAX_LIVE_STEPS = 256
#: A step order a node has not confirmed (its STEP_STARTED report) in this many seconds is
#: sent to it again (it may have been away): the node starts a step's tasks once only.
STEP_RESEND_S = 5.0


@dataclass
class Step:
    job_id: int
    step: int
    restart: int
    name: str
    nodes: list[str]
    ntasks: int
    start_time: float
    kill_on_bad_exit: bool
    #: Nodes whose tasks have not all ended yet.
    left: set[str] = field(default_factory=set)
    #: node -> the worst exit code of its tasks.
    codes: dict[str, int] = field(default_factory=dict)
    #: Under --kill-on-bad-exit, the exit code of the first node that failed: the step's
    #: (the others' tasks were killed for it).
    first_bad: int | None = None
    #: A node's tasks were stopped (a cancel, srun's Ctrl-C): the step ends CANCELLED, but
    #: for a failure under -K, which ends it FAILED.
    cancelled: bool = False
    state: str = JobState.RUNNING.value
    exit_code: int | None = None
    end_time: float | None = None
    #: The order, for resends, and when it was last sent (steady clock); the nodes that
    #: confirmed it. Memory only: a step gqd took up after a restart is not resent.
    order: messages.Step | None = None
    sent_at: float = 0.0
    confirmed: set[str] = field(default_factory=set)

    def row(self) -> dict[str, Any]:
        detail = {"restart": self.restart, "kill_on_bad_exit": self.kill_on_bad_exit,
                  "codes": self.codes, "first_bad": self.first_bad,
                  "cancelled": self.cancelled}
        return {"job_id": self.job_id, "step": self.step, "name": self.name,
                "state": self.state, "exit_code": self.exit_code, "ntasks": self.ntasks,
                "nodes": ",".join(self.nodes), "start_time": self.start_time,
                "end_time": self.end_time, "detail": json.dumps(detail)}

    @classmethod
    def of_row(cls, row: dict[str, Any]) -> Step:
        """A live step as gqd wrote it (restarted, gqd takes up its steps again)."""
        detail = json.loads(row["detail"] or "{}")
        nodes = [n for n in row["nodes"].split(",") if n]
        codes = {str(k): int(v) for k, v in (detail.get("codes") or {}).items()}
        return cls(row["job_id"], row["step"], int(detail.get("restart", 0)), row["name"],
                   nodes, row["ntasks"], row["start_time"],
                   bool(detail.get("kill_on_bad_exit")), left=set(nodes) - set(codes),
                   codes=codes, first_bad=detail.get("first_bad"),
                   cancelled=bool(detail.get("cancelled")))


def step_record(row: dict[str, Any]) -> dict[str, Any]:
    """A step as srun and `gq history --json` see it: gq.stepstore's row, its id JOBID.STEP,
    its times in ISO form, without gqd's bookkeeping."""
    out = {k: v for k, v in row.items() if k != "detail"}
    return {**out, "id": f"{row['job_id']}.{row['step']}",
            "nodes": [n for n in row["nodes"].split(",") if n],
            "start_time": iso_time(row["start_time"]), "end_time": iso_time(row["end_time"])}


class Steps:
    def __init__(self, table: JobTable, store: Store, send: Callable[[list[Order]], None]):
        self.table, self.store, self.send = table, store, send
        self.live: dict[tuple[int, int], Step] = {
            (row["job_id"], row["step"]): Step.of_row(row) for row in stepstore.live(store.conn)}

    # ------------------------------------------------------------ requests

    def req_launch(self, msg: requests.StepLaunch, caller: Caller, client: Any, now: float
                   ) -> dict:
        job = self._job(msg.job_id, caller, changing=True)
        if job.state != JobState.RUNNING or not job.alloc or job.reason in reasons.STOPPING:
            raise RefusedError(f"job {job.id} is {job.state.value}, not running: srun starts "
                               "steps only inside a running job")
        if sum(1 for s in self.live.values() if s.job_id == job.id) >= MAX_LIVE_STEPS:
            raise RefusedError(f"job {job.id} has {MAX_LIVE_STEPS} steps running already")
        nodelist = list(job.alloc)
        parts = layout_mod.layout(
            nodelist, {n: list(g) for n, g in job.alloc.items()}, ntasks=msg.ntasks,
            nodes=msg.nodes, ntasks_per_node=msg.ntasks_per_node,
            gpus_per_task=msg.gpus_per_task,
            only=None if msg.nodelist is None else list(msg.nodelist))
        step_id = max([stepstore.next_step(self.store.conn, job.id),
                       *(s.step + 1 for s in self.live.values() if s.job_id == job.id)])
        name = msg.name or os.path.basename(msg.argv[0])[:256]
        stdout = self._path(msg.output, msg.cwd, job, step_id) or job.output_path("output")
        stderr = self._path(msg.error, msg.cwd, job, step_id) \
            or (stdout if msg.output else job.output_path("error"))
        order = messages.Step(
            job_id=job.id, restart=job.restart_count, step=step_id, argv=msg.argv,
            env=dict(msg.env), cwd=msg.cwd, layout=tuple(layout_mod.to_wire(parts)),
            stdout=stdout, stderr=stderr, kill_on_bad_exit=msg.kill_on_bad_exit,
            master_addr=self.table.addr_of(nodelist[0]) or nodelist[0],
            cpus_per_task=msg.cpus_per_task,
            grace_s=float(self.table.cfg.head.kill_grace_s), label=msg.label)
        try:
            # What each node will check (its file paths, made here from srun's -o/-e and its
            # cwd, may come out too long): a refused order would be resent, and srun wait, for
            # as long as the job runs.
            protocol.decode_message(protocol.encode_message(order), frozenset({order.TYPE}))
        except ProtocolError as exc:
            raise RefusedError(f"the job's nodes would refuse this step ({exc})") from None
        step = Step(job.id, step_id, job.restart_count, name, [p.node for p in parts],
                    sum(len(p.tasks) for p in parts), now, order.kill_on_bad_exit,
                    left={p.node for p in parts}, sent_at=self.table.steady(now))
        self._put(step)
        step.order = order
        self.send([Order(p.node, order) for p in parts])
        log.info("job %d step %d: %d task(s) on %s", job.id, step_id, step.ntasks,
                 ",".join(step.nodes))
        return {"step": step_id, "ntasks": step.ntasks, "nodes": step.nodes}

    def req_status(self, msg: requests.StepStatus, caller: Caller, client: Any, now: float
                   ) -> dict:
        job = self._job(msg.job_id, caller)
        if job.state != JobState.RUNNING:
            self.sweep(now)
        step = self.live.get((job.id, msg.step))
        if step is not None:
            return step_record(step.row())
        rows = stepstore.of_jobs(self.store.conn, [job.id]).get(job.id, [])
        for row in rows:
            if row["step"] == msg.step:
                return step_record(row)
        raise NotFoundError(f"job {job.id} has no step {msg.step}")

    def req_cancel(self, msg: requests.StepCancel, caller: Caller, client: Any, now: float
                   ) -> dict:
        job = self._job(msg.job_id, caller, changing=True)
        step = self.live.get((job.id, msg.step))
        if step is None:
            return {"done": False}
        self.send(_kills(step))
        return {"done": True}

    # ------------------------------------------------------------ what nodes report

    def node_report(self, node: str, msg: Report, now: float) -> list[Order]:
        """`node` started its tasks of a step, or they have all ended (its worst exit code in
        the report)."""
        step = self.live.get((msg.job_id, -1 if msg.step is None else msg.step))
        if step is None or step.restart != msg.restart or node not in step.left:
            return []  # a step already ended (its job stopped), or a resent report
        self._keep(step)
        step.confirmed.add(node)
        if msg.event == STEP_STARTED:
            return []
        step.left.discard(node)
        step.codes[node] = 137 if msg.exit_code is None else msg.exit_code
        stopped = msg.state == JobState.CANCELLED.value
        step.cancelled = step.cancelled or stopped
        out: list[Order] = []
        if step.kill_on_bad_exit and step.codes[node] != 0 and step.left:
            # srun -K: the first failing task ends the step everywhere.
            out = _kills(step)
        if step.kill_on_bad_exit and step.codes[node] != 0 and step.first_bad is None \
                and not stopped:
            step.first_bad = step.codes[node]
        if step.left:
            stepstore.put(self.store.conn, step.row())
        else:
            code = layout_mod.worst(list(step.codes.values())) if step.first_bad is None \
                else step.first_bad
            state = JobState.FAILED if step.first_bad is not None else \
                JobState.CANCELLED if step.cancelled else \
                JobState.COMPLETED if code == 0 else JobState.FAILED
            self._end(step, state, code, now)
        return out

    def sweep(self, now: float) -> None:
        """Steps of jobs no longer running end CANCELLED (their tasks were killed with it)."""
        for job_id in {s.job_id for s in self.live.values()}:
            job = self.table.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                for step in [s for s in self.live.values() if s.job_id == job_id]:
                    code = layout_mod.worst(list(step.codes.values())) if step.codes else None
                    self._end(step, JobState.CANCELLED, code, now)

    # ------------------------------------------------------------ the parts

    def resend_due(self, now: float) -> list[Order]:
        """Step orders unconfirmed for STEP_RESEND_S, sent again to the nodes yet to confirm."""
        steady, out = self.table.steady(now), []
        for step in self.live.values():
            missing = step.left - step.confirmed
            if step.order is not None and missing and steady - step.sent_at > STEP_RESEND_S:
                self._keep(step)
                step.sent_at = steady
                out += [Order(n, step.order) for n in sorted(missing)]
        return out

    def _job(self, job_id: int, caller: Caller, changing: bool = False) -> Job:
        job = self.table.jobs.get(job_id) or self.store.get_job(job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id}")
        if not caller.admin and job.spec.uid != caller.uid:
            raise PermissionDenied(f"permission denied: job {job_id} belongs to "
                                   f"{job.spec.user}")
        if changing and not caller.proven:
            raise PermissionDenied("permission denied: starting or ending a step needs a "
                                   "proven identity")
        return job

    @staticmethod
    def _path(pattern: str | None, cwd: str, job: Job, step_id: int) -> str:
        """srun -o/-e: %j, %J (job.step) and %s (the step) here; %t (task) and %n (node) on
        the node."""
        if not pattern:
            return ""
        # %t and %n kept for the node (expand_pattern gives the batch script's, 0): as %%t.
        kept = pattern.replace("%J", f"%j.{step_id}").replace("%s", str(step_id)).replace("%t", "%%t").replace("%n", "%%n")
        text = expand_pattern(kept, job)
        return text if text.startswith("/") else f"{cwd.rstrip('/')}/{text}"

    def _put(self, step: Step) -> None:
        key = (step.job_id, step.step)
        self.table.journal.record(lambda: self.live.pop(key, None))
        self.live[key] = step
        stepstore.put(self.store.conn, step.row())

    def _keep(self, step: Step) -> None:
        was = dataclasses.replace(step, left=set(step.left), codes=dict(step.codes),
                                  confirmed=set(step.confirmed))
        key = (step.job_id, step.step)
        self.table.journal.record(lambda: self.live.__setitem__(key, was))

    def _end(self, step: Step, state: JobState, code: int | None, now: float) -> None:
        self._keep(step)
        step.state, step.exit_code, step.end_time = state.value, code, now
        self.live.pop((step.job_id, step.step), None)
        stepstore.put(self.store.conn, step.row())
        log.info("job %d step %d ended %s (exit %s)", step.job_id, step.step, step.state, code)


def _kills(step: Step) -> list[Order]:
    """A StepKill for each node whose tasks of `step` have not ended yet."""
    return [Order(n, StepKill(step.job_id, step.restart, step.step)) for n in sorted(step.left)]
