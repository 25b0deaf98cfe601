"""The `gq` command's entry: the fast path or typer, and the one place where what stops a command
(gq's errors, Ctrl-C, a closed pipe) becomes its exit status: gq.errors.end, through which the
Slurm commands (gq/slurm/common.py) end too.

Nothing here imports typer: `gq submit` and `gq queue` usually run without it (gq/cli/fast.py),
`gq run` and `gq alloc` always (gq/cli/interactive.py); every other command line goes to the
typer app (gq/cli/app.py).
"""

from __future__ import annotations

import sys

from gq.errors import GqError, end


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the command; every error becomes its ExitStatus and a one-line message."""
    try:
        words = sys.argv[1:] if argv is None else list(argv)
        if words[:1] in (["run"], ["alloc"]):
            from gq.cli import interactive
            return interactive.main(words[0], words[1:])
        from gq.cli import fast
        result = fast.run(words)
        if result is None:
            from gq.cli import app
            result = app.run(argv)
        # A closed pipe shows here, not in the interpreter's last flush (which would say
        # "Exception ignored" and exit 120).
        sys.stdout.flush()
        return result
    except (GqError, KeyboardInterrupt, OSError) as exc:
        return end(exc, "gq: ")


if __name__ == "__main__":
    sys.exit(main())
