"""gq: a small batch queue for GPU clusters, in the spirit of Slurm."""

__version__ = "0.1.0"
