"""salloc: `gq alloc` with Slurm's defaults (a job that asks for no GPU holds none; job name
`interactive`) and messages (`salloc: Granted job allocation N`): hold an allocation while a
command (default: the caller's shell) runs here with the job's environment, so that srun in it
starts steps on the allocated nodes (gq/cli/interactive.py)."""

from __future__ import annotations

from gq.slurm import common


def run(argv: list[str]) -> int:
    from gq.cli import interactive
    return interactive.main("alloc", argv, prog="salloc")


def main(argv: list[str] | None = None) -> int:
    return common.main("salloc", run, argv)
