"""Exit statuses come from one mapping (gq.errors.exit_status), and a closed pipe ends every
command alike, on the fast path and typer's: real `gq` processes writing into real pipes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from gq.errors import (ConfigError, ExitStatus, GqError, NotFoundError, ProtocolError,
                       RefusedError, UnreachableError, UsageError, exit_status)
from tests.conftest import LiveCluster

GQ = [sys.executable, "-m", "gq.cli.main"]


def test_one_mapping_from_errors_to_exit_statuses() -> None:
    assert exit_status(UsageError("x")) is ExitStatus.USAGE is exit_status(ConfigError("x"))
    assert exit_status(UnreachableError("x")) is ExitStatus.UNREACHABLE
    for refused in (GqError("x"), RefusedError("x"), NotFoundError("x"), ProtocolError("x")):
        assert exit_status(refused) is ExitStatus.REFUSED
    assert exit_status(KeyboardInterrupt()) is ExitStatus.INTERRUPTED == 130
    assert exit_status(BrokenPipeError()) is ExitStatus.BROKEN_PIPE == 1
    assert exit_status(OSError(errno.EPIPE, "Broken pipe")) is ExitStatus.BROKEN_PIPE
    assert exit_status(OSError(errno.ENOSPC, "full")) is None  # not gq's: a traceback
    assert exit_status(ValueError()) is None


def _into_closed_pipe(cluster: LiveCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`gq ARGS` with its stdout a pipe nobody reads any more: every write fails (EPIPE)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*GQ, *args], env=cluster.env, cwd=cluster.work, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)


def test_a_closed_pipe_ends_every_command_with_one_status(cluster: LiveCluster) -> None:
    job = str(cluster.submit("--hold", "--wrap", "true"))
    # The fast path (gq/cli/fast.py) reads submit, queue and show lines like these; `--color`
    # (a global option) sends the same commands to typer; the rest are typer's anyway.
    lines = {
        "fast submit": ["submit", "--parsable", "--hold", "--wrap", "true"],
        "typer submit": ["--color", "never", "submit", "--hold", "--wrap", "true"],
        "fast queue": ["queue"], "fast queue --json": ["queue", "--json"],
        "typer queue": ["--color", "never", "queue"],
        "fast show": ["show", job], "typer show": ["--color", "never", "show", job, "--json"],
        "history": ["history"], "nodes": ["nodes"], "report": ["report"],
        "help": ["--help"], "submit help": ["submit", "--help"],
    }
    for what, args in lines.items():
        proc = _into_closed_pipe(cluster, *args)
        # Silently: no traceback, no "Exception ignored" from the interpreter's last flush.
        assert (proc.returncode, proc.stderr) == (ExitStatus.BROKEN_PIPE, ""), what


@pytest.mark.parametrize("path", ["fast", "typer"])
def test_gq_queue_into_head_1_with_many_jobs(cluster: LiveCluster, path: str) -> None:
    """The shell's `gq queue | head -1`: head exits after a line while gq is still writing
    (a listing well past the pipe's 64 KiB)."""
    spec = cluster.spec("#!/bin/sh\ntrue\n", hold=True, name="held-for-a-long-listing")
    with cluster.client() as c:
        c.submit([spec] * 1500)
    args = ["queue"] if path == "fast" else ["--color", "never", "queue"]
    proc = subprocess.run(["bash", "-c", '"$@" | head -1; exit "${PIPESTATUS[0]}"', "bash",
                           *GQ, *args], env=cluster.env, cwd=cluster.work,
                          capture_output=True, text=True, timeout=60)
    assert len(proc.stdout.splitlines()) == 1 and "JOBID" in proc.stdout, proc.stdout[:200]
    assert (proc.returncode, proc.stderr) == (ExitStatus.BROKEN_PIPE, "")
    # Read to the end, the same listing exits 0: the status above is the pipe's.
    whole = cluster.gq(*args)
    assert whole.returncode == 0 and len(whole.stdout) > 128 * 1024
