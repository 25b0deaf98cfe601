"""`gq submit` from its option values: the script, its directives, the job spec, the request.

Free of typer, so that the fast path (gq/cli/fast.py) runs the very same code as the typer
command (gq/cli/submit.py); each passes its own parser for the words of directive lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from gq import spec as spec_fields
from gq.cli.directives import directive_lines, translate_slurm
from gq.errors import UsageError

#: The options that set a spec field: directives may supply their values, and the command
#: line wins over both kinds of line.
SPEC_OPTIONS = tuple((o.field, o) for o in spec_fields.OPTIONS if o.field is not None)
MERGEABLE = tuple(o.dest for _, o in SPEC_OPTIONS)

#: Option values and the names of those given on their line, from a command line's words.
Parsed = tuple[dict[str, Any], set[str]]


class Unparsed(Exception):
    """Words the fast path's parser leaves to typer (which then reads the whole command)."""


def run(text: str, default_name: str, params: dict[str, Any], given: set[str],
        parse_words: Callable[[list[str]], Parsed]) -> int:
    """Submit `text` (read by `script_text`) with the command line's option values `params`
    (`given`: those on the command line) and its directives (read by `parse_words`)."""
    values = merge_directives(text, params, given, parse_words)
    spec = build_spec(text, default_name, list(params["args"] or []), values)
    from gq.client import Client
    with Client() as client:
        job_id = client.submit([spec])[0]
        if params["parsable"]:
            print(job_id)
        elif params["as_json"]:
            from gq.cli import render
            render.emit_json({"id": job_id})
        else:
            print(f"Submitted batch job {job_id}")
        sys.stdout.flush()
        if params["wait"]:
            return exit_code_of(client.wait([job_id])[0])
    return 0


def script_text(script: str | None, wrap: str | None) -> tuple[str, str]:
    """The batch script's text and the job name it implies."""
    if wrap is not None:
        if script:
            raise UsageError("give either a SCRIPT or --wrap, not both")
        return f"#!/bin/sh\n{wrap}\n", "wrap"
    if script is None or script == "-":
        if script is None and sys.stdin.isatty():
            raise UsageError("nothing to run: give a SCRIPT, '-' for stdin, or --wrap 'COMMAND'")
        return sys.stdin.read(), "stdin"
    try:
        with open(script) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read script {script!r}: {exc}") from None
    if not text.startswith("#!"):
        raise UsageError(f"{script}: this does not look like a batch script: the first line must "
                         "start with #! and an interpreter, e.g. #!/bin/bash")
    return text, os.path.basename(script)


def merge_directives(text: str, params: dict[str, Any], given: set[str],
                     parse_words: Callable[[list[str]], Parsed]) -> dict[str, Any]:
    """Option values from `#SBATCH`, then `#GQ` lines, then the command line (last wins)."""
    values = {k: params[k] for k in MERGEABLE}
    gq_words, slurm_words = directive_lines(text)
    warnings: list[str] = []
    layers = [translate_slurm(slurm_words, warnings), gq_words]
    try:
        parsed = [parse_words(list(words)) for words in layers if words]
    except Unparsed:
        raise  # nothing printed: typer reads the command line again
    except Exception:
        _warn(warnings)  # before the error, as they come first in the script
        raise
    _warn(warnings)
    for sub, sub_given in parsed:
        for key in MERGEABLE:
            if key in sub_given and key not in given:
                values[key] = sub[key]
    return values


def _warn(warnings: list[str]) -> None:
    if warnings:
        from gq.cli import render  # not before: a plain submit prints no table
        for warning in warnings:
            render.message(warning)


def build_spec(text: str, default_name: str, args: list[str], v: dict[str, Any]
               ) -> dict[str, Any]:
    """A job spec (gq.model.JobSpec's wire form) from option values, made and checked as
    gq/spec.py declares, before anything is sent: gqd checks it again with the same words.
    Built without the dataclass, whose module would cost every `gq submit` more than the rest
    of its spec."""
    values = {name: o.convert(v[o.dest]) if o.convert else v[o.dest] for name, o in SPEC_OPTIONS}
    values.update(script=text, args=args, uid=os.getuid(), gid=os.getgid())
    values["name"] = values["name"] or default_name
    return spec_fields.check(spec_fields.complete(values))


def exit_code_of(job: dict[str, Any]) -> int:
    """The exit status `--wait` and `gq wait` return for a finished job."""
    if job["exit_code"] is not None:
        return int(job["exit_code"])
    return 0 if job["state"] == "COMPLETED" else 1
