"""`gq events` (the stream of job and node events) and `gq token` (API tokens for gq api)."""

from __future__ import annotations

import json
import time
from typing import Any, Optional

import typer

from gq.cli import query, render
from gq.errors import UsageError

token = typer.Typer(no_args_is_help=True, help="Your API tokens for gq api (docs/API.md).")


def register(app: typer.Typer) -> None:
    app.command("events")(events)
    app.add_typer(token, name="token")


def events(
    follow: bool = typer.Option(False, "-f", "--follow", help="keep printing new events (from now on, without --since)"),
    since: Optional[int] = typer.Option(None, "--since", metavar="SEQ", help="events after this sequence number"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only this user's jobs' (admins: anyone's)"),
    job: Optional[int] = typer.Option(None, "-j", "--job", help="only this job's"),
    array: Optional[int] = typer.Option(None, "--array", metavar="ID", help="only this array's tasks'"),
    kind: Optional[str] = typer.Option(None, "--kind", help="only job or node events"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per line (JSON Lines)"),
) -> int:
    """Print job and node events: state changes with their sequence numbers, oldest first (all
    that are kept, without --follow or --since). Resume from the last SEQ seen with --since."""
    if kind is not None and kind not in ("job", "node"):
        raise UsageError(f"bad --kind {kind!r}: expected job or node")
    with query.client() as client:
        stream = client.events(since, follow, oldest=since is None and not follow, user=user,
                               job=job, array=array, kinds=[kind] if kind else None)
        for event in stream:
            print(json.dumps(event) if as_json else _line(event), flush=follow)
    return 0


def _line(event: dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(event["time"]))
    if event["kind"] == "node":
        what = f"node {event['node']} {event['state']}"
    else:
        held = f" held({event['hold']})" if event["hold"] else ""
        code = f" exit {event['exit_code']}" if event["exit_code"] is not None else ""
        what = f"job {event['job_id']} {event['user']} {event['state']}{held}{code}"
    reason = f" ({event['reason']})" if event.get("reason") else ""
    return f"{event['seq']} {when} {what}{reason}"


@token.command("create")
def create(
    expires: str = typer.Option("30d", "--expires", help="how long it works: 30d, 12h, 90m ..."),
    read_only: bool = typer.Option(False, "--read-only", help="it may only look (list, show, events, output)"),
    name: str = typer.Option("", "--name", help="what it is for (shown in gq token list)"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="admins: a token of this user's"),
    as_json: bool = typer.Option(False, "--json", help="print the token and its record as JSON"),
) -> int:
    """Make an API token that acts as you through gq api; it is shown only now."""
    from gq.units import parse_duration
    seconds = parse_duration(expires if expires[-1:].isalpha() else f"{expires}m")
    if seconds <= 0:
        raise UsageError(f"bad --expires {expires!r}: a token must expire")
    with query.client() as client:
        made = client.token_create(name=name, expires_s=seconds, read_only=read_only, user=user)
    if as_json:
        render.emit_json(made)
    else:
        print(made["token"])
        render.message(f"token {made['id']} ({made['name']}) of {made['user']}, "
                       f"{'read-only, ' if made['read_only'] else ''}expires "
                       f"{_date(made['expires'])}: keep it secret, it is not shown again")
    return 0


@token.command("list")
def listing(
    everyone: bool = typer.Option(False, "-a", "--all", help="admins: every user's tokens"),
    as_json: bool = typer.Option(False, "--json", help="print a JSON document"),
) -> int:
    """List your tokens (never the tokens themselves: gqd keeps only their hashes)."""
    with query.client() as client:
        tokens = client.token_list(everyone)
    if as_json:
        render.emit_json({"schema_version": render.JSON_SCHEMA_VERSION, "tokens": tokens})
        return 0
    render.listing(["ID", "NAME", "USER", "CREATED", "EXPIRES", "ACCESS", "LAST_USED"],
                   [[t["id"], t["name"], t["user"], _date(t["created"]), _date(t["expires"]),
                     "read" if t["read_only"] else "full", _date(t["last_used"])]
                    for t in tokens], False)
    return 0


@token.command("revoke")
def revoke(ids: list[int] = typer.Argument(..., help="token ids (gq token list)")) -> int:
    """Revoke tokens: every request with them is refused from now on."""
    with query.client() as client:
        result = client.token_revoke(ids)
    for raw, why in result["errors"].items():
        render.message(f"token {raw}: {why}")
    if result["done"]:
        render.message(f"revoked {', '.join(map(str, result['done']))}")
    return 1 if result["errors"] else 0


def _date(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if ts else "-"
