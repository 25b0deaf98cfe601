"""The `gq` command: the typer app, and the one place where errors become exit codes."""

from __future__ import annotations

import os
import sys

import typer

from gq.cli import clickcompat as click
from gq.errors import ExitStatus, GqError

app = typer.Typer(
    name="gq", no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
    rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]},
    help="gq: a batch queue for GPU clusters. `gq up` starts a personal cluster on this host.")


@app.callback()
def _global_options(
    color: str = typer.Option("auto", "--color", metavar="WHEN",
                              help="colour: auto (on a terminal, unless NO_COLOR is set), "
                                   "always or never"),
) -> None:
    from gq.cli import render
    from gq.errors import UsageError
    if color not in render.COLOR_MODES:
        raise UsageError(f"bad --color {color!r}: expected auto, always or never")
    render.color_mode = color


_registered = False


def _register() -> None:
    """Add the commands (once): done lazily so `import gq.cli.main` stays cheap."""
    global _registered
    if _registered:
        return
    _registered = True
    from gq.cli import accounting, admin, cluster, jobs, submit
    submit.register(app)
    jobs.register(app)
    accounting.register(app)
    cluster.register(app)
    admin.register(app)
    from gq.cli import sim, watch
    sim.register(app)
    watch.register(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and map every error to its ExitStatus with a one-line message."""
    _register()
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="gq", standalone_mode=False)
    except GqError as exc:
        if os.environ.get("GQ_TRACEBACK"):
            raise
        print(f"gq: {exc}", file=sys.stderr)
        return int(exc.exit_status)
    except click.Abort:
        print("gq: aborted", file=sys.stderr)
        return 130
    except click.ClickException as exc:
        exc.show()
        return int(ExitStatus.USAGE)
    except click.Exit as exc:
        return int(exc.exit_code)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gq queue | head`
        sys.stderr.close()
        return 0
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
