"""The head lease ([node] head_lease_s; HTCondor's job lease): how long this gqnode may go on
running its jobs without a word from gqd.

Each heartbeat under a lease carries a number; gqd answers it with an Alive of that number, and
the lease then runs to when that heartbeat was *sent* plus head_lease_s. Measured from the send,
a late or queued answer never stretches it: the node's lease always ends before gqd's last
hearing of the node plus head_lease_s, which is what gqd counts from (gq/head/nodes.py) before
it requeues a silent node's jobs. Every timer is time.monotonic().

The lease's end is kept in the state directory (FILE, with the boot it belongs to: monotonic
time means nothing across a reboot), so a restarted gqnode does not grant its adopted jobs a new
lease that gqd never gave, and each shepherd watches it too (`lease_end`): a job stops at the
lease's end even when gqnode itself is dead.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from gq.fsutil import write_atomic

#: Heartbeats sent and not yet answered that are remembered (older ones are forgotten: their
#: answer, were it to come, would renew less than a newer one's).
MAX_UNANSWERED = 64
#: The lease's end, in the node's state directory: "BOOT_ID MONOTONIC_SECONDS".
FILE = "head-lease"
#: Why a run was stopped (its note).
EXPIRED = "head lease expired: no word from gqd for {lease:g}s"
LAPSED = "head lease expired: gqnode renewed it no more"
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot() -> str:
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


class HeadLease:
    def __init__(self, lease_s: float, path: Path, now: float):
        self.lease_s = lease_s
        self.path = path
        self._beat = 0
        #: Heartbeat number -> when it was sent.
        self._sent: dict[int, float] = {}
        #: When the lease runs out (inf: no lease).
        self.until = self._load(now) if lease_s > 0 else math.inf
        if self.on:
            self._save()
        else:  # a lease of an earlier configuration binds no shepherd now
            with contextlib.suppress(OSError):
                path.unlink()

    @property
    def on(self) -> bool:
        return self.lease_s > 0

    def _load(self, now: float) -> float:
        """The lease this boot's last gqnode held; a fresh one if there was none (no gqnode ran
        here under a lease this boot: no lease has been promised to gqd yet)."""
        try:
            boot, until = self.path.read_text().split()
            if boot == _boot():
                return float(until)
        except (OSError, ValueError):
            pass
        return now + self.lease_s

    def beat(self, now: float) -> int:
        """The number of the heartbeat sent now (0: no lease, no answer wanted)."""
        if not self.on:
            return 0
        self._beat += 1
        self._sent[self._beat] = now
        if len(self._sent) > MAX_UNANSWERED:
            del self._sent[min(self._sent)]
        return self._beat

    def answered(self, beat: int) -> bool:
        """gqd answered heartbeat `beat`: True if that renewed the lease."""
        sent = self._sent.get(beat)
        if sent is None:
            return False
        for old in [b for b in self._sent if b <= beat]:
            del self._sent[old]
        if sent + self.lease_s <= self.until:
            return False
        self.until = sent + self.lease_s
        self._save()
        return True

    def _save(self) -> None:
        # No fsync: a host crash ends the boot, and with it what the file means.
        try:
            write_atomic(self.path, f"{_boot()} {self.until!r}\n".encode(), mode=0o600,
                         durable=False)
        except OSError:
            # (a full state disk) A stale end would have the shepherds stop jobs whose lease
            # gqnode renewed: without the file only gqnode enforces the lease, until it can
            # write again.
            with contextlib.suppress(OSError):
                self.path.unlink()

    def expired(self, now: float) -> bool:
        return now >= self.until


def lease_end(state_dir: Path) -> float:
    """When the head lease of the node with this state directory runs out (time.monotonic());
    inf without one (no file: gqnode runs without a lease)."""
    try:
        boot, until = (state_dir / FILE).read_text().split()
        return float(until) if boot == _boot() else math.inf
    except (OSError, ValueError):
        return math.inf
