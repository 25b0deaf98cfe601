"""What the Slurm commands share: how they end (Slurm's `prog: error: ...` and exit 1), the
client, and Slurm's ways of showing times, states and resources."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from gq.errors import GqError, UsageError, end
from gq.units import parse_iso_time

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any, NoReturn

    from _typeshed import SupportsWrite

#: gq's states in Slurm's compact form (squeue %t).
SHORT = {"PENDING": "PD", "RUNNING": "R", "COMPLETED": "CD", "FAILED": "F", "CANCELLED": "CA",
         "TIMEOUT": "TO", "NODE_FAIL": "NF", "PREEMPTED": "PR"}
LONG = {short: long for long, short in SHORT.items()}
#: What squeue lists without -t (jobs not yet ended).
LIVE = ("PENDING", "RUNNING")


class Failure(UsageError):
    """A Slurm command's own error: printed as Slurm prints it (the whole line), exit 1 (a
    usage error where gq's own commands meet it: `gq queue -o` with a bad format)."""


def main(prog: str, body: Callable[[list[str]], int], argv: list[str] | None = None) -> int:
    """Run a Slurm command: its errors are one line on stderr and exit status 1, as Slurm's
    (ExitStatus.SLURM_ERROR); a closed pipe and Ctrl-C end it as they end gq's commands."""
    try:
        code = body(sys.argv[1:] if argv is None else list(argv))
        sys.stdout.flush()
        return code
    except (GqError, KeyboardInterrupt, OSError) as exc:
        return end(exc, "" if isinstance(exc, Failure) else f"{prog}: error: ", slurm=True)


#: How `parser` declares an option's value: a flag, one value, values (repeated or comma
#: lists), or how often it is given.
FLAG, ONE, MANY, COUNT = "flag", "one", "many", "count"


def parser(prog: str, *options: tuple[str, str], positional: str | None = None) -> Any:
    """An argparse parser of a Slurm command: `options` as ("-u --user", kind); `--help` only
    (Slurm's `-h` means no header for some); `positional`: the name of its words."""
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            # Slurm's words and status (1), not argparse's usage text and exit 2.
            raise Failure(f"{prog}: {message}\nTry \"{prog} --help\" for more information")

        def print_help(self, file: SupportsWrite[str] | None = None) -> None:
            # argparse's ignores a failed write; a closed pipe must reach main, which ends it.
            if file is not None:
                return super().print_help(file)
            sys.stdout.write(self.format_help())
            sys.stdout.flush()

    p = Parser(prog=prog, add_help=False)
    p.add_argument("--help", action="help")
    if positional:
        p.add_argument(positional, nargs="*")
    actions: dict[str, dict[str, Any]] = {FLAG: {"action": "store_true"}, ONE: {},
                                          MANY: {"action": "append"},
                                          COUNT: {"action": "count", "default": 0}}
    for names, kind in options:
        p.add_argument(*names.split(), **actions[kind])
    return p


def client() -> Any:
    from gq.client import Client
    return Client()


def me() -> str:
    import pwd
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def local(iso: str | None, missing: str = "N/A") -> str:
    """A time as Slurm shows it: local, to the second, no zone."""
    ts = parse_iso_time(iso)
    if ts is None:
        return missing
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def clock(seconds: float | None, pad_hours: bool = False) -> str:
    """Slurm's durations: squeue's `0:02`, `1:02:03`, `2-01:02:03`; with `pad_hours` (sacct,
    scontrol) `00:00:02`."""
    if seconds is None:
        return ""
    whole = max(0, int(seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours or pad_hours:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}" if pad_hours \
            else f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def limit(seconds: int | None, pad_hours: bool = False) -> str:
    return "UNLIMITED" if not seconds else clock(seconds, pad_hours)


def elapsed_s(job: dict[str, Any], now: float) -> float:
    start = parse_iso_time(job.get("start_time"))
    if start is None:
        return 0.0
    return (parse_iso_time(job.get("end_time")) or now) - start


def tasks(job: dict[str, Any]) -> int:
    """Its tasks as Slurm counts them (one a node when it names none)."""
    return int(job.get("ntasks") or job["nodes"])


def cpus(job: dict[str, Any]) -> int:
    """CPUs of the whole job (Slurm counts one a task when none are asked for)."""
    per_node = job.get("cpus_per_node") or -(-tasks(job) // max(1, job["nodes"]))
    return int(per_node) * int(job["nodes"])


def mem_text(nbytes: int) -> str:
    """Slurm's TRES memory: `4000M`, `64G`."""
    mib = nbytes // (1024 * 1024)
    return f"{mib // 1024}G" if mib and mib % 1024 == 0 else f"{mib}M"


def tres(job: dict[str, Any]) -> str:
    """AllocTRES / TRES: `billing=32,cpu=32,gres/gpu=4,mem=64G,node=2`."""
    n = int(job["nodes"])
    parts = [f"billing={cpus(job)}", f"cpu={cpus(job)}"]
    if job["gpus_per_node"]:
        parts.append(f"gres/gpu={job['gpus_per_node'] * n}")
    if job.get("mem_per_node"):
        parts.append(f"mem={mem_text(job['mem_per_node'] * n)}")
    parts.append(f"node={n}")
    return ",".join(parts)


def tres_per_node(job: dict[str, Any]) -> str:
    """squeue %b: `gres:gpu:2`, `gres:gpu:a100:2`, or N/A."""
    if not job["gpus_per_node"]:
        return "N/A"
    kind = f"{job['gpu_type']}:" if job.get("gpu_type") else ""
    return f"gres:gpu:{kind}{job['gpus_per_node']}"


def job_ids(texts: list[str], prog: str) -> list[int | str]:
    """Comma- or space-separated job ids (`12`, `12_3`) as the client takes them."""
    from gq.arrays import parse_ref
    out: list[int | str] = []
    for text in texts:
        for item in text.replace(",", " ").split():
            try:
                out.append(parse_ref(item))
            except GqError:
                raise Failure(f"{prog}: error: Invalid job id {item}") from None
    return out


def split(values: list[str] | None) -> list[str]:
    """Repeated and comma-separated option values as one list."""
    return [v for text in values or () for v in text.split(",") if v]


def states(values: list[str] | None, prog: str) -> list[str] | None:
    """-t/--states: compact or long names, any case; `all`."""
    wanted = [s.upper() for s in split(values)]
    if not wanted or "ALL" in wanted:
        return None if not wanted else list(SHORT)
    out = []
    for s in wanted:
        name = LONG.get(s, s)
        if name not in SHORT:
            raise Failure(f"{prog}: error: Invalid job state specified: {s}")
        out.append(name)
    return out
