"""The undo journal of gqd's memory: how to take back each change made since the last commit.

The store rolls a failed request back to its savepoint and a failed batch back to the last commit;
memory must follow it, or it says jobs run that the store never heard of (and the old cure, a
reload of everything, cost seconds of silence and every node's registration). So each change to
memory that the store would roll back records here how to undo it, before it is made. A request
takes a `mark()`; a failure rolls back to it (newest first); a commit drops everything.

Only what the store rolls back is journaled: caches checked against what they were made from, and
a node's liveness (when it was last heard from), are left as they are.
"""

from __future__ import annotations

from collections.abc import Callable


class Journal:
    def __init__(self) -> None:
        self._undo: list[Callable[[], object]] = []

    def record(self, undo: Callable[[], object]) -> None:
        """`undo` takes back a change about to be made."""
        self._undo.append(undo)

    def mark(self) -> int:
        """Where a rollback to now starts from."""
        return len(self._undo)

    def rollback(self, mark: int = 0) -> None:
        """Undo every change recorded since `mark`, the newest first."""
        undo = self._undo
        while len(undo) > mark:
            undo.pop()()

    def commit(self) -> None:
        """What was recorded is in the store for good: nothing of it is undone any more."""
        self._undo.clear()

    def __len__(self) -> int:
        return len(self._undo)
