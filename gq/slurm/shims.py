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
        path = directory / command
        text = _text(command)
        try:
            if path.read_text() == text:
                continue
        except OSError:
            pass
        directory.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(path, text.encode(), mode=0o755, durable=False)
        except FileExistsError:
            pass  # another job's shepherd is writing the same file this moment
    return directory


def user_dir() -> Path:
    """Where `gq compat` keeps them: $XDG_DATA_HOME/gq/slurm-bin."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                           "share")
    return Path(base) / "gq" / "slurm-bin"
