"""scancel: cancel (or `-s` signal) jobs named by id, or by Slurm's filters `-u`, `-t`, `-n`,
`-p`, `-A`, `-q`, `-w`, `--me`. As Slurm 22.05's: a job id that names no job is passed over
silently (named with `-v`) and the exit status stays 0; a malformed id or an unknown user is
an error (exit 1)."""

from __future__ import annotations

import argparse
import pwd
import sys

from gq.slurm import common
from gq.slurm.common import Failure


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scancel", add_help=False)
    p.add_argument("--help", action="help")
    p.add_argument("jobs", nargs="*")
    p.add_argument("-u", "--user")
    p.add_argument("--me", action="store_true")
    p.add_argument("-t", "--state", action="append")
    p.add_argument("-n", "--name", "--jobname")
    p.add_argument("-p", "--partition")
    p.add_argument("-A", "--account")
    p.add_argument("-q", "--qos")
    p.add_argument("-w", "--nodelist")
    p.add_argument("-s", "--signal")
    p.add_argument("-b", "--batch", action="store_true")
    p.add_argument("-f", "--full", action="store_true")
    p.add_argument("-i", "--interactive", action="store_true")
    p.add_argument("-H", "--hurry", action="store_true")
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("-Q", "--quiet", action="store_true")
    return p


def run(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    ids = common.job_ids(args.jobs, "scancel")
    if args.user:
        try:
            pwd.getpwnam(args.user)
        except KeyError:
            raise Failure(f"scancel: error: Invalid user name: {args.user}") from None
    flt = {k: v for k, v in (("user", args.user), ("name", args.name),
                             ("partition", args.partition), ("account", args.account),
                             ("qos", args.qos)) if v}
    if args.state:
        flt["states"] = common.states(args.state, "scancel") or []
    if args.nodelist:
        from gq.hostlist import expand
        flt["nodes"] = expand(args.nodelist)
    if args.me:
        flt["user"] = common.me()
    if not ids and not flt:
        raise Failure("scancel: error: No job identification provided")
    signal = None
    if args.signal:
        from gq.model import parse_signal
        signal = parse_signal(args.signal).name
    with common.client() as c:
        reply = c.cancel(ids, signal=signal, batch_only=args.batch,
                         filter=flt if flt else None)
    status = 0
    for job_id, why in reply["errors"].items():
        # As Slurm's: a job that is not there (or done already) is named only with -v, and
        # the exit status stays 0; any other refusal is said and makes it 1.
        quiet = "does not exist" in why or "already finished" in why
        if args.verbose or not quiet:
            print(f"scancel: error: Kill job error on job id {job_id}: {_slurm_words(why)}",
                  file=sys.stderr)
        status = status or (0 if quiet else 1)
    return status


def _slurm_words(why: str) -> str:
    if "does not exist" in why:
        return "Invalid job id specified"
    if why.startswith("permission denied"):
        return "Access/permission denied"
    if "already finished" in why:
        return "Job/step already completing or completed"
    return why


def main(argv: list[str] | None = None) -> int:
    return common.main("scancel", run, argv)
