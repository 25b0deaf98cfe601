"""Which pending jobs the scheduler may see this pass: holds, `--begin`, dependencies, array limits.

A job held back here is left out of the snapshot with Slurm's reason for it; the rest go to the
pure scheduler, which gives them theirs (`Priority`, `Resources`).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gq.arrays import parse_array
from gq.deps import ParentState, Verdict, evaluate, parse_dependency
from gq.model import Job, JobState

HELD = {"user": "JobHeldUser", "admin": "JobHeldAdmin"}
BEGIN_TIME = "BeginTime"
DEPENDENCY = "Dependency"
NEVER = "DependencyNeverSatisfied"
ARRAY_LIMIT = "JobArrayTaskLimit"

# Every task of an array carries the same strings: parse each once, not once per task per pass.
_dependency = functools.lru_cache(maxsize=4096)(parse_dependency)


@functools.lru_cache(maxsize=1024)
def _throttle(array: str) -> int | None:
    return parse_array(array).throttle


@dataclass
class Screen:
    eligible: list[Job] = field(default_factory=list)
    #: Jobs left out, with their reason.
    waiting: list[tuple[Job, str]] = field(default_factory=list)
    #: Jobs whose dependency can never be met and that asked to be cancelled then.
    invalid: list[Job] = field(default_factory=list)
    #: The earliest `--begin` still ahead: the head must look again then.
    wake_at: float | None = None


@dataclass
class Live:
    """What screening a job needs to know of the whole queue, not only of the jobs screened."""

    #: Array job id -> its running tasks.
    running: Mapping[int, int]
    #: (user, name) -> the smallest id among its live jobs (a singleton dependency waits for
    #: that one), or None.
    first: Callable[[tuple[str, str]], int | None]

    @staticmethod
    def count(jobs: Iterable[Job]) -> Live:
        """Counted afresh from all the live jobs."""
        running: Counter[int] = Counter()
        first: dict[tuple[str, str], int] = {}
        for job in jobs:
            if job.state == JobState.RUNNING and job.array_job_id is not None:
                running[job.array_job_id] += 1
            if not job.state.terminal:
                key = (job.spec.user, job.spec.name)
                first[key] = min(first.get(key, job.id), job.id)
        return Live(running, first.get)


def screen(jobs: Iterable[Job], now: float, parent: Callable[[int], ParentState],
           live: Live | None = None) -> Screen:
    """Sort the pending jobs among `jobs` into eligible and waiting, in the order given. `live`
    tells about the rest of the queue; without it, `jobs` must be all the live jobs."""
    jobs = list(jobs)
    if live is None:
        live = Live.count(jobs)
    running = Counter(live.running)
    out = Screen()
    for job in jobs:
        if job.state != JobState.PENDING:
            continue
        spec = job.spec
        # Most jobs have no hold, --begin or dependency: no call for them (runs for every job).
        reason = _held_back(job, now, parent, live.first) \
            if job.hold or spec.begin_time is not None or spec.dependency else None
        if reason is None and job.array_job_id is not None and spec.array:
            limit = _throttle(spec.array)
            if limit is not None:
                # Admit only as many tasks as may still start; they go in submit order.
                if running[job.array_job_id] >= limit:
                    reason = ARRAY_LIMIT
                else:
                    running[job.array_job_id] += 1
        if reason is None:
            out.eligible.append(job)
            continue
        out.waiting.append((job, reason))
        begin = job.spec.begin_time
        if reason == BEGIN_TIME and begin is not None:  # (BEGIN_TIME is given only with one)
            out.wake_at = begin if out.wake_at is None else min(out.wake_at, begin)
        elif reason == NEVER and job.spec.kill_on_invalid_dep:
            out.invalid.append(job)
    return out


def held_reason(hold: str) -> str:
    """The pending reason of a job held by `hold` ("user", "admin")."""
    return HELD.get(hold, HELD["user"])


def _held_back(job: Job, now: float, parent: Callable[[int], ParentState],
               first_live: Callable[[tuple[str, str]], int | None]) -> str | None:
    if job.hold:
        return held_reason(job.hold)
    if job.spec.begin_time is not None and job.spec.begin_time > now:
        return BEGIN_TIME
    if job.spec.dependency:
        clear = first_live((job.spec.user, job.spec.name)) == job.id
        verdict = evaluate(_dependency(job.spec.dependency), parent, clear)
        if verdict != Verdict.MET:
            return NEVER if verdict == Verdict.NEVER else DEPENDENCY
    return None
