"""gqnode's durable outbox: each report is a file until the head acks its sequence number."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack

from gq.fsutil import write_atomic


class Outbox:
    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)
        self._entries: dict[int, dict[str, Any]] = {}
        for path in sorted(self.dir.glob("*.msg")):
            try:
                self._entries[int(path.stem)] = msgpack.unpackb(path.read_bytes(), raw=False)
            except (ValueError, msgpack.UnpackException):
                path.unlink()  # a torn write from a crash before rename cannot happen; junk can
        # Sequence numbers only grow, across restarts too: start past both the files and the clock.
        self._next = max([*self._entries, int(time.time() * 1000)]) + 1
        self._sent_at: dict[int, float] = {}

    def put(self, body: dict[str, Any]) -> int:
        seq = self._next
        self._next += 1
        entry = {**body, "seq": seq}
        write_atomic(self.dir / f"{seq:016d}.msg", msgpack.packb(entry, use_bin_type=True))
        self._entries[seq] = entry
        return seq

    def due(self, now: float, resend_after: float) -> list[dict[str, Any]]:
        """Entries never sent, or sent longer than `resend_after` seconds ago without an ack."""
        out = []
        for seq, entry in sorted(self._entries.items()):
            if now - self._sent_at.get(seq, -1e18) >= resend_after:
                self._sent_at[seq] = now
                out.append(entry)
        return out

    def ack(self, seq: int) -> dict[str, Any] | None:
        entry = self._entries.pop(seq, None)
        self._sent_at.pop(seq, None)
        if entry is not None:
            (self.dir / f"{seq:016d}.msg").unlink(missing_ok=True)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        """The reports not yet acknowledged, oldest first."""
        return [self._entries[seq] for seq in sorted(self._entries)]

    def __len__(self) -> int:
        return len(self._entries)

