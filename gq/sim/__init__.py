"""Replay of job traces through a scheduling policy on a simulated clock, with metrics.

Pure Python: no sockets, no SQL, no clock. `gq sim` (gq/cli/sim.py) is the command-line face.
"""
