"""Executables for the Slurm commands in a directory of their own, for PATH: inside a job
(the shepherd puts its node's first, gq/node/slurmenv.py) and for `gq compat`. Each runs gq's
command with the Python gq runs on (`-sE`: the user's site packages and PYTHON* variables,
which a job's environment may carry, cannot break it). Only these eight are in the directory,
so nothing else of gq's (its python) comes before the user's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gq.fsutil import write_atomic

COMMANDS = ("sbatch", "srun", "salloc", "squeue", "scancel", "sinfo", "sacct", "scontrol")


def _text(command: str) -> str:
    return (f"#!{sys.executable} -sE\nimport sys\nfrom gq.slurm.{command} import main\n"
            "sys.exit(main())\n")


def ensure(directory: Path) -> Path:
    """`directory` with an executable per Slurm command, written (atomically) when missing or
    made for another Python; cheap when they are there."""
    for command in COMMANDS:
        _install(directory / command, _text(command), 0o755)
    return directory


def _install(path: Path, text: str, mode: int) -> None:
    """`path` holding `text`, written (atomically) only when it does not already."""
    try:
        if path.read_text() == text:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_atomic(path, text.encode(), mode=mode, durable=False)
    except FileExistsError:
        pass  # another job's shepherd is writing the same file this moment


def bash_env(directory: Path) -> Path:
    """A file for the job's BASH_ENV, beside `directory` (which holds the commands alone):
    bash sources it before a non-interactive script runs, after a login shell's profile
    (`#!/bin/bash -l`: Debian's /etc/profile sets PATH anew), so gq's Slurm commands come
    first on PATH again, as a Slurm site's in /usr/bin stay; then the job's own BASH_ENV."""
    path = directory.parent / f"{directory.name}.bash_env"
    quoted = str(directory).replace("'", "'\\''")
    text = ("# gq: the job's BASH_ENV (gq/slurm/shims.py): its Slurm commands first on PATH\n"
            f"case \":$PATH:\" in *':{quoted}:'*) ;; *) PATH='{quoted}':\"$PATH\" ;; esac\n"
            'if [ -n "${GQ_BASH_ENV-}" ] && [ -z "${GQ_IN_BASH_ENV-}" ]; then\n'
            '  GQ_IN_BASH_ENV=1; . "$GQ_BASH_ENV"; unset GQ_IN_BASH_ENV\nfi\n')
    _install(path, text, 0o644)
    return path


def user_dir() -> Path:
    """Where `gq compat` keeps them: $XDG_DATA_HOME/gq/slurm-bin."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(base) / "gq" / "slurm-bin"
