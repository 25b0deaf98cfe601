"""gqnode's job steps: a step order (gq.messages.Step) starts a step shepherd
(gq/node/stepshepherd.py) for this node's tasks; its start and end are Reports through the
outbox (events STEP_STARTED, STEP_ENDED: the worst exit code of the node's tasks); step kills
(StepKill), and the end of the job's run here, stop it.

Each step has a directory `steps/J.R.S/` (gqnode's, 0700): its order, its shepherd's pid,
then its status; it goes once gqd has the step's end, so that an order gqd sent again (it had
not heard that the step started) never starts the tasks twice. A restarted gqnode adopts the
step shepherds still alive (as it adopts runs' shepherds: not its children, so their liveness
is polled) and reports the ends of the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from gq.fsutil import private_dir
from gq.messages import MAX_NOTE, STEP_ENDED, STEP_STARTED, Report, Step
from gq.node import shepherd, stepdirs, stepshepherd
from gq.node.outbox import Outbox
from gq.node.runfiles import alive as _alive
from gq.node.runfiles import proc_start as _started

log = logging.getLogger("gq.node.steps")


@dataclass
class StepRun:
    job_id: int
    restart: int
    step: int
    dir: Path
    pid: int
    #: The shepherd's start time (a recycled pid is never taken for it); whether it is our child.
    started: float = 0.0
    child: bool = True


class NodeSteps:
    def __init__(self, node: str, state_dir: Path, outbox: Outbox):
        self.node, self.outbox = node, outbox
        self.dir = state_dir / stepdirs.STEPS_DIR
        private_dir(self.dir, 0o700)
        self.runs: dict[int, StepRun] = {}  # by the step shepherd's pid

    def start(self, msg: Step, run_dir: Path | None) -> None:
        """A step order: start this node's tasks (`run_dir`: the job's run here, None if this
        node holds no such run, which then fails the step)."""
        key = (msg.job_id, msg.restart, msg.step)
        step_dir = stepdirs.step_dir(self.dir.parent, *key)
        if any((r.job_id, r.restart, r.step) == key for r in self.runs.values()) \
                or step_dir.exists():
            return  # a resent order
        if run_dir is None or not any(p.get("node") == self.node for p in msg.layout):
            self._report(key, 1, "this node holds no run of the job, or no task of the step")
            return
        try:
            step_dir.mkdir(mode=0o700)
            stepshepherd.write_order(step_dir, msg, self.node)
            pid = stepshepherd.spawn(step_dir, run_dir)
        except OSError as exc:
            log.error("job %d step %d: cannot start its tasks: %s", key[0], key[2], exc)
            shutil.rmtree(step_dir, ignore_errors=True)
            self._report(key, 1, f"gqnode cannot start the step: {exc}")
            return
        started = _started(pid)
        try:
            (step_dir / stepdirs.PID_FILE).write_text(f"{pid} {started}")
        except OSError as exc:
            # The step runs on; only a restarted gqnode would not find it (nor its run's
            # shepherd, to pass on a time limit or a signal).
            log.warning("job %d step %d: cannot record its shepherd's pid: %s", key[0], key[2],
                        exc)
        self.runs[pid] = StepRun(*key, step_dir, pid, started)
        self.outbox.put(Report(node=self.node, seq=0, job_id=key[0], restart=key[1],
                               event=STEP_STARTED, step=key[2], time=time.time()))
        log.info("job %d step %d: tasks started (shepherd %d)", key[0], key[2], pid)

    def kill(self, job_id: int, restart: int | None = None, step: int | None = None,
             sig: str = "TERM", grace_s: float | None = None, no_kill: bool = False) -> None:
        """Stop the job's steps here (those of run `restart`, or only step `step`): KILL at
        once; else `sig` to their tasks, then KILL after `grace_s` (the step's grace when
        None), or (`no_kill`) only `sig`. The shepherd reads how from its stop order, as the
        run's does (gq.node.shepherd.order_stop)."""
        for run in self.runs.values():
            if run.job_id != job_id or restart not in (None, run.restart) \
                    or step not in (None, run.step):
                continue
            if sig != "KILL":
                try:
                    shepherd.order_stop(run.dir, sig, False, grace_s, no_kill=no_kill)
                except OSError as exc:
                    log.warning("job %d step %d: cannot write its stop order (%s)%s", job_id,
                                run.step, exc, ": not signalled" if no_kill else "")
                    if no_kill:
                        continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.pid, signal.SIGUSR1 if sig == "KILL" else signal.SIGTERM)

    def reaped(self, pid: int) -> bool:
        """A child ended: True if it was a step shepherd (its end is queued for gqd)."""
        run = self.runs.pop(pid, None)
        if run is None:
            return False
        status = stepshepherd.read_status(run.dir) or {}
        code = status.get("exit_code")
        self._report((run.job_id, run.restart, run.step),
                     code if isinstance(code, int) and not isinstance(code, bool) else 137,
                     str(status.get("note") or ("" if status else "its shepherd died")),
                     stopped=status.get("stopped") is True)
        return True

    def acked(self, entry: Report) -> None:
        """gqd has report `entry`: a step's end, whose directory may go now."""
        if entry.event == STEP_ENDED and entry.step is not None:
            shutil.rmtree(stepdirs.step_dir(self.dir.parent, entry.job_id, entry.restart,
                                            entry.step),
                          ignore_errors=True)

    def adopt(self) -> None:
        """At start-up: take up the steps a former gqnode started; those whose shepherd is gone
        are reported ended (unless their end waits in the outbox)."""
        reported = {(e.job_id, e.restart, e.step) for e in self.outbox.entries()
                    if e.event == STEP_ENDED}
        with contextlib.suppress(OSError):
            for entry in sorted(self.dir.iterdir()):
                try:
                    job_id, restart, step = (int(x) for x in entry.name.split("."))
                    pid, started = stepdirs.read_pid(entry)
                except (ValueError, OSError):
                    shutil.rmtree(entry, ignore_errors=True)  # never started, or not a step
                    continue
                if (job_id, restart, step) in reported:
                    continue  # ended; its directory goes when gqd acks the end
                self.runs[pid] = StepRun(job_id, restart, step, entry, pid, started, child=False)
        self.check_adopted()

    def check_adopted(self) -> None:
        """Report the adopted step shepherds that have ended (no SIGCHLD tells of them)."""
        for run in [r for r in self.runs.values() if not r.child]:
            if not _alive(run.pid, run.started):
                self.reaped(run.pid)

    def _report(self, key: tuple[int, int, int], code: int, note: str,
                stopped: bool = False) -> None:
        """The step's end here: CANCELLED when gqnode stopped its tasks."""
        job_id, restart, step = key
        state = "CANCELLED" if stopped else "COMPLETED" if code == 0 else "FAILED"
        self.outbox.put(Report(
            node=self.node, seq=0, job_id=job_id, restart=restart, event=STEP_ENDED, step=step,
            exit_code=code, state=state, time=time.time(), note=note[:MAX_NOTE]))

