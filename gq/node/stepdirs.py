"""Where a node keeps its job steps (gq/node/steps.py): `STATE/steps/J.R.S/`, each with its
shepherd's pid and start time; and how a run's shepherd stops its run's steps before it stops
the job itself (its time limit), so that they end as stopped, not as failed."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from gq.node.runfiles import alive

STEPS_DIR = "steps"
PID_FILE = "shepherd"


def step_dir(state_dir: Path, job_id: int, restart: int, step: int) -> Path:
    return state_dir / STEPS_DIR / f"{job_id}.{restart}.{step}"


def read_pid(path: Path) -> tuple[int, float]:
    """The step shepherd's (pid, start time) in its directory; ValueError or OSError if none."""
    pid_text, started_text = (path / PID_FILE).read_text().split()
    return int(pid_text), float(started_text)


def stop_run(state_dir: Path, job_id: int, restart: int) -> None:
    """SIGTERM to the live step shepherds of run `restart` of the job (no stop order: their
    tasks get SIGTERM, then SIGKILL after the step's grace)."""
    with contextlib.suppress(OSError):
        for path in (state_dir / STEPS_DIR).glob(f"{job_id}.{restart}.*"):
            with contextlib.suppress(OSError, ValueError):
                pid, started = read_pid(path)
                if alive(pid, started):
                    os.kill(pid, signal.SIGTERM)
