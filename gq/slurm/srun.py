"""srun inside a job: start a job step (tasks on the allocation's nodes, gq/head/steps.py),
wait for it and exit with its status (the worst of its tasks' exit codes, as Slurm's srun).

Options are Slurm's for a step: -n, -N, --ntasks-per-node, -c, --gpus-per-task, -o, -e,
-K/--kill-on-bad-exit, -l/--label, -w/--nodelist, --jobid, --export, -J; others a script
passes (--exclusive, --wait,
--gpu-bind, --cpu-bind, --mpi, -u ...) are taken and, where gq does nothing with them, left
alone.
Ctrl-C (SIGINT) or SIGTERM ends the step. Outside a job srun is `gq run` (an interactive job
of its own, gq/cli/interactive.py: `srun --pty bash`), as Slurm's srun makes an allocation.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from gq import stepwire
from gq.errors import UnreachableError
from gq.slurm import common, srunio
from gq.slurm.common import Failure

#: How often srun asks how its step is, in seconds: soon at first, then at most this seldom.
POLL_FIRST_S, POLL_MAX_S = 0.05, 0.5


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="srun", add_help=False)
    p.add_argument("--help", action="help")
    p.add_argument("-n", "--ntasks", type=int)
    p.add_argument("-N", "--nodes")
    p.add_argument("--ntasks-per-node", "--tasks-per-node", type=int)  # Slurm takes both
    p.add_argument("-c", "--cpus-per-task", type=int)
    p.add_argument("--gpus-per-task")
    p.add_argument("-o", "--output")
    p.add_argument("-e", "--error")
    p.add_argument("-K", "--kill-on-bad-exit", action="store_true")
    p.add_argument("--export")
    p.add_argument("-J", "--job-name")
    p.add_argument("-l", "--label", action="store_true")
    p.add_argument("-w", "--nodelist")
    p.add_argument("--jobid")
    p.add_argument("--pty", action="store_true")
    for flag in ("--exclusive", "--overlap", "-u", "--unbuffered", "--quiet", "-Q", "-v",
                 "--verbose"):
        p.add_argument(flag, action="store_true", dest=f"ignored_{flag.strip('-')}")
    for valued in ("--gpu-bind", "--cpu-bind", "--mpi", "--distribution", "-m", "--mem",
                   "-t", "--time", "--gres", "-G", "--gpus", "-W", "--wait", "--mem-per-cpu",
                   "--mem-per-gpu", "-p", "--partition", "-A", "--account", "--qos", "-q",
                   # more that real scripts' srun lines pass (srun takes them as sbatch does)
                   "--cpus-per-gpu", "--gpus-per-node", "--ntasks-per-gpu", "--hint",
                   "--mem-bind", "--signal", "--cpu-freq", "--ntasks-per-core",
                   "--threads-per-core", "--gres-flags", "--network", "-C", "--constraint"):
        p.add_argument(valued, dest=f"ignored_{valued.strip('-')}")
    # srun's older spellings, still taken by Slurm 22.05 and still in scripts (`--cpu_bind`)
    for old, new in (("--cpu_bind", "cpu-bind"), ("--mem_bind", "mem-bind")):
        p.add_argument(old, dest=f"ignored_{new}")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _options(p: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """`argv` with Slurm's forms of -K that argparse does not read: its value is optional and
    only ever attached (`-K1`, `--kill-on-bad-exit=0`), so `srun -K prog` runs prog. Only
    srun's own options are looked at, up to the command."""
    valued = {o for a in p._actions if a.option_strings and a.nargs is None
              and a.const is None for o in a.option_strings}

    def kill_on_bad_exit(word: str) -> list[str]:
        m = re.fullmatch(r"(?:-K|--kill-on-bad-exit=)([01])", word)
        return [word] if not m else ["-K"] if m[1] == "1" else []
    return _rewrite(argv, valued, kill_on_bad_exit)


def _rewrite(argv: list[str], valued: set[str], each: Callable[[str], list[str]]
             ) -> list[str]:
    """srun's words with its options (up to the command) rewritten: one that takes a value
    kept with it, each other one as `each` has it; the command as it is."""
    out, i = [], 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "--":
        if argv[i] in valued:
            out += argv[i:i + 2]
            i += 2
            continue
        out += each(argv[i])
        i += 1
    return out + argv[i:]


def _count(text: str | None, what: str) -> int | None:
    """A count option's value (`-N 2`, or Slurm's `2-2`: the least)."""
    if text is None:
        return None
    try:
        value = int(str(text).split("-")[0].rpartition(":")[2])
    except ValueError:
        raise Failure(f"srun: error: invalid {what} {text!r}") from None
    if value < 0:
        raise Failure(f"srun: error: invalid {what} {text!r}")
    return value


def _environment(export: str | None) -> dict[str, str]:
    """The tasks' environment from srun's (--export: ALL, the default; NONE; or NAMES,
    ALL,NAMES or NAME=VALUE items)."""
    env = dict(os.environ)
    if not export or export.upper() == "ALL":
        return env
    items = [i for i in export.split(",") if i]
    keep: dict[str, str] = {} if not any(i.upper() == "ALL" for i in items) else env
    keep = dict(keep)
    for item in items:
        if item.upper() in ("ALL", "NONE"):
            continue
        name, eq, value = item.partition("=")
        if eq:
            keep[name] = value
        elif name in env:
            keep[name] = env[name]
    # What the job itself is (its SLURM_* and GQ_*) always reaches the tasks.
    keep.update({k: v for k, v in env.items() if k.startswith(("SLURM_", "GQ_"))})
    return keep


def request(args: argparse.Namespace) -> dict[str, Any]:
    """The STEP_LAUNCH fields for srun's arguments, in the job of this environment."""
    job = args.jobid or os.environ.get("SLURM_JOB_ID") or os.environ.get("GQ_JOB_ID")
    if not job or not job.isdigit():
        raise Failure("srun: error: no job allocation: srun starts job steps inside a gq job "
                      "(submit one with sbatch or gq submit)")
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        raise Failure("srun: fatal: No command given to execute.")
    ntasks, nodes = args.ntasks, _count(args.nodes, "node count")
    if ntasks is None and nodes is None and args.ntasks_per_node is None:
        inherited = os.environ.get("SLURM_NTASKS")  # the job's -n, as Slurm's srun takes it
        ntasks = int(inherited) if inherited and inherited.isdigit() else None
    kill = args.kill_on_bad_exit
    # The job's own per-task requests are srun's defaults, as Slurm's srun reads them.
    gpus_per_task = args.gpus_per_task or os.environ.get("SLURM_GPUS_PER_TASK")
    cpus_per_task = args.cpus_per_task if args.cpus_per_task is not None else \
        _count(os.environ.get("SLURM_CPUS_PER_TASK"), "SLURM_CPUS_PER_TASK")
    return {"job_id": int(job), "argv": list(args.command),
            "env": _environment(args.export), "cwd": os.getcwd(), "ntasks": ntasks,
            "nodes": nodes, "ntasks_per_node": args.ntasks_per_node,
            "gpus_per_task": _count(gpus_per_task, "--gpus-per-task"),
            "cpus_per_task": cpus_per_task,
            "kill_on_bad_exit": bool(kill),
            "output": _absolute(args.output), "error": _absolute(args.error),
            "name": args.job_name, "label": args.label,
            **({"nodelist": _hosts(args.nodelist)} if args.nodelist else {})}


def _hosts(text: str) -> list[str]:
    """srun -w: a hostlist (`node[1-2],gpu3`), or a file of names when it holds a '/'."""
    from gq.hostlist import expand
    if "/" in text:
        try:
            with open(text) as f:
                text = ",".join(f.read().split())
        except OSError as exc:
            raise Failure(f"srun: error: cannot read the node list file {text}: {exc}") from None
    return expand(text)


def _absolute(path: str | None) -> str | None:
    return None if path is None else os.path.join(os.getcwd(), path)


#: srun's options for steps that mean nothing to a job of its own (`gq run`): left out.
STEP_ONLY = frozenset({"-l", "--label", "-u", "--unbuffered", "-K", "--kill-on-bad-exit",
                       "--overlap", "-Q", "--quiet"})


def outside_a_job(argv: list[str]) -> list[str] | None:
    """srun's words as `gq run`'s when srun runs outside any job (else None)."""
    if os.environ.get("SLURM_JOB_ID") or os.environ.get("GQ_JOB_ID") or any(
            w == "--jobid" or w.startswith("--jobid=") for w in argv):
        return None
    from gq.cli.interactive import RUN_OPTIONS
    valued = {f for flags, _, kind, _ in RUN_OPTIONS if kind is not bool for f in flags}
    return _rewrite(argv, valued, lambda word: [] if word in STEP_ONLY or word.startswith(
        "--kill-on-bad-exit=") else [word])


def run(argv: list[str]) -> int:
    alone = outside_a_job(argv)
    if alone is not None:
        from gq.cli import interactive
        return interactive.main("run", alone, prog="srun")
    p = parser()
    args = p.parse_args(_options(p, argv))
    fields = request(args)
    sys.stdout.flush()
    relays = srunio.route(fields, str(fields["cwd"]), sys.stdout.buffer, sys.stderr.buffer)
    try:
        return _run_step(fields, relays)
    finally:
        for relay in relays:
            relay.close()


def _run_step(fields: dict[str, Any], relays: list[srunio.Relay]) -> int:
    stop: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: stop.append(signum))
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        # `gq cancel --signal USR1` signals the script's process group, srun with it, and
        # each node's step tasks itself: srun goes on waiting for them.
        signal.signal(sig, signal.SIG_IGN)
    with common.client() as client:
        started = client.request(stepwire.STEP_LAUNCH, **fields)
        job_id, step = fields["job_id"], started["step"]
        wait, cancelled = POLL_FIRST_S, False
        while True:
            try:
                if stop and not cancelled:
                    client.request(stepwire.STEP_CANCEL, job_id=job_id, step=step)
                    cancelled = True
                status = client.request(stepwire.STEP_STATUS, job_id=job_id, step=step)
                if status["state"] != "RUNNING":
                    break
            except UnreachableError:
                # gqd restarting: the step goes on (gqd takes it up again); ask again.
                status, wait = {}, POLL_MAX_S
            for relay in relays:
                relay.pump()
            time.sleep(wait)
            wait = min(POLL_MAX_S, wait * 2)
    for relay in relays:
        relay.close()
    relays.clear()
    code = status.get("exit_code")
    if status["state"] == "CANCELLED":
        print(f"srun: error: step {job_id}.{step} was cancelled", file=sys.stderr)
        return 128 + signal.SIGTERM if code in (None, 0) else int(code)
    if code:
        print(f"srun: error: step {job_id}.{step}: a task exited with exit code {code}",
              file=sys.stderr)
    return int(code or 0)


def main(argv: list[str] | None = None) -> int:
    return common.main("srun", run, argv)
