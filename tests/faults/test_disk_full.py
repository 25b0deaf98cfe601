"""Fault 6: gqd's state directory on a full filesystem: submits are refused, nothing is lost."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from gq.cluster import write_config
from gq.errors import StoreError
from tests.conftest import LiveCluster, prepare, running, wait_for

T = TypeVar("T")

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


def _registrations(live: LiveCluster) -> int:
    return live.log("gqd").count("node node1 registered")


def _read(read: Callable[[], T]) -> T | None:
    """A read of gqd's state, or None when it shared a batch whose commit failed (its reply is
    refused too: it may have seen a change that was taken back)."""
    try:
        return read()
    except StoreError:
        return None


def test_a_failed_commit_keeps_the_nodes_registered_and_every_job(
        small_disk_cluster: tuple[LiveCluster, Path]) -> None:
    """Batches fail to commit while the disk is full (refused submits, then a job's end): gqd
    takes its memory back to the last commit without a reload, so its node stays registered (it
    is never asked to register again) and every job acknowledged before is kept; once space
    returns the end that could not be saved is, and the queue goes on."""
    live, state = small_disk_cluster
    running_job = live.submit("--wrap", "sleep 3")
    live.wait_state(running_job, "RUNNING")
    queued = [live.submit("--wrap", "true") for _ in range(3)]
    registered = _registrations(live)
    filler = _fill(state)
    for _ in range(3):
        refused = live.gq("submit", "--wrap", "true")
        assert refused.returncode == 1 and "nothing was changed" in refused.stderr, refused
    failures = live.log("gqd").count("could not save to its database")
    assert failures >= 3
    # The running job ends while the disk is full: its end cannot be saved (not acked: the
    # node sends it again), and the node's heartbeats go on being heard meanwhile.
    wait_for(lambda: live.log("gqd").count("could not save to its database") > failures + 2,
             "gqd to fail to save the job's end, again and again")
    wait_for(lambda: _read(lambda: [n["state"] for n in live.nodes()]) == ["UP"],
             "node1 to be UP")
    assert _registrations(live) == registered, "a failed commit made the node register again"
    shown = wait_for(lambda: _read(lambda: live.show(running_job)), "gqd to show the job")
    assert shown["state"] == "RUNNING"  # as the store has it: its end is not saved yet
    assert wait_for(lambda: _read(lambda: _queued(live)), "the queue") == [running_job, *queued]

    filler.unlink()
    assert live.wait_state(running_job, "COMPLETED")["exit_code"] == 0
    for job in queued:
        live.wait_state(job, "COMPLETED")
    assert _registrations(live) == registered
