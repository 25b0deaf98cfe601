"""The node's health-check program (`[node] health_check`, like Slurm's HealthCheckProgram).

gqnode runs it every `health_check_interval_s` without waiting for it: it is started, and its end
is seen when gqnode reaps its children. A non-zero exit, or a run past `health_check_timeout_s`
(its process group is then killed), is a health problem sent with every heartbeat until a later
run succeeds; gqd drains the node with it as the reason and requeues its jobs, as for a GPU error.
A success clears the problem but never resumes the node: as in Slurm, an admin does
(`gq admin resume`), once they know why it failed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from pathlib import Path

log = logging.getLogger("gq.node")

#: Longest problem text kept from the program's output (gqd keeps less).
MAX_LINE = 500


class HealthCheck:
    def __init__(self, program: str, interval_s: float, timeout_s: float, output: Path,
                 node: str):
        self.program, self.interval_s, self.timeout_s = program, interval_s, timeout_s
        #: The program's environment: gqnode's, and the node's name in GQ_NODE.
        self.env = {**os.environ, "GQ_NODE": node}
        self.output = output
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.next_run = 0.0  # at start-up first, as slurmd does
        #: The problem the last finished run found ("" when it passed).
        self.problem = ""

    def due(self) -> float:
        """When `poll` has something to do next (time.monotonic() seconds, as every `now` here)."""
        return self.started + self.timeout_s if self.proc else self.next_run

    def poll(self, now: float) -> bool:
        """Start a run when one is due and end one past its timeout; True when `problem`
        changed."""
        if self.proc is None:
            if now >= self.next_run:
                self._start(now)
            return False
        if now - self.started < self.timeout_s:
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.returncode = -signal.SIGKILL  # so Popen never waits for it itself
        # Reaped with gqnode's other children; the timeout is the verdict, whatever it exits.
        return self._verdict(f"health check {self.program} timed out after {self.timeout_s:g}s",
                             now)

    def reaped(self, pid: int, status: int, now: float) -> bool:
        """gqnode reaped `pid`: if it is our run, judge it; True when `problem` changed."""
        if self.proc is None or pid != self.proc.pid:
            return False
        self.proc.returncode = code = os.waitstatus_to_exitcode(status)
        if code == 0:
            return self._verdict("", now)
        line = self._first_line()
        return self._verdict(line or f"health check {self.program} exited {code}", now)

    def _start(self, now: float) -> None:
        self.started = now
        try:
            with open(self.output, "wb") as out:
                self.proc = subprocess.Popen([self.program], stdin=subprocess.DEVNULL, stdout=out,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             close_fds=True, env=self.env)
        except OSError as exc:
            self.proc = None
            self.next_run = now + self.interval_s
            self._set(f"health check {self.program} cannot run: {exc}")

    def _verdict(self, problem: str, now: float) -> bool:
        self.proc = None
        self.next_run = now + self.interval_s
        return self._set(problem)

    def _set(self, problem: str) -> bool:
        changed = problem != self.problem
        if changed:
            if problem:
                log.warning("health check failed: %s", problem)
            else:
                log.info("health check passes again (the node stays drained until resumed)")
        self.problem = problem
        return changed

    def _first_line(self) -> str:
        try:
            with open(self.output, "rb") as f:
                text = f.read(64 * 1024).decode(errors="replace")
        except OSError:
            return ""
        return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:MAX_LINE]
