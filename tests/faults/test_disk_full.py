"""Fault 6: gqd's state directory on a full filesystem: submits are refused, nothing is lost."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gq.cluster import write_config
from tests.conftest import LiveCluster, prepare, running

#: Big enough for gqd's database and WAL with a few jobs, small enough to fill in an instant.
TMPFS_SIZE = "2M"
CHUNK = 64 * 1024


@pytest.fixture
def small_disk_cluster(tmp_path: Path) -> Iterator[tuple[LiveCluster, Path]]:
    """A one-node cluster whose gqd keeps its state on a tmpfs of TMPFS_SIZE."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for gqd's state directory needs root (CI is root)")
    live = prepare(tmp_path)
    state = Path(write_config(live.layout).head.state_dir)
    state.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "gq-faults",
                            str(state)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        with running(live, nodes=1, fake_gpus="1"):
            yield live, state
    finally:
        subprocess.run(["umount", "--lazy", str(state)], check=False)


def _fill(directory: Path) -> Path:
    """Write a file in `directory` until its filesystem has no byte left."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        chunk = b"\0" * CHUNK
        while True:
            try:
                f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    return filler
                chunk = chunk[: len(chunk) // 2]


def _queued(live: LiveCluster) -> list[int]:
    with live.client() as c:
        return [j["id"] for j in c.queue()]


def test_full_disk_refuses_submits_clearly_and_recovers(
        small_disk_cluster: tuple[LiveCluster, Path]) -> None:
    live, state = small_disk_cluster
    # A drained node keeps the jobs queued, so the queue is exactly what was accepted.
    live.gq("admin", "drain", "node1", "--reason", "hold the queue", check=True)
    before = [live.submit("--wrap", "true") for _ in range(5)]
    head = live.head_pid()

    filler = _fill(state)
    refused = live.gq("submit", "--wrap", "true")
    assert refused.returncode == 1, refused
    assert "disk is full" in refused.stderr and "nothing was changed" in refused.stderr, refused.stderr
    assert live.head_pid() == head, "gqd must stay up on a full disk"
    assert _queued(live) == before, "a refused submit must leave no trace"

    filler.unlink()
    after = live.submit("--wrap", "true")
    assert _queued(live) == [*before, after]
    assert live.head_pid() == head
