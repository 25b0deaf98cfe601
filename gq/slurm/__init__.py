"""Slurm's commands over gq.client: sbatch, squeue, scancel, sinfo, sacct, scontrol.

They take Slurm's flags and print Slurm's formats (checked against Slurm 22.05's own output in
tests/test_slurm_commands.py), so that scripts and habits made for Slurm work. Each is a thin
module over the client: no typer, no rich, so each starts about as fast as `gq submit`.
Inside a gq job they come first on PATH (gq/node/slurmenv.py); elsewhere a user opts in
(`gq compat` prints the PATH line), so they never shadow a real Slurm by surprise.
"""
