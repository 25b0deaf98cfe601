"""`gq submit` (and `sbatch`) from its option values: the script, its directives, the job
spec, the request.

Free of typer, so that the fast path (gq/cli/fast.py) and `sbatch` (gq/slurm/sbatch.py) run the
very same code as the typer command (gq/cli/submit.py); each passes its own parser for the
words of directive lines.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from gq import defaults
from gq import spec as spec_fields
from gq.cli.directives import directive_lines, translate_slurm
from gq.errors import ExitStatus, UsageError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

#: The options that steer the command rather than set a field; directives may give them too
#: (but --wrap: a script has its own body).
COMMAND_OPTIONS = ("wait", "test_only", "parsable", "as_json")

if TYPE_CHECKING:
    #: Option values and the names of those given on their line, from a command line's words.
    Parsed = tuple[dict[str, Any], set[str]]


class Unparsed(Exception):
    """Words the fast path's parser leaves to typer (which then reads the whole command)."""


def run(text: str, default_name: str, params: dict[str, Any], given: set[str],
        parse_words: Callable[[list[str]], Parsed], *, slurm: bool = False) -> int:
    """Submit `text` (read by `script_text`) with the command line's option values `params`
    (`given`: those on the command line) and its directives (read by `parse_words`).
    `slurm`: as `sbatch` (Slurm's defaults, output and errors)."""
    if params.get("each_node"):
        text = each_node_script(params.get("wrap"))
    fields, steer, is_slurm = gather(text, params, given, parse_words, slurm)
    spec = build_spec(text, default_name, list(params["args"] or []), fields,
                      slurm=slurm or is_slurm)
    from gq.client import Client
    with Client() as client:
        if steer["test_only"]:
            from gq.cli.testonly import report
            return report(client, spec, slurm)
        reply = client.submit_reply([spec])
        job_id = reply["ids"][0]
        for warning in reply.get("warnings") or ():
            _warn([warning], slurm)
        if steer["parsable"]:
            print(job_id)
        elif steer["as_json"]:
            from gq.cli import render
            render.emit_json({"id": job_id})
        else:
            print(f"Submitted batch job {job_id}")
        sys.stdout.flush()
        if steer["wait"]:
            return exit_code_of(client.wait([job_id])[0])
    return 0


def each_node_script(wrap: str | None) -> str:
    """--each-node: the --wrap command as a job step of one task a node (the batch script
    itself runs once, on the job's first node)."""
    if wrap is None:
        raise UsageError("--each-node runs the --wrap command on each node: give --wrap")
    import shlex  # here: shlex costs every `gq submit` more than its check of the script
    return (f"#!/bin/sh\nexec srun --ntasks-per-node 1 --kill-on-bad-exit=0 /bin/sh -c "
            f"{shlex.quote(wrap)}\n")


def script_text(script: str | None, wrap: str | None, prog: str = "gq submit") -> tuple[str, str]:
    """The batch script's text and the job name it implies."""
    if wrap is not None:
        if script:
            raise UsageError("give either a SCRIPT or --wrap, not both")
        return f"#!/bin/sh\n{wrap}\n", "wrap"
    if script is None or script == "-":
        if script is None and sys.stdin.isatty():
            raise UsageError("nothing to run: give a SCRIPT, '-' for stdin, or --wrap 'COMMAND'")
        return sys.stdin.read(), "stdin" if prog == "gq submit" else "sbatch"
    try:
        with open(script) as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read script {script!r}: {exc}") from None
    if not text.startswith("#!"):
        raise UsageError(f"{script}: this does not look like a batch script: the first line must "
                         "start with #! and an interpreter, e.g. #!/bin/bash")
    return text, os.path.basename(script)


def gather(text: str, params: dict[str, Any], given: set[str],
           parse_words: Callable[[list[str]], Parsed], slurm: bool = False
           ) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """The spec fields the options set, from `#SBATCH`, then `#GQ` lines, then the command line
    (each later one wins, field by field); the values of the options that steer the command;
    and whether the script has `#SBATCH` lines (a Slurm script)."""
    gq_words, slurm_words = directive_lines(text)
    warnings: list[str] = []
    layers = [translate_slurm(slurm_words, warnings), gq_words]
    try:
        parsed = [parse_words(list(words)) for words in layers if words]
    except Unparsed:
        raise  # nothing printed: typer reads the command line again
    except Exception:
        _warn(warnings, slurm)  # before the error, as they come first in the script
        raise
    parsed.append((params, given))
    fields: dict[str, Any] = {}
    steer = {k: params[k] for k in COMMAND_OPTIONS}
    for values, names in parsed:
        fields.update(layer_fields(values, names, warnings))
        steer.update({k: values[k] for k in COMMAND_OPTIONS if k in names})
        if "wrap" in names and values is not params:
            raise UsageError("--wrap in a directive line: a script runs its own body")
    _warn(warnings, slurm)
    return fields, steer, bool(slurm_words)


def layer_fields(values: dict[str, Any], given: set[str], warnings: list[str]
                 ) -> dict[str, Any]:
    """The fields set by the options given on one line (the command line, or a script's
    directives); two of them setting one field differently is an error, an sbatch option gq
    does not use a warning."""
    fields: dict[str, Any] = {}
    source: dict[str, str] = {}
    for o in spec_fields.OPTIONS:
        if o.dest not in given:
            continue
        if o.ignored:
            warnings.append(f"{o.flags[-1]}: sbatch's, not used by gq, ignored")
            continue
        for name, value in o.sets(values[o.dest]).items():
            if name in fields and fields[name] != value:
                raise UsageError(f"{source[name]} and {o.flags[-1]} contradict each other")
            fields[name], source[name] = value, o.flags[-1]
    return fields


def _warn(warnings: list[str], slurm: bool = False) -> None:
    for warning in warnings:
        print(f"{'sbatch' if slurm else 'gq'}: warning: {warning}", file=sys.stderr)
    warnings.clear()


def build_spec(text: str, default_name: str, args: list[str], fields: dict[str, Any],
               slurm: bool = False) -> dict[str, Any]:
    """A job spec (gq.model.JobSpec's wire form) from the fields the options set, made and
    checked as gq/spec.py declares, before anything is sent: gqd checks it again with the
    same words. `slurm`: a Slurm script or an `sbatch` call, which holds no GPU unless it asks
    for one and writes Slurm's output files. Built without the dataclass, whose module would
    cost every `gq submit` more than the rest of its spec."""
    values = dict(fields)
    if "cwd" not in values:
        values["cwd"] = os.getcwd()
    if "env" not in values:
        values["env"] = dict(os.environ)
    if "gpus" not in values:
        # None: gqd works it out, from the GPUs per task or for the job if given, else
        # [scheduler] default_gpus; a Slurm script that asks for none in any form holds none.
        values["gpus"] = 0 if slurm and not spec_fields.GPU_FIELDS & values.keys() else None
    values.setdefault("nodes", None)  # None: as many as the tasks need (gqd decides)
    if slurm and "output" not in values:
        values["output"] = defaults.SLURM_ARRAY_OUTPUT if values.get("array") \
            else defaults.SLURM_OUTPUT
    values.update(script=text, args=args, uid=os.getuid(), gid=os.getgid(),
                  submit_host=os.uname().nodename)
    values["name"] = values.get("name") or default_name
    return spec_fields.check(spec_fields.complete(values))


def exit_code_of(job: dict[str, Any]) -> int:
    """The exit status `--wait` and `gq wait` return for a finished job."""
    if job["exit_code"] is not None:
        return int(job["exit_code"])
    return int(ExitStatus.OK if job["state"] == "COMPLETED" else ExitStatus.JOB_NO_STATUS)
