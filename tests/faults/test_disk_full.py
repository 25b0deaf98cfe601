"""Fault 6: a full file system. gqd's state directory full: submits are refused, nothing is lost.
A node's state directory full (its jobs filled it): the node takes no new jobs, its running jobs
go on and each end is recorded once with its own exit code, and it takes jobs again by itself
once it has room."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import contextlib
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
#: The node's: its state with a few runs, and the 1 MiB free it needs to take jobs.
NODE_TMPFS_SIZE = "4M"
CHUNK = 64 * 1024


@contextlib.contextmanager
def _small_disk(tmp_path: Path, where: Callable[[LiveCluster], Path], size: str,
                fake_gpus: str) -> Iterator[tuple[LiveCluster, Path]]:
    """A one-node cluster with the directory `where` gives on a tmpfs of `size`."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs for a state directory needs root (CI is root)")
    live = prepare(tmp_path)
    write_config(live.layout)
    state = where(live)
    state.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "gq-faults",
                            str(state)], capture_output=True, text=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        with running(live, nodes=1, fake_gpus=fake_gpus):
            yield live, state
    finally:
        subprocess.run(["umount", "--lazy", str(state)], check=False)


@pytest.fixture
def small_disk_cluster(tmp_path: Path) -> Iterator[tuple[LiveCluster, Path]]:
    """A one-node cluster whose gqd keeps its state on a tmpfs of TMPFS_SIZE."""
    with _small_disk(tmp_path, lambda live: Path(live.config().head.state_dir), TMPFS_SIZE,
                     "1") as made:
        yield made


@pytest.fixture
def small_node_disk(tmp_path: Path) -> Iterator[tuple[LiveCluster, Path]]:
    """A one-node cluster (4 fake GPUs) whose gqnode keeps its state on a tmpfs of
    NODE_TMPFS_SIZE."""
    with _small_disk(tmp_path, lambda live: live.layout.node_dir("node1"), NODE_TMPFS_SIZE,
                     "4") as made:
        yield made


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


#: Waits for `fill`, fills the node's state disk, then waits for its own `go` to exit CODE.
FILLING_JOB = """while [ ! -e {work}/fill ]; do sleep 0.1; done
dd if=/dev/zero of={state}/filler.$GQ_JOB_ID bs=64k 2>/dev/null
touch {work}/filled.$GQ_JOB_ID
while [ ! -e {work}/go.$GQ_JOB_ID ]; do sleep 0.1; done
exit {code}"""


def _node(live: LiveCluster) -> dict:
    return next(n for n in live.nodes() if n["name"] == "node1")


def test_jobs_filling_the_node_disk_keep_their_results_and_the_node_comes_back(
        small_node_disk: tuple[LiveCluster, Path]) -> None:
    live, state = small_node_disk
    codes = [11, 12, 13, 14]
    jobs = [live.submit("-g", "1", "--wrap",
                        FILLING_JOB.format(work=live.work, state=state, code=code))
            for code in codes]
    for job in jobs:
        live.wait_state(job, "RUNNING")
    (live.work / "fill").touch()
    wait_for(lambda: all((live.work / f"filled.{j}").exists() for j in jobs),
             "the jobs to fill the node's disk")

    node = wait_for(lambda: (n := _node(live))["state"] == "DRAIN" and n, "node1 to be drained")
    assert node["reason"].startswith("node state disk full: "), node
    waiting = live.submit("-g", "1", "--wrap", "true")
    assert all(live.show(j)["state"] == "RUNNING" for j in jobs), "a full disk stops no job"

    # Two jobs end while gqnode is down (their shepherds write their status on the full disk),
    # two after it is back (their ends cannot go to its outbox: sent from memory).
    os.kill(live.node_pid("node1"), signal.SIGKILL)
    wait_for(lambda: live.node_pid("node1") is None, "gqnode to die")
    for job in jobs[:2]:
        (live.work / f"go.{job}").touch()
    wait_for(lambda: all(live.run_ended("node1", j) for j in jobs[:2]),
             "two jobs to end while gqnode is down")
    live.gq("up", check=True)
    for job in jobs[2:]:
        (live.work / f"go.{job}").touch()

    ended = [live.wait_state(j, "FAILED", "COMPLETED", "NODE_FAIL", "CANCELLED") for j in jobs]
    assert [(j["state"], j["exit_code"], j["restart_count"]) for j in ended] == [
        ("FAILED", code, 0) for code in codes], "each its own code, none requeued"
    log = live.log("gqd")
    assert all(log.count(f"job {j} FAILED (exit {c})") == 1 for j, c in zip(jobs, codes)), \
        "each end recorded once"
    assert "cannot write the outbox ([Errno 28] No space left on device" in live.log("node1")
    assert live.show(waiting)["state"] == "PENDING", "no new job on a full node"
    assert _node(live)["state"] == "DRAIN"
    # That reason is gqnode's to give (and gqd's to lift): no admin's drain can take it.
    posed = live.gq("admin", "drain", "node1", "--reason", "node state disk full: not really")
    assert posed.returncode != 0 and "gqnode's own" in posed.stderr, posed

    for filler in state.glob("filler.*"):
        filler.unlink()
    wait_for(lambda: _node(live)["state"] == "UP", "node1 to take jobs again by itself")
    done = live.wait_state(waiting, "COMPLETED", "FAILED")
    assert (done["state"], done["node_list"], done["restart_count"]) == ("COMPLETED", ["node1"], 0)


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
