"""Exit statuses come from one mapping (gq.errors.exit_status), and a closed pipe ends every
command alike (141, as a shell reports a tool that SIGPIPE ended), on gq's fast path and typer's
and from the Slurm commands: real `gq`, `squeue` ... processes writing into real pipes."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

from pathlib import Path

import pytest

from gq.errors import (ConfigError, ExitStatus, GqError, NotFoundError, ProtocolError,
                       RefusedError, StoreBehind, UnreachableError, UsageError, exit_status,
                       start_status)
from tests.conftest import LiveCluster, wait_for

GQ = [sys.executable, "-m", "gq.cli.main"]


def test_one_mapping_from_errors_to_exit_statuses() -> None:
    assert exit_status(UsageError("x")) is ExitStatus.USAGE is exit_status(ConfigError("x"))
    assert exit_status(UnreachableError("x")) is ExitStatus.UNREACHABLE
    for refused in (GqError("x"), RefusedError("x"), NotFoundError("x"), ProtocolError("x")):
        assert exit_status(refused) is ExitStatus.REFUSED
    assert exit_status(KeyboardInterrupt()) is ExitStatus.INTERRUPTED == 130
    assert exit_status(BrokenPipeError()) is ExitStatus.BROKEN_PIPE == 141
    assert exit_status(OSError(errno.EPIPE, "Broken pipe")) is ExitStatus.BROKEN_PIPE
    # A Slurm command: 1 for any error of gq's, as Slurm's; the rest as gq's.
    for error in (UsageError("x"), UnreachableError("x"), NotFoundError("x")):
        assert exit_status(error, slurm=True) is ExitStatus.SLURM_ERROR == 1
    assert exit_status(BrokenPipeError(), slurm=True) is ExitStatus.BROKEN_PIPE
    assert exit_status(KeyboardInterrupt(), slurm=True) is ExitStatus.INTERRUPTED
    # A daemon that cannot start: 1, but a refused database's own status (gqd(8)).
    assert start_status(ConfigError("x")) == start_status(OSError()) == ExitStatus.START_FAILED
    assert start_status(StoreBehind("x")) == ExitStatus.STORE_BEHIND == 14
    assert exit_status(OSError(errno.ENOSPC, "full")) is None  # not gq's: a traceback
    assert exit_status(ValueError()) is None


def _into_closed_pipe(cluster: LiveCluster, *command: str, unbuffered: bool = False
                      ) -> subprocess.CompletedProcess[str]:
    """`command` with its stdout a pipe nobody reads any more: every write fails (EPIPE), at
    the write itself when `unbuffered` (PYTHONUNBUFFERED), else when the buffer is flushed."""
    env = {k: v for k, v in cluster.env.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(list(command), env=env, cwd=cluster.work, stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)


def _slurm_commands(tmp_path: Path) -> Path:
    """The Slurm commands' executables, as `gq compat` and jobs get them."""
    from gq.slurm import shims
    return shims.ensure(tmp_path / "slurm-bin")


def test_a_closed_pipe_ends_every_command_with_one_status(cluster: LiveCluster,
                                                           tmp_path: Path) -> None:
    job = str(cluster.submit("--hold", "--wrap", "true"))
    done = str(cluster.submit("--wrap", "true"))
    cluster.wait_state(int(done), "COMPLETED")
    # The fast path (gq/cli/fast.py) reads submit, queue and show lines like these; `--color`
    # (a global option) sends the same commands to typer; the rest are typer's anyway.
    lines = {
        "fast submit": ["submit", "--parsable", "--hold", "--wrap", "true"],
        "typer submit": ["--color", "never", "submit", "--hold", "--wrap", "true"],
        "fast queue": ["queue"], "fast queue --json": ["queue", "--json"],
        "typer queue": ["--color", "never", "queue"],
        "fast show": ["show", job], "typer show": ["--color", "never", "show", job, "--json"],
        "history": ["history"], "nodes": ["nodes"], "report": ["report"],
        "history": ["history"], "history --json": ["history", "--json"],
        "nodes": ["nodes"], "nodes --json": ["nodes", "--json"], "report": ["report"],
        "help": ["--help"], "submit help": ["submit", "--help"],
    }
    commands = {what: [*GQ, *args] for what, args in lines.items()}
    bin_dir = _slurm_commands(tmp_path)
    for what, args in {"sbatch": ["--parsable", "-H", "--wrap", "true"], "squeue": [],
                       "squeue --start": ["--start"], "sacct": [], "sinfo": [],
                       "scontrol show job": ["show", "job", job], "sbatch help": ["--help"],
                       "squeue help": ["--help"]}.items():
        commands[what] = [str(bin_dir / what.split()[0]), *args]
    # The daemons' --help (argparse would ignore the failed write and exit 0).
    for daemon in ("gq.head.daemon", "gq.node.main", "gq.relay", "gq.api.main"):
        commands[f"{daemon} --help"] = [sys.executable, "-m", daemon, "--help"]
    for what, command in commands.items():
        for unbuffered in (False, True):
            proc = _into_closed_pipe(cluster, *command, unbuffered=unbuffered)
            # Silently: no traceback, no "Exception ignored" from the interpreter's last flush.
            assert (proc.returncode, proc.stderr) == (ExitStatus.BROKEN_PIPE, ""), (
                what, unbuffered)


def test_listings_into_head_1_with_many_jobs(cluster: LiveCluster, tmp_path: Path) -> None:
    """The shell's `gq queue | head -1`, `squeue | head -1` ...: head exits after a line while
    the command is still writing (listings well past the pipe's 64 KiB)."""
    spec = cluster.spec("#!/bin/sh\ntrue\n", hold=True, name="held-for-a-long-listing")
    with cluster.client() as c:
        ids = c.submit([spec] * 1500)
    bin_dir = _slurm_commands(tmp_path)
    queued = {"fast queue": [*GQ, "queue"], "typer queue": [*GQ, "--color", "never", "queue"],
              "queue --json": [*GQ, "queue", "--json"], "squeue": [str(bin_dir / "squeue")]}
    ended = {"history": [*GQ, "history"], "history --json": [*GQ, "history", "--json"],
             "sacct": [str(bin_dir / "sacct")]}
    for listings in (queued, ended):
        if listings is ended:  # cancelled, the same jobs are the history's
            with cluster.client() as c:
                c.cancel(list(ids))
            wait_for(lambda: len(cluster.gq("history", "--json").stdout) > 256 * 1024,
                     "the cancelled jobs in the history")
        for what, command in listings.items():
            proc = subprocess.run(["bash", "-c", '"$@" | head -1; exit "${PIPESTATUS[0]}"',
                                   "bash", *command], env=cluster.env, cwd=cluster.work,
                                  capture_output=True, text=True, timeout=60)
            assert len(proc.stdout.splitlines()) == 1, (what, proc.stdout[:200])
            assert (proc.returncode, proc.stderr) == (ExitStatus.BROKEN_PIPE, ""), what
            # Read to the end, the same listing exits 0: the status above is the pipe's; and
            # it is half again the pipe's 64 KiB, so the command was still writing.
            whole = subprocess.run(command, env=cluster.env, cwd=cluster.work,
                                   capture_output=True, text=True, timeout=60)
            assert whole.returncode == 0 and len(whole.stdout) > 96 * 1024, (
                what, len(whole.stdout), whole.stderr)


def test_slurm_commands_refuse_bad_options_as_slurm_does(tmp_path: Path) -> None:
    """Slurm's words and status 1 (argparse's would be its usage text and 2)."""
    bin_dir = _slurm_commands(tmp_path)
    for command in ("squeue", "sacct", "sinfo", "scancel", "sbatch"):
        proc = subprocess.run([str(bin_dir / command), "--no-such-option"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == ExitStatus.SLURM_ERROR == 1, (command, proc.stderr)
        assert proc.stderr.startswith(f"{command}: unrecognized") and \
            f'Try "{command} --help"' in proc.stderr, proc.stderr
