"""`gq admin`: what sysadmins do to nodes (drain, resume), their keys (keygen) and gqd's
database (backup, restore)."""

from __future__ import annotations

from pathlib import Path

import typer

from gq.cli import render

admin = typer.Typer(no_args_is_help=True, help="Node administration (admins only) and keys.")


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


@admin.command("keygen")
def keygen(names: list[str] = typer.Argument(..., help="gqd, or node names (relay names with --relay)"),
           key_dir: str = typer.Option(None, "--dir", help="where (default: [auth] key_dir)"),
           force: bool = typer.Option(False, "--force", help="replace existing key pairs"),
           relay: bool = typer.Option(False, "--relay", help="keys of relays (login hosts' gq relay): they join relays/"),
           kind: str = typer.Option("login", "--kind", help="a relay's kind: login (speaks for the uids it sees) or api (only through tokens)")) -> int:
    """Write CURVE key pairs (secret files 0600); a node's public key joins the allow-list
    (nodes/), a relay's the relays' (relays/)."""
    from pathlib import Path

    from gq import config as config_mod
    from gq import keys
    from gq.errors import UsageError
    if kind != "login" and not relay:
        raise UsageError("--kind is for relays: add --relay")
    where = Path(key_dir or config_mod.load().auth.key_dir)
    for name in names:
        for path in keys.keygen(where, name, force=force, relay=kind if relay else None):
            render.message(f"wrote {path}")
    return 0


def _database() -> Path:
    from gq import config as config_mod
    from gq import defaults
    return Path(config_mod.load().head.state_dir) / defaults.DB_FILE


@admin.command("backup")
def backup(file: str = typer.Argument(..., help="the copy to write (a new file)")) -> int:
    """Copy gqd's database consistently, while it runs (on the head host, as gqd's user)."""
    from gq import storecopy
    held, jobs = storecopy.backup(_database(), Path(file).absolute())
    render.message(f"wrote {file}: {jobs} jobs, job ids up to {held.job_id}, "
                   f"commit {held.commits}")
    return 0


@admin.command("restore")
def restore(file: str = typer.Argument(..., help="a copy made by gq admin backup"),
            force: bool = typer.Option(False, "--force",
                                       help="accept losing what gqd acknowledged after the copy")
            ) -> int:
    """Put a copy in place of gqd's database (gqd stopped); refused if it would roll back
    acknowledged jobs, unless --force."""
    from gq import storecopy, storeguard
    from gq.store import SCHEMA_VERSION
    db = _database()
    held, marked, kept = storecopy.restore(Path(file).absolute(), db, force, SCHEMA_VERSION)
    render.message(f"restored {file} as {db}: job ids up to {held.job_id}, commit {held.commits}")
    if marked is not None and storeguard.behind(held, marked):
        render.message(f"accepted the loss: the mark {storeguard.loss(held, marked)}; new job "
                       f"ids start after {max(marked.job_id, held.job_id)}")
    if kept is not None:
        render.message(f"the database it replaced is kept as {kept}")
    return 0
