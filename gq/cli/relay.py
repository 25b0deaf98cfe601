"""`gq relay`: run the login host's relay (gq/relay.py), a root service (systemd/gq-relay.service)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command("relay", context_settings={"allow_extra_args": True,
                                           "ignore_unknown_options": True},
                add_help_option=False)(relay)


def relay(ctx: typer.Context) -> int:
    """Run this login host's relay: its users' requests to gqd, with the uid the kernel gives
    (options: --config, --name, --log-level; see gq-relay(8))."""
    from gq.relay import main
    return main(list(ctx.args))
