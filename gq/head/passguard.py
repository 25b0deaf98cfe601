"""The guard around gqd's scheduling pass (docs/RELIABILITY.md "A pass that fails").

A request or a node message that hits a bug costs itself alone (`Head.isolated`); a pass is
different, it reads the whole queue, so a bug in it (a view the scheduler chokes on, a broken
invariant) would raise on every pass and, unguarded, stop gqd and every answer with it. Here a
pass that raises is taken back whole by its transaction (`Head.tx`: store and memory as at the
last commit, its orders dropped), logged with its traceback and counted
(`gq_schedule_pass_failures_total`); what the pass keeps between passes is rebuilt from the
head's state (`Head.reset_pass_caches`), since a half-done sync may have left it inconsistent;
and the next pass waits a backoff that doubles with each failure in a row (a pass that keeps
failing must not take the whole loop: requests are still read and answered between tries). A
pass that succeeds resets the backoff. Nothing accepted is lost: submits, cancels and node
reports are committed in the turn before the pass, never in it.

Tests inject failures with `GQ_TEST_PASS_FAULTS=PATH` in gqd's environment: while the file PATH
exists, each pass runs whole (its starts, its caches' syncs) and then raises, so that what is
taken back is a full pass's work; the test removes the file to clear the fault. The variable is
read once at start, and when unset the pass is not wrapped at all, so production pays nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("gq.head")

#: The first retry's wait after a failed pass, and the most it grows to (seconds).
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
#: gqd's environment variable naming a file whose presence makes passes raise (tests only).
FAULT_ENV = "GQ_TEST_PASS_FAULTS"


class InjectedPassFault(RuntimeError):
    """The failure `GQ_TEST_PASS_FAULTS` asks for."""


class PassGuard:
    def __init__(self) -> None:
        #: Failed passes since gqd started, and in a row (the backoff's exponent).
        self.failures = 0
        self.in_a_row = 0

    def failed(self, exc: BaseException) -> float:
        """A pass raised `exc` (its transaction already rolled back): logged with its traceback;
        returns how long to wait before the next pass."""
        self.failures += 1
        self.in_a_row += 1
        wait = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2 ** (self.in_a_row - 1))
        log.error("scheduling pass failed (%d in a row, %d since start); taken back, next pass "
                  "in %.1fs", self.in_a_row, self.failures, wait,
                  exc_info=(type(exc), exc, exc.__traceback__))
        return wait

    def succeeded(self) -> None:
        if self.in_a_row:
            log.info("scheduling pass succeeded after %d failed", self.in_a_row)
        self.in_a_row = 0


def with_faults(schedule: Callable[[float], None],
                env: dict[str, str] | os._Environ[str] = os.environ
                ) -> Callable[[float], None]:
    """`schedule` itself, or, where the test hook names a file, a pass that raises once it is
    done (inside its transaction: all it did is taken back) while that file exists."""
    path = env.get(FAULT_ENV, "")
    if not path:
        return schedule
    log.warning("%s=%s: scheduling passes fail while that file exists (a test hook)", FAULT_ENV,
                path)

    def faulty(now: float) -> None:
        schedule(now)
        if os.path.exists(path):
            raise InjectedPassFault(f"{FAULT_ENV}: injected pass failure ({path} exists)")
    return faulty
