"""The `gq` command's entry: the fast path or typer, and the one place where what stops a command
(gq's errors, Ctrl-C, a closed pipe) becomes its exit status (gq.errors.exit_status).

Nothing here imports typer: `gq submit` and `gq queue` usually run without it (gq/cli/fast.py);
every other command line goes to the typer app (gq/cli/app.py).
"""

from __future__ import annotations

import os
import sys

from gq.errors import GqError, exit_status


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the command; every error becomes its ExitStatus and a one-line message."""
    try:
        from gq.cli import fast
        result = fast.run(sys.argv[1:] if argv is None else list(argv))
        if result is None:
            from gq.cli import app
            result = app.run(argv)
        # A closed pipe shows here, not in the interpreter's last flush (which would say
        # "Exception ignored" and exit 120).
        sys.stdout.flush()
        return result
    except (GqError, KeyboardInterrupt, OSError) as exc:
        status = exit_status(exc)
        if status is None or (isinstance(exc, GqError) and os.environ.get("GQ_TRACEBACK")):
            raise
        if isinstance(exc, GqError):
            print(f"gq: {exc}", file=sys.stderr)
        elif isinstance(exc, OSError):  # `gq queue | head`: stop, silently
            _drop_stdout()
        return int(status)


def _drop_stdout() -> None:
    """Send what is left of standard output to /dev/null, so the interpreter's last flush of
    the closed pipe cannot complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing to redirect
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
