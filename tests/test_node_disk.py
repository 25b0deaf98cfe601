"""gqnode's verdict on its state disk: full after a write failed for want of space, or with too
little free; room again only with enough free and every report written."""

from __future__ import annotations

import errno
from pathlib import Path

from gq.node.disk import StateDisk


def test_only_a_want_of_space_makes_the_disk_full_and_it_stays_so_until_there_is_room(
        tmp_path: Path) -> None:
    disk = StateDisk(tmp_path, min_free=1)
    assert disk.problem == ""
    assert not disk.failed(OSError(errno.EIO, "I/O error")), "a broken disk is another fault"
    assert disk.problem == ""
    assert disk.failed(OSError(errno.ENOSPC, "No space left on device"))
    assert disk.problem == f"No space left on device on {tmp_path}"
    # As much free as when the write failed is not room: that write would fail again.
    assert not disk.check(writes_ok=True) and disk.problem
    disk.need = 1  # as if min_free more had been freed since
    assert not disk.check(writes_ok=False) and disk.problem, "reports still wait to be written"
    assert disk.check(writes_ok=True) and disk.problem == ""


def test_a_disk_with_less_free_than_the_minimum_is_full(tmp_path: Path) -> None:
    disk = StateDisk(tmp_path, min_free=1 << 60)
    assert disk.problem == f"under 1048576T free on {tmp_path}"
