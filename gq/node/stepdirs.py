"""Where a node keeps its job steps (gq/node/steps.py): `STATE/steps/J.R.S/`, each with its
shepherd's pid and start time; and how a run's shepherd reaches its run's steps: it stops them
before its time limit stops the job itself (so that they end as stopped, not as failed), and
passes them the job's --signal before it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

from gq.node.runfiles import alive, order_stop

STEPS_DIR = "steps"
PID_FILE = "shepherd"


def step_dir(state_dir: Path, job_id: int, restart: int, step: int) -> Path:
    return state_dir / STEPS_DIR / f"{job_id}.{restart}.{step}"


def read_pid(path: Path) -> tuple[int, float]:
    """The step shepherd's (pid, start time) in its directory; ValueError or OSError if none."""
    pid_text, started_text = (path / PID_FILE).read_text().split()
    return int(pid_text), float(started_text)


def _live(state_dir: Path, job_id: int, restart: int) -> Iterator[tuple[Path, int]]:
    """(directory, shepherd pid) of each live step of run `restart` of the job."""
    with contextlib.suppress(OSError):
        for path in (state_dir / STEPS_DIR).glob(f"{job_id}.{restart}.*"):
            with contextlib.suppress(OSError, ValueError):
                pid, started = read_pid(path)
                if alive(pid, started):
                    yield path, pid


def stop_run(state_dir: Path, job_id: int, restart: int) -> None:
    """SIGTERM to the live step shepherds of run `restart` of the job (no stop order: their
    tasks get SIGTERM, then SIGKILL after the step's grace)."""
    for _, pid in _live(state_dir, job_id, restart):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def signal_run(state_dir: Path, job_id: int, restart: int, signal_name: str) -> None:
    """`signal_name` to the tasks of the run's live steps, which go on (the job's --signal):
    a stop order of the signal alone, then the SIGTERM that makes the shepherd read it."""
    for path, pid in _live(state_dir, job_id, restart):
        with contextlib.suppress(OSError):
            order_stop(path, signal_name, False, None, no_kill=True)
            os.kill(pid, signal.SIGTERM)
