"""`gq compat`: how a user puts gq's Slurm commands (sbatch, squeue, ...) first on PATH.

Nothing is changed for them: they opt in (`eval "$(gq compat)"`), so that gq's commands never
shadow a real Slurm installation by surprise; inside gq's jobs they come first already."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    app.command("compat")(compat)


def compat(directory: Optional[Path] = typer.Option(
        None, "--dir", help="where to put the commands (default: $XDG_DATA_HOME/gq/slurm-bin)"),
) -> int:
    """Print the PATH line that makes sbatch, srun, salloc, squeue, scancel, sinfo, sacct and scontrol
    gq's."""
    from gq.slurm import shims
    where = shims.ensure((directory or shims.user_dir()).resolve())
    for command in shims.COMMANDS:
        other = shutil.which(command, path=os.environ.get("PATH", ""))
        if other and Path(other).resolve().parent != where:
            print(f"gq: note: this puts gq's {command} before {other}", file=sys.stderr)
    print(f"# gq's Slurm commands ({' '.join(shims.COMMANDS)}) are in {where};")
    print("# to use them (in this shell: eval \"$(gq compat)\"), put them first on PATH:")
    print(f'export PATH="{where}:$PATH"')
    return 0
