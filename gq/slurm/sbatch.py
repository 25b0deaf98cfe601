"""sbatch: `gq submit` with Slurm's defaults (no GPU unless asked for, `slurm-%j.out`) and
Slurm's words (`Submitted batch job N`, `--parsable`, `sbatch: error: ...`). Its options are
`gq submit`'s, which are sbatch's (gq/spec.py)."""

from __future__ import annotations

import io
import sys

from gq.cli import fast, submission
from gq.cli.directives import expand_prefixes
from gq.errors import GqError, RefusedError, UsageError
from gq.slurm import common
from gq.slurm.common import Failure
from gq.spec import OPTIONS

TYPE_CHECKING = False  # typing is not imported for the Slurm commands' usual calls
if TYPE_CHECKING:
    from typing import Any


def usage() -> str:
    lines = ["Usage: sbatch [OPTIONS(0)...] [ : [OPTIONS(N)...]] script(0) [args(0)...]",
             "", "gq's sbatch takes gq submit's options (man gq), among them:"]
    for o in OPTIONS:
        if not o.ignored:
            meta = "" if o.kind is bool else f"={o.metavar or o.dest.upper()}"
            lines.append(f"  {', '.join(o.flags)}{meta}\n        {o.help}")
    return "\n".join(lines)


def _words(words: list[str]) -> tuple[dict[str, Any], set[str]]:
    parsed = fast.parse(fast.SUBMIT_OPTIONS, words, interspersed=False)
    if parsed is None or parsed[2]:
        raise UsageError(f"a #SBATCH line sbatch cannot read: {' '.join(words)}")
    return parsed[0], parsed[1]


def run(argv: list[str]) -> int:
    if argv[:1] in (["--help"], ["-h"], ["--usage"]):
        print(usage())
        return 0
    argv = expand_prefixes(argv)  # `--err=e.txt`, as sbatch's getopt_long takes it
    parsed = fast.parse(fast.SUBMIT_OPTIONS, argv, interspersed=False)
    if parsed is None:
        bad = next((w for w in argv if w.startswith("-") and w.split("=")[0] not in
                    {f for o in OPTIONS for f in o.flags}), None)
        raise Failure(f"sbatch: unrecognized option '{bad}'\nTry \"sbatch --help\" for more "
                      "information" if bad else "sbatch: error: cannot read the options "
                      f"{' '.join(argv)} (an option's value missing, or one that looks like "
                      "an option: give it as --opt=VALUE)")
    params, given, positional = parsed
    params["script"] = positional[0] if positional else None
    params["args"] = positional[1:]
    try:
        text, name = submission.script_text(params["script"], params["wrap"], prog="sbatch")
        return submission.run(text, name, params, given, _words, slurm=True)
    except RefusedError as exc:
        raise Failure(f"sbatch: error: Batch job submission failed: {exc}") from None
    except GqError as exc:
        raise Failure(f"sbatch: error: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    if sys.stdin is None:  # pragma: no cover - a daemon's closed stdin
        sys.stdin = io.StringIO("")
    return common.main("sbatch", run, argv)
