"""The typer app behind `gq`: global options, the commands (registered once), click's errors.

gq/cli/main.py runs it for every command line the fast path (gq/cli/fast.py) leaves alone.
"""

from __future__ import annotations

import sys

import typer

from gq.cli import clickcompat as click
from gq.errors import ExitStatus, exit_status

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


def register() -> None:
    """Add the commands (once): done lazily so `import gq.cli.app` stays cheap."""
    global _registered
    if _registered:
        return
    _registered = True
    from gq.cli import accounting, admin, checkpoint, cluster, jobs, submit
    submit.register(app)
    checkpoint.register(app)
    jobs.register(app)
    accounting.register(app)
    cluster.register(app)
    admin.register(app)
    from gq.cli import api, compat, events, relay, sim, watch
    sim.register(app)
    watch.register(app)
    relay.register(app)
    compat.register(app)
    events.register(app)
    api.register(app)


def command() -> typer.core.TyperGroup:
    """The click command of `gq`, with every sub-command."""
    register()
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)  # (typer makes a group of many commands)
    return group


def run(argv: list[str] | None) -> int:
    """Run a command line through typer; click's own errors become exit statuses here (gq's
    errors, GqError, and a closed pipe go up to main, which ends every command alike)."""
    try:
        result = command().main(args=argv, prog_name="gq", standalone_mode=False)
    except click.Abort:  # Ctrl-C, which click turns into Abort
        print("gq: aborted", file=sys.stderr)
        return int(ExitStatus.INTERRUPTED)
    except click.ClickException as exc:
        exc.show()
        return int(ExitStatus.USAGE)
    except click.Exit as exc:
        return int(exc.exit_code)
    except SystemExit as exc:
        # click ends a closed pipe itself (sys.exit(1) while handling the OSError); main, the
        # one place that says how a command ends, gets it back.
        cause = exc.__context__
        if isinstance(cause, OSError) and exit_status(cause) is ExitStatus.BROKEN_PIPE:
            raise cause from None
        raise
    return int(result) if isinstance(result, int) else 0
