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
    return common.parser(
        "scancel", ("-u --user", common.ONE), ("--me", common.FLAG), ("-t --state", common.MANY),
        ("-n --name --jobname", common.ONE), ("-p --partition", common.ONE),
        ("-A --account", common.ONE), ("-q --qos", common.ONE), ("-w --nodelist", common.ONE),
        ("-s --signal", common.ONE), ("-b --batch", common.FLAG), ("-f --full", common.FLAG),
        ("-i --interactive", common.FLAG), ("-H --hurry", common.FLAG),
        ("-v --verbose", common.COUNT), ("-Q --quiet", common.FLAG), positional="jobs")


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
