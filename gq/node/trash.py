"""Removing finished runs' directories off gqnode's loop.

Deleting a run's directory costs little CPU but can block for ~10 ms on a busy disk, and the loop
that would wait is the one that starts the next jobs. One background thread per process (shared
by `--virtual` nodes) deletes instead. A directory whose removal a stop or crash cuts short is
harmless: its end is acknowledged, so a restarted gqnode reports it again and gqd ignores the
repeat, then acknowledges it and the directory goes.
"""

from __future__ import annotations

import queue
import shutil
import threading
from pathlib import Path

#: Directories to delete, and events to set once those before them are deleted.
_pending: queue.SimpleQueue[Path | threading.Event] = queue.SimpleQueue()
_lock = threading.Lock()
_thread: threading.Thread | None = None


def remove(path: Path) -> None:
    """Delete the directory `path` (and all in it) soon, in the background."""
    global _thread
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_work, name="gqnode-trash", daemon=True)
            _thread.start()
    _pending.put(path)


def flush(timeout_s: float = 30.0) -> None:
    """Wait (at most `timeout_s`) until everything handed to `remove` so far is deleted."""
    with _lock:
        if _thread is None or not _thread.is_alive():
            return
    done = threading.Event()
    _pending.put(done)
    done.wait(timeout_s)


def _work() -> None:
    while True:
        item = _pending.get()
        if isinstance(item, threading.Event):
            item.set()
        else:
            shutil.rmtree(item, ignore_errors=True)
