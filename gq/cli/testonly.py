"""`gq submit --test-only` and `sbatch --test-only`: say when and where the job would start,
as sbatch does, and submit nothing."""

from __future__ import annotations

import sys
import time
from typing import Any

from gq.hostlist import compress
from gq.units import parse_iso_time


def local_time(iso: str | None) -> str:
    """Slurm's way of showing a time: local, to the second, without a zone."""
    ts = parse_iso_time(iso)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) if ts is not None else "Unknown"


def line(reply: dict[str, Any]) -> str:
    """sbatch's words for the estimate."""
    if reply["start"] is None:
        return (f"Job {reply['id']} cannot be given a start time now "
                f"({reply.get('reason') or 'Resources'}) in partition {reply['partition']}")
    return (f"Job {reply['id']} to start at {local_time(reply['start'])} using "
            f"{reply['cpus']} processors on nodes {compress(reply['nodes'])} in partition "
            f"{reply['partition']}")


def report(client: Any, spec: dict[str, Any], slurm: bool) -> int:
    """Print the estimate (sbatch: on stderr, with its prefix, as Slurm does) and return 0."""
    reply = client.test_submit(spec)
    prog = "sbatch" if slurm else "gq"
    for warning in reply.get("warnings") or ():
        print(f"{prog}: warning: {warning}", file=sys.stderr)
    if slurm:
        print(f"sbatch: {line(reply)}", file=sys.stderr)
    else:
        print(line(reply))
    return 0
