"""`gq submit`, `queue` and `show` without typer: a strict parser for their usual command lines.

Importing typer and building its command tree costs more than the rest of a `gq submit`
(`python -X importtime`), and these commands are the ones scripts call in loops. The parser
takes a subset of what click takes, with the same meaning: long options with `=VALUE` or a
separate value, a short option alone or with its value attached or separate, flags, `--`, and
the words a command takes (submit: a script and its arguments; show: one job). Anything else
(help, a typo, a number that is not one, a value that looks like an option, short flags run
together, global options, shell completion) returns None, and typer reads the command line as
before, so its messages and exit statuses stay the only ones. tests/test_fast.py holds these
tables to typer's declarations and the parser to click's reading.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable

from gq import spec as spec_fields

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

#: (option names, parameter, type, default) of `gq submit`, from its declaration (gq/spec.py),
#: as typer's command has them too; type bool is a flag.
SUBMIT_OPTIONS: tuple[tuple[tuple[str, ...], str, type, Any], ...] = tuple(
    (o.flags, o.dest, o.kind, o.default) for o in spec_fields.OPTIONS)
#: The same for `gq show` and `gq queue` (gq/cli/jobs.py).
SHOW_OPTIONS: tuple[tuple[tuple[str, ...], str, type, Any], ...] = (
    (("--json",), "as_json", bool, False),
    (("-p", "--parsable"), "parsable", bool, False),
)
QUEUE_OPTIONS: tuple[tuple[tuple[str, ...], str, type, Any], ...] = (
    (("--me",), "me", bool, False),
    (("-u", "--user"), "user", str, None),
    (("-t", "--state"), "state", str, None),
    (("-a", "--all"), "all_jobs", bool, False),
    (("--json",), "as_json", bool, False),
    (("-p", "--parsable"), "parsable", bool, False),
    (("--start",), "start", bool, False),
    (("-j", "--jobs"), "jobs", str, None),
    (("-o", "--format"), "fmt", str, None),
)

if TYPE_CHECKING:
    Options = tuple[tuple[tuple[str, ...], str, type, Any], ...]
    #: Option values, the parameters given on the command line, and the positional words.
    Parse = tuple[dict[str, Any], set[str], list[str]]


def run(argv: list[str]) -> int | None:
    """Run `gq submit`, `queue` or `show` if the parser reads this command line; else None."""
    if not argv or "_GQ_COMPLETE" in os.environ:
        return None
    command = _COMMANDS.get(argv[0])
    if command is None:
        return None
    return command(argv[1:])  # its errors (a closed pipe too) are main's to end it with


def parse(options: Options, argv: list[str], interspersed: bool) -> Parse | None:
    """Option values as click would give them, or None where click might differ or fail.
    `interspersed`: options may follow positional words (else the first one ends them)."""
    names = {name: (dest, kind) for flags, dest, kind, _ in options for name in flags}
    values = {dest: default for _, dest, _, default in options}
    given: set[str] = set()
    positional: list[str] = []
    words = iter(argv)
    for word in words:
        if word == "--":
            positional += words
            break
        if word[:1] != "-" or len(word) == 1:  # "-" is a word too (stdin)
            positional.append(word)
            if not interspersed:
                positional += words
                break
            continue
        if word.startswith("--"):
            name, eq, attached = word.partition("=")
            value = attached if eq else None
        else:
            name, value = word[:2], word[2:] or None
        if name not in names:
            return None
        dest, kind = names[name]
        if kind is bool:
            if value is not None:  # `--hold=yes`, or short flags run together
                return None
            values[dest] = True
        else:
            if value is None:
                value = next(words, None)
                if value is None or value[:1] == "-":
                    return None  # click would take "-x" as the value; leave such lines to it
            if kind is int:
                try:
                    values[dest] = int(value)
                except ValueError:
                    return None
            else:
                values[dest] = value
        given.add(dest)
    return values, given, positional


def _submit(argv: list[str]) -> int | None:
    from gq.cli import submission
    parsed = parse(SUBMIT_OPTIONS, argv, interspersed=False)
    if parsed is None:
        return None
    params, given, positional = parsed
    params["script"] = positional[0] if positional else None
    params["args"] = positional[1:]
    text, default_name = submission.script_text(params["script"], params["wrap"])
    try:
        return submission.run(text, default_name, params, given, _directive_words)
    except submission.Unparsed:
        if params["wrap"] is None and params["script"] in (None, "-"):
            sys.stdin = io.StringIO(text)  # typer reads the script from stdin again
        return None


def _directive_words(words: list[str]) -> tuple[dict[str, Any], set[str]]:
    from gq.cli import submission
    parsed = parse(SUBMIT_OPTIONS, words, interspersed=False)
    if parsed is None:
        raise submission.Unparsed(words)
    return parsed[0], parsed[1]


def _queue(argv: list[str]) -> int | None:
    parsed = parse(QUEUE_OPTIONS, argv, interspersed=True)
    if parsed is None or parsed[2]:
        return None  # typer: "Got unexpected extra argument"
    from gq.cli import query
    return query.queue(**parsed[0])


def _show(argv: list[str]) -> int | None:
    parsed = parse(SHOW_OPTIONS, argv, interspersed=True)
    if parsed is None or len(parsed[2]) != 1:
        return None  # typer: a missing or an extra argument
    from gq.cli import query
    return query.show(parsed[2][0], **parsed[0])


_COMMANDS: dict[str, Callable[[list[str]], int | None]] = {
    "submit": _submit, "queue": _queue, "q": _queue, "show": _show}
