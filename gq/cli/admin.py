"""`gq admin`: what sysadmins do to nodes (drain, resume)."""

from __future__ import annotations

import typer

from gq.cli import render

admin = typer.Typer(no_args_is_help=True, help="Node administration (admins only).")


def register(app: typer.Typer) -> None:
    app.add_typer(admin, name="admin")


@admin.command("drain")
def drain(nodes: list[str] = typer.Argument(..., help="node names"),
          reason: str = typer.Option(..., "--reason", "-r", help="why (shown in gq nodes)")) -> int:
    """Take nodes out of scheduling; their running jobs carry on."""
    from gq.client import Client
    with Client() as client:
        done = client.drain(nodes, reason)
    render.message(f"drained {', '.join(done)}")
    return 0


@admin.command("resume")
def resume(nodes: list[str] = typer.Argument(..., help="node names")) -> int:
    """Put drained nodes back into scheduling."""
    from gq.client import Client
    with Client() as client:
        done = client.resume(nodes)
    render.message(f"resumed {', '.join(done)}")
    return 0
