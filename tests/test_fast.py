"""The fast path of `gq submit`, `queue` and `show` reads a command line exactly as typer does,
or leaves it to typer; and it loads neither typer nor rich."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gq.cli import fast

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def commands() -> Any:
    from gq.cli import app
    return app.command().commands


def _table(command: Any) -> list[tuple[tuple[str, ...], str, type, Any]]:
    """(names, parameter, type, default) of a click command's options, as fast.py writes them."""
    from gq.cli.clickcompat import click_types
    out = []
    for p in command.params:
        if p.param_type_name != "option":
            continue
        kind = bool if p.is_flag else {click_types.INT: int, click_types.STRING: str}[p.type]
        out.append((tuple(p.opts), p.name, kind, p.default))
        assert not p.secondary_opts and not p.multiple and p.nargs == 1 and p.envvar is None
    return out


def test_the_tables_are_typers_declarations(commands: Any) -> None:
    assert list(fast.SUBMIT_OPTIONS) == _table(commands["submit"])
    assert list(fast.QUEUE_OPTIONS) == _table(commands["queue"]) == _table(commands["q"])
    assert list(fast.SHOW_OPTIONS) == _table(commands["show"])


def _click_parse(command: Any, words: list[str]) -> tuple[dict[str, Any], set[str], list[str]]:
    """What typer's command makes of `words`: option values, those given, positional words."""
    from gq.cli.clickcompat import ParameterSource
    ctx = command.make_context(command.name, list(words))
    given = {k for k in ctx.params if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    words = ("script", "args", "job")
    positional = [ctx.params[k] for k in ("script", "job") if ctx.params.get(k) is not None] \
        + list(ctx.params.get("args") or [])
    options = {k: v for k, v in ctx.params.items() if k not in words}
    return options, given - set(words), positional


#: Words command lines are made of: options of both commands in every form, values, odd ones.
WORDS = ["--wrap", "true", "-g", "2", "-g2", "--gpus", "--gpus=3", "--gpus=-1", "-g-1", "x",
         "-N", "--nodes=2", "-J", "name", "-Jname", "--name", "-H", "--hold", "-Hg2", "-HJx",
         "--hold=1", "--parsable", "--json", "--wait", "--export=NONE", "-t", "1:00",
         "--time=", "--retries", "0", "--share", "--gpu-mem", "20G", "-a", "0-3", "-d",
         "--", "-", "script.sh", "arg", "--bogus", "-Z", "-h", "--help", "", "=", "-=",
         "--me", "-u", "root", "-t", "pd,r", "--state=R", "-p", "--start", "-ap", "--all",
         "-tPD", "--user", "1_000", " 7", "٣", "12", "12_3"]


#: Command -> its options, whether options may follow words, how many words it takes.
COMMANDS = {"submit": (fast.SUBMIT_OPTIONS, False, range(0, 99)),
            "queue": (fast.QUEUE_OPTIONS, True, range(0, 1)),
            "show": (fast.SHOW_OPTIONS, True, range(1, 2))}


@pytest.mark.parametrize("name", COMMANDS)
def test_every_line_is_read_as_typer_reads_it_or_left_to_typer(commands: Any, name: str) -> None:
    options, interspersed, words_taken = COMMANDS[name]
    from gq.cli.clickcompat import ClickException, Exit
    rng = random.Random(7)
    read = left = 0
    for _ in range(4000):
        words = [rng.choice(WORDS) for _ in range(rng.randint(0, 6))]
        ours = fast.parse(options, words, interspersed)
        if ours is None or len(ours[2]) not in words_taken:  # fast.py leaves it to typer
            left += 1
            continue
        try:
            theirs = _click_parse(commands[name], words)
        except (ClickException, Exit) as exc:
            pytest.fail(f"fast path read {words} as {ours}; typer refuses it: {exc}")
        assert ours == theirs, words
        read += 1
    assert read > 100 and left > 100  # both kinds of line were tried


def test_lines_only_typer_reads_are_left_to_it() -> None:
    for words in (["-h"], ["--help"], ["--hold=yes"], ["-HJx"], ["--name", "-x"], ["-N", "two"],
                  ["--gpus"], ["--no-such"]):
        assert fast.parse(fast.SUBMIT_OPTIONS, words, interspersed=False) is None, words
    assert fast.run(["--color", "never", "queue"]) is None  # global options: typer's
    assert fast.run(["nodes"]) is None
    assert fast.run([]) is None


def test_the_cli_builds_a_spec_with_exactly_jobspecs_fields() -> None:
    """`gq submit` sends JobSpec's wire form without building a JobSpec (gq/cli/submission.py):
    the same keys, and JobSpec reads it back unchanged."""
    import dataclasses

    from gq.cli import submission
    from gq.model import JobSpec
    params = fast.parse(fast.SUBMIT_OPTIONS, ["-t", "1:00:00", "--signal", "B:usr1@30", "--gpu-mem",
                                              "20G", "--share", "-a", "0-3", "x.sh"], False)
    assert params is not None
    spec = submission.build_spec("#!/bin/sh\n", "x.sh", ["a"],
                                 submission.layer_fields(params[0], params[1], []))
    assert list(spec) == [f.name for f in dataclasses.fields(JobSpec)]
    assert JobSpec.from_dict(spec).to_dict() == spec
    assert (spec["time_limit_s"], spec["signal"], spec["array"]) == (3600, "B:USR1@30", "0-3")


#: What the fast path must not load. typer and rich: the point of it; the rest cost `gq submit`
#: and `gq show` more to import than their request takes (docs/BENCHMARKS.md, "The 40 ms CLI"):
#: gq.config's dataclasses (Client reads gq.configfile's few values), `dataclasses` and the
#: `inspect` it imports, tomllib (a config that `gq up` wrote is read without it) and `typing`
#: (which tomllib imports too; gq's modules on this path import it only under TYPE_CHECKING);
#: shlex, which only a script with `#SBATCH`/`#GQ` lines or --each-node needs; json (its
#: decoder and re), which neither the requests nor render.emit_json need; socket.py and its
#: selectors (gq.zmtp uses the C module _socket).
NOT_LOADED = ('typer', 'rich', 'gq.sched', 'gq.cli.app', 'zmq', 'gq.model', 'pathlib',
              'gq.config', 'dataclasses', 'inspect', 'tomllib', 'typing', 'shlex', 'json', 'socket', 'selectors')


@pytest.mark.parametrize("with_config", [False, True])
def test_submit_and_queue_load_neither_typer_nor_rich(tmp_path: Path, with_config: bool) -> None:
    """Without a head to talk to the command fails, but only after the fast path ran it; with
    a config as `gq up` writes one (its endpoint a socket that is not there), after reading it."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "GQ_CONFIG": ""}
    env.pop("GQ_CONFIG")
    if with_config:
        from gq import config as config_mod
        cfg = config_mod.Config()
        cfg.head.client_endpoints = [f"ipc://{tmp_path}/none.sock"]
        (tmp_path / "gq.toml").write_text(config_mod.to_toml(cfg))
        env["GQ_CONFIG"] = str(tmp_path / "gq.toml")
    code = ("import sys\nfrom gq.cli.main import main\n"
            "rc = main(sys.argv[1:])\n"
            f"print(rc, [m for m in {NOT_LOADED!r} if m in sys.modules])\n")
    for args in (["submit", "--parsable", "--hold", "--wrap", "true"], ["queue", "-p"],
                 ["q", "--json", "-t", "pd"], ["show", "12", "--json"], ["show", "12"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=env, cwd=REPO)
        assert proc.stdout.split() == ["3", "[]"], (args, proc.stdout, proc.stderr)
        assert "no gq head is running here" in proc.stderr
        assert not with_config or "none.sock" in proc.stderr  # it read the file's endpoint


def test_the_slurm_commands_take_the_same_path(tmp_path: Path) -> None:
    """sbatch, squeue and scontrol (gq/slurm/) send their requests through the same Client:
    none of what the fast path leaves out is loaded for them either (squeue parses with
    argparse, which it needs)."""
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"),
           "XDG_RUNTIME_DIR": str(tmp_path / "run"), "GQ_CONFIG": ""}
    env.pop("GQ_CONFIG")
    for name, args in (("sbatch", ["-H", "--wrap", "true"]), ("squeue", []),
                       ("scontrol", ["show", "job", "12"])):
        code = (f"import sys\nfrom gq.slurm import {name}\n"
                f"rc = {name}.main(sys.argv[1:])\n"
                f"print(rc, [m for m in {NOT_LOADED!r} if m in sys.modules])\n")
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=env, cwd=REPO)
        assert proc.stdout.split() == ["1", "[]"], (name, proc.stdout, proc.stderr)
        assert "no gq head is running here" in proc.stderr
