"""`gq api`: run the HTTP API (gq/api/), a service of its own (systemd/gq-api.service)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("api", context_settings={"allow_extra_args": True,
                                         "ignore_unknown_options": True},
                add_help_option=False)(api)


def api(ctx: typer.Context) -> int:
    """Run the HTTP API for token holders (options: --config, --name, --listen, --log-level;
    see gq-api(8))."""
    from gq.api.main import main
    return main(list(ctx.args))
