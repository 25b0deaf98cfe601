"""`gq submit` for typer: its parameters come from gq/spec.py's OPTIONS (as the fast path's
table does); what it does is gq/cli/submission.py's."""

from __future__ import annotations

import inspect
from typing import Any, Optional

import typer

from gq import spec as spec_fields
from gq.cli import submission
from gq.cli.clickcompat import ParameterSource
from gq.cli.clickcompat import UsageError as ClickUsageError
from gq.errors import UsageError


def register(app: typer.Typer) -> None:
    app.command("submit", context_settings={"allow_interspersed_args": False})(submit)
    # gq/cli/main.py hands `gq run` and `gq alloc` to gq/cli/interactive.py before typer;
    # these entries list them in `gq --help`.
    interactive = {"allow_interspersed_args": False, "ignore_unknown_options": True}
    app.command("run", context_settings=interactive)(run)
    app.command("alloc", context_settings=interactive)(alloc)


def run(words: Optional[list[str]] = typer.Argument(
        None, help="gq submit's options, --pty, then the command")) -> int:
    """Run a command in a new job, attached to this terminal (like srun --pty)."""
    from gq.cli import interactive
    return interactive.main("run", list(words or []))


def alloc(words: Optional[list[str]] = typer.Argument(
        None, help="gq submit's options, then the command (default: $SHELL)")) -> int:
    """Hold a new job's allocation while a command runs here (like salloc)."""
    from gq.cli import interactive
    return interactive.main("alloc", list(words or []))


def submit(ctx: typer.Context, **params: Any) -> int:
    """Submit a batch job (like sbatch)."""
    text, default_name = submission.script_text(params["script"], params["wrap"])
    given = {k for k in ctx.params if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    return submission.run(text, default_name, ctx.params, given,
                          lambda words: _parse_words(ctx, words))


def _signature() -> inspect.Signature:
    """submit's parameters as typer reads them from a signature: the script and its arguments,
    then every option of OPTIONS."""
    def param(name: str, annotation: Any, default: Any) -> inspect.Parameter:
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                 annotation=annotation)
    params = [
        param("ctx", typer.Context, inspect.Parameter.empty),
        param("script", Optional[str],
              typer.Argument(None, help="batch script ('-' reads stdin)")),
        param("args", Optional[list[str]],
              typer.Argument(None, help="arguments passed to the script")),
    ]
    for o in spec_fields.OPTIONS:
        kind = o.kind if o.default is not None or o.kind is bool else Optional[o.kind]
        params.append(param(o.dest, kind, typer.Option(o.default, *o.flags, help=o.help,
                                                       metavar=o.metavar, hidden=o.ignored)))
    return inspect.Signature(params)


# typer builds the command from inspect.signature(submit), which reads __signature__ first.
setattr(submit, "__signature__", _signature())  # noqa: B010 (mypy: no attribute on functions)


def _parse_words(ctx: typer.Context, words: list[str]) -> submission.Parsed:
    """Directive words read as `gq submit`'s command line would be."""
    try:
        sub = ctx.command.make_context("submit", words, parent=ctx.parent)
    except ClickUsageError as exc:
        raise UsageError(f"bad directive in the script: {exc.format_message()}") from None
    return sub.params, {k for k in sub.params
                        if sub.get_parameter_source(k) == ParameterSource.COMMANDLINE}
