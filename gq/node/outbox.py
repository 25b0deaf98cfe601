"""gqnode's durable outbox: each report is kept in a file until the head acks its sequence number.

Reports put during one turn of gqnode's loop are written together, as one file, before the loop
sends (`commit`; `due` offers only what commit has seen): one fsync covers a burst of job starts
and ends instead of one each, and on a healthy disk nothing is sent before it is on disk. A
report put but not yet committed is lost with gqnode; the run's directory (its status file,
written durably by the shepherd) is what a restarted gqnode re-derives such a report from.

When the disk is full, a commit fails and its reports are kept in memory instead, offered by
`due` all the same (gqd's ack, not the disk, is what ends a report), and written by the first
later commit that succeeds. Until then a restarted gqnode re-derives them as above.

It holds typed reports (gq.messages.Report) and writes their wire forms; a file's entries are
read back as gqd reads a report (checked, then typed), older gqnodes' files too (one report a
file, or entries written as maps of the same keys). An entry that does not read as a report is
dropped with a log line (and a file of none removed).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

import msgpack

from gq.declare import READERS
from gq.errors import ProtocolError
from gq.fsutil import write_atomic
from gq.messages import REPORT, Report

log = logging.getLogger("gq.node")


class Outbox:
    def __init__(self, directory: Path):
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._entries: dict[int, Report] = {}
        #: File name -> sequence numbers in it not yet acked; the file goes with the last ack.
        self._files: dict[str, set[int]] = {}
        #: Seq -> the file that holds it.
        self._file_of: dict[int, str] = {}
        #: Put, not yet on disk nor sent.
        self._staged: list[Report] = []
        #: Seq -> entry of those a commit failed to write (also in _entries, offered by `due`).
        self._unwritten: dict[int, Report] = {}
        for path in sorted(self.dir.glob("*.msg")):
            try:
                data = msgpack.unpackb(path.read_bytes(), raw=False)
                # One report per file (as older gqnodes wrote), or a committed group of them.
                entries = data if isinstance(data, list) else [data]
                if not all(isinstance(e, dict) and isinstance(e.get("seq"), int) for e in entries):
                    raise ValueError("not reports")
            except (ValueError, msgpack.UnpackException):
                path.unlink()  # a torn write from a crash before rename cannot happen; junk can
                continue
            reports = [r for r in map(_read, entries) if r is not None]
            if reports:
                self._add_file(path.name, reports)
            else:
                path.unlink()
        # Sequence numbers only grow, across restarts too: start past both the files and the clock.
        self._next = max([*self._entries, int(time.time() * 1000)]) + 1
        self._sent_at: dict[int, float] = {}

    def _add_file(self, name: str, entries: list[Report]) -> None:
        self._files[name] = {e.seq for e in entries}
        for entry in entries:
            self._entries[entry.seq] = entry
            self._file_of[entry.seq] = name

    def put(self, report: Report) -> int:
        """Queue a report (its seq given here); it is written (with the others of this turn)
        before it is sent."""
        seq = self._next
        self._next += 1
        self._staged.append(dataclasses.replace(report, seq=seq))
        return seq

    def commit(self) -> None:
        """Write the reports put since the last commit, and those an earlier commit could not
        write and gqd has not acked yet, as one durable file. On an OSError (a full disk) they
        are kept in memory, offered by `due` all the same, and the error is raised."""
        batch = [*self._unwritten.values(), *self._staged]  # in seq order: older ones first
        if not batch:
            return
        self._staged = []
        name = f"{batch[0].seq:016d}.msg"
        try:
            write_atomic(self.dir / name, msgpack.packb([e.wire() for e in batch],
                                                        use_bin_type=True), mode=0o600)
        except OSError:
            for entry in batch:
                self._entries[entry.seq] = self._unwritten[entry.seq] = entry
            raise
        self._unwritten.clear()
        self._add_file(name, batch)

    @property
    def unwritten(self) -> int:
        """How many reports gqd has not acked are only in memory (their commit failed)."""
        return len(self._unwritten)

    def due(self, now: float, resend_after: float) -> list[Report]:
        """Committed entries (written or kept in memory) never sent, or sent longer than
        `resend_after` seconds ago without an ack."""
        out = []
        for seq, entry in sorted(self._entries.items()):
            if now - self._sent_at.get(seq, -1e18) >= resend_after:
                self._sent_at[seq] = now
                out.append(entry)
        return out

    def ack(self, seq: int) -> Report | None:
        entry = self._entries.pop(seq, None)
        self._sent_at.pop(seq, None)
        self._unwritten.pop(seq, None)
        name = self._file_of.pop(seq, None)
        if name is not None:
            left = self._files[name]
            left.discard(seq)
            if not left:
                del self._files[name]
                (self.dir / name).unlink(missing_ok=True)
        return entry

    def entries(self) -> list[Report]:
        """The reports not yet acknowledged, oldest first (those not yet committed last)."""
        return [*(self._entries[seq] for seq in sorted(self._entries)), *self._staged]

    def __len__(self) -> int:
        return len(self._entries) + len(self._staged)


def _read(entry: dict[str, Any]) -> Report | None:
    """A report of a file's entry, checked as gqd checks one (None, logged: not a report)."""
    try:
        report: Report = READERS[REPORT](entry)
        return report
    except ProtocolError as exc:
        log.warning("dropping outbox entry %s: %s", entry.get("seq"), exc)
        return None
