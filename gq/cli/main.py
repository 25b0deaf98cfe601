"""The `gq` command's entry: the fast path or typer, and the one place where gq's errors become
exit codes.

Nothing here imports typer: `gq submit` and `gq queue` usually run without it (gq/cli/fast.py);
every other command line goes to the typer app (gq/cli/app.py).
"""

from __future__ import annotations

import os
import sys

from gq.errors import GqError


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the command; every error becomes its ExitStatus and a one-line message."""
    try:
        from gq.cli import fast
        result = fast.run(sys.argv[1:] if argv is None else list(argv))
        if result is None:
            from gq.cli import app
            result = app.run(argv)
        return result
    except GqError as exc:
        if os.environ.get("GQ_TRACEBACK"):
            raise
        print(f"gq: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gq queue | head`
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
