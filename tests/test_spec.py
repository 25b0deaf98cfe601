"""A job spec is declared once (gq/spec.py), and every form of it agrees with that declaration,
field by field (name, type, default, bounds): the JobSpec dataclass, the protocol's schema, the
fast path's and typer's option tables, the spec `gq submit` builds, gqd's checks and the store's
columns. And JobSpec is frozen: gqd's changes make new specs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shlex
import sys
import types
import typing
from typing import Any

import msgpack
import pytest

from gq import protocol
from gq import spec as spec_fields
from gq.cli import directives, fast, submission
from gq.config import Config
from gq.errors import ProtocolError, UsageError
from gq.head.auth import Caller
from gq.head.core import Head
from gq.model import Job, JobSpec
from gq.spec import FIELDS, NONE, OPTIONS
from gq.store import Store

OWNER = Caller(uid=1000, user="ann", proven=True)
ADMIN = Caller(uid=1000, user="ann", proven=True, admin=True)
T0 = 1_000_000.0
BOUNDED = [f for f in FIELDS if f.bounds is not None]
#: A value of every field unlike its default (and valid), for round trips.
ODD_VALUES: dict[str, Any] = {
    "script": "#!/bin/sh\necho odd\n", "name": "odd", "args": ["-x", "1"], "user": "ann",
    "uid": 1000, "gid": 1001, "cwd": "/tmp/odd", "env": {"A": "1"}, "nodes": 2, "gpus": 3,
    "gpu_type": "h100", "gpu_mem": 20 * 1024**3, "cpus": 5, "mem": 6 * 1024**3,
    "time_limit_s": 700, "qos": "pro", "output": "o-%j", "error": "e-%j", "requeue": False,
    "retries": 0, "signal": "B:USR1@30", "hold": True, "begin_time": 1234.5,
    "dependency": "afterok:1", "kill_on_invalid_dep": True, "array": "0-3%2",
    "account": "vis", "share": True, "submit_host": "login1", "gpus_total": 6,
    "gpus_per_task": 1, "ntasks": 6, "ntasks_per_node": 3, "cpus_per_task": 5,
    "cpus_per_gpu": None, "mem_per_cpu": None, "mem_per_gpu": None, "exclusive": True,
    "partition": "big", "constraint": "a100&nvlink", "nodelist": "node[1-2]",
    "exclude": "node3", "open_mode": "append", "nice": 10, "comment": "odd job",
    "mail_type": "BEGIN,END", "mail_user": "ann@example.org",
    "cache_key": "llama-70b", "cold_wait_s": 90,
}
#: The fields of ODD_VALUES gqd works out itself (gq/tasks.py), which no option sets.
DERIVED = {"cpus"}


@pytest.fixture(scope="module")
def typer_submit() -> Any:
    from gq.cli import app
    return app.command().commands["submit"]


def _head() -> Head:
    """gqd's state machine on an in-memory store, no nodes registered (so no job is refused
    as one no node could hold)."""
    return Head(Config(path=""), Store(":memory:"), T0)


def _head_submit(head: Head, caller: Caller = OWNER, **fields: Any) -> JobSpec:
    raw = {"script": "#!/bin/sh\ntrue\n", "cwd": "/tmp", **fields}
    with head.store.tx():
        reply = head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [raw]}, caller,
                                   None, T0)
    return head.jobs[reply["ids"][0]].spec


def _cli_spec(words: list[str], script: str = "#!/bin/sh\ntrue\n") -> dict[str, Any]:
    """The spec `gq submit WORDS --wrap true` sends (with `script`, its directives), read by
    the fast path's parser."""
    parsed = fast.parse(fast.SUBMIT_OPTIONS, [*words, "--wrap", "true"], interspersed=False)
    assert parsed is not None, words
    fields, _, slurm = submission.gather(script, parsed[0], parsed[1], _directive_words)
    return submission.build_spec(script, "wrap", [], fields, slurm=slurm)


def _directive_words(words: list[str]) -> tuple[dict[str, Any], set[str]]:
    parsed = fast.parse(fast.SUBMIT_OPTIONS, words, interspersed=False)
    assert parsed is not None and not parsed[2], words
    return parsed[0], parsed[1]


def _typer_spec(command: Any, words: list[str]) -> dict[str, Any]:
    """The same, read by typer's command."""
    from gq.cli.clickcompat import ParameterSource
    ctx = command.make_context("submit", [*words, "--wrap", "true"])
    given = {k for k in ctx.params if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    return submission.build_spec("#!/bin/sh\ntrue\n", "wrap", [],
                                 submission.layer_fields(ctx.params, given, []))


@contextlib.contextmanager
def _captured_stderr() -> Any:
    old, sys.stderr = sys.stderr, io.StringIO()
    try:
        yield sys.stderr
    finally:
        sys.stderr = old


def _hint_types(hint: Any) -> set[type]:
    """`int | None` -> {int, NoneType}; `list[str]` -> {list}."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return set().union(*(_hint_types(h) for h in typing.get_args(hint)))
    return {typing.get_origin(hint) or hint}


# ---------------------------------------------------------------- the dataclass


def test_jobspec_has_the_declared_fields_in_order_with_their_types_and_defaults() -> None:
    hints = typing.get_type_hints(JobSpec)
    fields = dataclasses.fields(JobSpec)
    assert [f.name for f in fields] == [f.name for f in FIELDS]
    for f, declared in zip(fields, FIELDS):
        expected = set(declared.types)
        if float in expected:
            expected.discard(int)  # `float` admits an int (PEP 484's numeric tower)
        if declared.filled and declared.default is not None:
            # None on the wire asks gqd to work it out (nodes, gpus), which it does before it
            # makes a JobSpec; absent, it is the default: a JobSpec never holds None there.
            expected.discard(NONE)
        assert _hint_types(hints[f.name]) == expected, f.name
        if declared.required:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        elif f.default_factory is not dataclasses.MISSING:
            assert f.default_factory() == declared.default, f.name
        else:
            assert f.default == declared.default, f.name
    # from_dict fills the same defaults as __init__ does, a fresh list and dict each time.
    a, b = JobSpec.from_dict({"script": "x"}), JobSpec.from_dict({"script": "x", "no": 1})
    assert a == b == JobSpec(script="x") and a.args is not b.args and a.env is not b.env


def test_jobspec_is_frozen_and_a_change_is_a_new_spec() -> None:
    spec = JobSpec(script="x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.gpus = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        JobSpec.from_dict({"script": "x"}).qos = "pro"  # type: ignore[misc]


def test_gq_update_of_one_array_task_leaves_the_spec_its_siblings_share() -> None:
    head = _head()
    _head_submit(head, array="0-2", name="sweep", time_limit_s=3600)
    tasks = sorted(head.jobs.values(), key=lambda j: j.array_index or 0)
    shared = tasks[0].spec
    assert all(t.spec is shared for t in tasks)  # one spec object for the array
    with head.store.tx():
        head.handle_client({"type": protocol.UPDATE, "rid": 2, "ids": [tasks[1].ref],
                            "name": "renamed", "time_limit_s": 600}, OWNER, None, T0)
    assert (tasks[1].spec.name, tasks[1].spec.time_limit_s) == ("renamed", 600)
    assert tasks[1].spec is not shared
    assert (shared.name, shared.time_limit_s) == ("sweep", 3600)  # unchanged in place
    assert tasks[0].spec is shared and tasks[2].spec is shared


# ---------------------------------------------------------------- the protocol


def test_the_protocol_schema_is_the_declaration_and_its_ranges_hold_the_bounds() -> None:
    assert list(protocol.SPEC_SCHEMA) == [f.name for f in FIELDS]
    for f in FIELDS:
        assert protocol.SPEC_SCHEMA[f.name] == (f.types, f.required), f.name
    for f in BOUNDED:
        # The wire never refuses what the check accepts: the check's words decide.
        low, high = f.bounds
        wire_low, wire_high = protocol.RANGES[f.name]
        assert wire_low <= low and high <= wire_high, f.name
        for value in (low, high):
            protocol.check_spec(JobSpec.from_dict({"script": "x", f.name: value}).to_dict())
    protocol.check_spec(JobSpec(script="x").to_dict())  # every default is valid on the wire


# ---------------------------------------------------------------- the CLI


def test_the_fast_table_and_typers_command_are_the_declared_options(typer_submit: Any) -> None:
    assert list(fast.SUBMIT_OPTIONS) == [(o.flags, o.dest, o.kind, o.default) for o in OPTIONS]
    from gq.cli.clickcompat import click_types
    params = [p for p in typer_submit.params if p.param_type_name == "option"]
    assert [p.name for p in params] == [o.dest for o in OPTIONS]
    for p, o in zip(params, OPTIONS):
        kind = bool if p.is_flag else {click_types.INT: int, click_types.STRING: str}[p.type]
        assert (tuple(p.opts), kind, p.default, p.help, p.metavar, p.hidden) == \
            (o.flags, o.kind, o.default, o.help, o.metavar, o.ignored), o.dest
    assert [p.name for p in typer_submit.params if p.param_type_name == "argument"] == \
        ["script", "args"]


def test_every_option_sets_declared_fields_and_every_field_is_set() -> None:
    set_by_options = {name for o in OPTIONS for name in o.fields}
    assert set_by_options <= {f.name for f in FIELDS}
    # The others: the script and its arguments, who submits and from where (the CLI's
    # process, then gqd), and what gqd works out (CPUs per node, from -c or --cpus-per-gpu).
    assert {f.name for f in FIELDS} - set_by_options == {"script", "args", "user", "uid",
                                                         "gid", "submit_host", *DERIVED}
    # sbatch's options gq does not use set nothing; the others that set nothing steer the
    # command (--wrap, --each-node, --wait, --test-only, --parsable, --json).
    assert all(not o.fields for o in OPTIONS if o.ignored)
    assert {o.dest for o in OPTIONS if not o.fields and not o.ignored} == \
        {"wrap", "each_node", *submission.COMMAND_OPTIONS}


def test_a_plain_submit_sends_each_fields_default(typer_submit: Any) -> None:
    """With no options, both parsers give the values whose spec holds every field's declared
    default, but for what `gq submit` takes from its caller (script, directory, environment),
    and None for what gqd works out (nodes and GPUs: from tasks, else its default_gpus)."""
    fast_spec = _cli_spec([])
    assert fast_spec == _typer_spec(typer_submit, [])
    for f in FIELDS:
        if not f.context:
            assert fast_spec[f.name] == (None if f.filled else f.default), f.name


def test_options_become_their_fields(typer_submit: Any) -> None:
    words = ["-g", "3", "-N", "2", "--gpu-type", "H100", "--gpu-mem", "20G", "--share", "-c",
             "5", "--mem", "6G", "-t", "11:40", "-q", "pro", "-J", "odd", "-o", "o-%j", "-e",
             "e-%j", "-D", "/tmp/odd", "--export", "NONE,A=1", "--no-requeue", "--retries", "0",
             "--signal", "b:usr1@30", "-a", "0-3%2", "-d", "afterok:1", "--kill-on-invalid-dep",
             "yes", "-H", "-A", "vis", "-G", "6", "--gpus-per-task", "1", "-n", "6",
             "--ntasks-per-node", "3", "--exclusive", "-p", "big", "-C", "a100&nvlink", "-w",
             "node[1-2]", "-x", "node3", "--open-mode", "append", "--nice", "10", "--comment",
             "odd job", "--mail-type", "begin,end", "--mail-user", "ann@example.org",
             "--cache-key", "llama-70b", "--cold-wait", "90s"]
    spec = _cli_spec(words)
    assert _typer_spec(typer_submit, words) == spec
    expected = {k: v for k, v in ODD_VALUES.items()
                if k not in ("script", "args", "user", "uid", "gid", "begin_time",
                             "submit_host", *DERIVED)}
    assert {k: spec[k] for k in expected} == expected


#: A value each option takes (flags take none), and what it sets.
_SAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpus": ("a100:2", {"gpus": 2, "gpu_type": "a100"}),
    "gpus_total": ("4", {"gpus_total": 4}),
    "gpus_per_task": ("l40s:1", {"gpus_per_task": 1, "gpu_type": "l40s"}),
    "gres": ("gpu:v100:4", {"gpus": 4, "gpu_type": "v100"}),
    "nodes": ("2", {"nodes": 2}), "ntasks": ("8", {"ntasks": 8}),
    "ntasks_per_node": ("4", {"ntasks_per_node": 4}), "cpus": ("6", {"cpus_per_task": 6}),
    "cpus_per_gpu": ("9", {"cpus_per_gpu": 9}), "gpu_type": ("H100", {"gpu_type": "h100"}),
    "gpu_mem": ("40G", {"gpu_mem": 40 << 30}), "mem": ("8G", {"mem": 8 << 30}),
    "mem_per_cpu": ("1G", {"mem_per_cpu": 1 << 30}),
    "mem_per_gpu": ("16G", {"mem_per_gpu": 16 << 30}),
    "partition": ("train", {"partition": "train"}),
    "constraint": ("C6&M12", {"constraint": "C6&M12"}),
    "nodelist": ("n[1-2]", {"nodelist": "n[1-2]"}), "exclude": ("n3", {"exclude": "n3"}),
    "time": ("0-02:00:00", {"time_limit_s": 7200}), "qos": ("high", {"qos": "high"}),
    "name": ("odd", {"name": "odd"}), "output": ("o-%j", {"output": "o-%j"}),
    "error": ("e-%j", {"error": "e-%j"}), "open_mode": ("append", {"open_mode": "append"}),
    "chdir": ("/tmp", {"cwd": "/tmp"}), "export": ("NONE,A=1", {"env": {"A": "1"}}),
    "retries": ("3", {"retries": 3}), "job_signal": ("USR1@60", {"signal": "USR1@60"}),
    "array": ("1-4", {"array": "1-4"}), "dependency": ("afterok:1", {"dependency": "afterok:1"}),
    "kill_on_invalid_dep": ("yes", {"kill_on_invalid_dep": True}),
    "begin": ("2030-01-01T00:00:00", {}), "account": ("vis", {"account": "vis"}),
    "comment": ("hi", {"comment": "hi"}), "nice": ("5", {"nice": 5}),
    "mail_type": ("END,FAIL", {"mail_type": "END,FAIL"}),
    "mail_user": ("a@b.c", {"mail_user": "a@b.c"}),
    "cache_key": ("m1", {"cache_key": "m1"}), "cold_wait": ("2m", {"cold_wait_s": 120}),
    "requeue": ("", {"requeue": True}), "no_requeue": ("", {"requeue": False}),
    "share": ("", {"share": True}), "exclusive": ("", {"exclusive": True}),
    "hold": ("", {"hold": True}),
}


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.fields or o.ignored],
                         ids=lambda o: o.dest)
def test_sbatch_lines_and_the_command_line_take_the_same_options(option: Any) -> None:
    """Done when 4: every option, by each of its names, means the same on the command line,
    in an #SBATCH line and in a #GQ line (an sbatch option gq does not use: accepted by all
    three, with the same warning)."""
    value, sets = _SAMPLES.get(option.dest, ("x", {}))
    if option.kind is bool:
        value = ""
    extra = ["--gpu-mem", "20G", "-g", "1"] if option.dest == "share" else []  # needs them
    plain = _cli_spec(extra)
    for flag in option.flags:
        forms = [[flag]] if option.kind is bool else [[flag, value], [f"{flag}={value}"]
                                                      if flag.startswith("--")
                                                      else [f"{flag}{value}"]]
        for words in forms:
            line = " ".join(shlex.quote(w) for w in words)
            specs = []
            for script, cli in ((f"#!/bin/sh\n#SBATCH {line}\ntrue\n", extra),
                                (f"#!/bin/sh\n#GQ {line}\ntrue\n", extra),
                                ("#!/bin/sh\ntrue\n", [*extra, *words])):
                warnings: list[str] = []
                with _captured_stderr() as err:
                    specs.append(_cli_spec(cli, script))
                warnings = err.getvalue().splitlines()
                assert bool(warnings) == option.ignored, (flag, script, warnings)
            sbatch, gq_line, command_line = specs
            # (An #SBATCH line makes the script Slurm's: no GPU unless asked, Slurm's output.)
            slurm_only = ({"gpus", "output"} - set(sets)) | {"script"}
            assert {k: v for k, v in sbatch.items() if k not in slurm_only} == \
                {k: v for k, v in gq_line.items() if k not in slurm_only} == \
                {k: v for k, v in command_line.items() if k not in slurm_only}, (flag, words)
            assert {k: command_line[k] for k in sets} == sets
            if not sets and not option.ignored:
                assert command_line == plain or option.dest == "begin"


def test_an_unknown_sbatch_option_is_skipped_with_a_warning() -> None:
    warnings: list[str] = []
    assert directives.translate_slurm(["--bogus", "7", "-J", "x", "--frob=1", "--hold"],
                                      warnings) == ["-J", "x", "--hold"]
    assert warnings == ["#SBATCH --bogus 7: not an option gq knows, ignored",
                        "#SBATCH --frob=1: not an option gq knows, ignored"]


def test_sbatch_takes_a_unique_prefix_of_a_long_option_as_getopt_long_does() -> None:
    """A real script's `#SBATCH --err=err` / `--out=out` (sbatch reads them as --error and
    --output): in #SBATCH lines and on sbatch's command line, up to the script; a prefix of
    two options stays what it is (sbatch refuses it; here it is skipped with the warning)."""
    warnings: list[str] = []
    assert directives.translate_slurm(["--err=e.txt", "--out", "o.txt", "--part=gpu", "--nod",
                                       "2"], warnings) == [
        "--error=e.txt", "--output", "o.txt", "--partition=gpu"]
    assert warnings == ["#SBATCH --nod 2: not an option gq knows, ignored"]
    assert directives.expand_prefixes(["--tim=5", "-o", "--out", "--job", "x", "run.sh",
                                       "--err", "y"]) == [
        "--time=5", "-o", "--out", "--job-name", "x", "run.sh", "--err", "y"]
    script = "#!/bin/sh\n#SBATCH --err=e.%j --out=o.%j\ntrue\n"
    with _captured_stderr() as err:
        spec = _cli_spec([], script)
    assert (spec["output"], spec["error"]) == ("o.%j", "e.%j"), err.getvalue()


# ---------------------------------------------------------------- one check, one wording


@pytest.mark.parametrize("field", BOUNDED, ids=lambda f: f.name)
def test_each_bound_is_checked_with_one_wording(field: spec_fields.Field) -> None:
    low, high = field.bounds
    base = spec_fields.complete({"script": "x"})
    for ok in (low, high):
        assert spec_fields.check({**base, field.name: ok})[field.name] == ok
    for bad in (low - 1, high + 1):
        with pytest.raises(UsageError) as info:
            spec_fields.check({**base, field.name: bad})
        assert str(info.value).startswith(f"bad {field.label} {bad}: expected {low}..{high}")


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.kind is int], ids=lambda o: o.dest)
def test_the_cli_and_gqd_refuse_an_integer_out_of_bounds_in_the_same_words(option: Any) -> None:
    field = spec_fields.BY_NAME[option.field]
    low, high = field.bounds
    head = _head()
    caller = ADMIN if field.name == "nice" else OWNER  # only an admin may raise a priority
    for ok in (low, high):
        assert _cli_spec([f"{option.flags[-1]}={ok}"])[field.name] == ok
        assert getattr(_head_submit(head, caller, **{field.name: ok}), field.name) == ok
    for bad in (low - 1, high + 1):
        with pytest.raises(UsageError) as cli:
            _cli_spec([f"{option.flags[-1]}={bad}"])
        wire_low, wire_high = protocol.RANGES[field.name]
        if wire_low <= bad <= wire_high:
            with pytest.raises(UsageError) as head_said:
                _head_submit(head, caller, **{field.name: bad})
            assert str(head_said.value) == str(cli.value)
        else:  # the wire's range is the bound itself: a raw client hears it from the protocol
            with pytest.raises(ProtocolError, match=repr(field.name)):
                _head_submit(head, caller, **{field.name: bad})


@pytest.mark.parametrize("words,raw", [
    (["--share"], {"share": True}),
    (["--share", "--gpu-mem", "20G", "-g", "0"], {"share": True, "gpu_mem": 1 << 34, "gpus": 0}),
    (["--retries", "2", "--no-requeue"], {"retries": 2, "requeue": False}),
    (["-d", "afterwards:1"], {"dependency": "afterwards:1"}),
    (["-a", "9-1"], {"array": "9-1"}),
    (["--signal", "STOP"], {"signal": "STOP"}),
], ids=["share-no-vram", "share-no-gpu", "retries-no-requeue", "dependency", "array", "signal"])
def test_the_cli_and_gqd_refuse_a_bad_spec_in_the_same_words(words: list[str],
                                                             raw: dict[str, Any]) -> None:
    with pytest.raises(UsageError) as cli:
        _cli_spec(words)
    with pytest.raises(UsageError) as head_said:
        _head_submit(_head(), **raw)
    assert str(head_said.value) == str(cli.value)


def test_gqd_fills_its_defaults_then_checks_and_keeps_the_canonical_forms() -> None:
    head = _head()
    parent = _head_submit(head)  # job 1, the one the next depends on
    spec = _head_submit(head, gpu_type="H100", signal="usr1", dependency="afterany:1",
                        array=" 0-3 ")
    assert parent is not spec
    assert (spec.gpu_type, spec.signal, spec.array) == ("h100", "USR1@60", "0-3")
    assert (spec.qos, spec.time_limit_s, spec.retries, spec.user, spec.uid) == \
        ("normal", 24 * 3600, 5, "ann", 1000)
    assert all(f.filled for f in FIELDS if f.name in ("qos", "time_limit_s", "retries"))


# ---------------------------------------------------------------- the store


_SQL_TYPES = {int: "INTEGER", str: "TEXT", float: "REAL"}


def test_the_stores_spec_columns_agree_with_the_fields() -> None:
    store = Store(":memory:")
    columns = {name: (kind, bool(notnull)) for _, name, kind, notnull, _, _ in
               store.conn.execute("PRAGMA table_info(jobs)")}
    # The jobs table's copies of spec fields (filtered and sorted on, updated by `gq update`);
    # its `hold` column is the job's (who holds it), not the spec's --hold.
    spec_columns = [f for f in FIELDS if f.name in columns and f.name != "hold"]
    assert [f.name for f in spec_columns] == ["name", "user", "uid", "nodes", "gpus",
                                              "gpu_type", "time_limit_s", "qos", "partition"]
    assert {f.name for f in dataclasses.fields(Job)} & {f.name for f in FIELDS} == {"hold"}
    for f in spec_columns:
        kind, notnull = columns[f.name]
        (python_type,) = set(f.types) - {NONE}
        assert kind == _SQL_TYPES[python_type], f.name
        # NOT NULL only where no accepted spec holds None (gqd fills `filled` ones in); a
        # job stored before partitions has none (its cluster's default one).
        assert notnull == (NONE not in f.types or (f.filled and f.name in ("qos", "nodes",
                                                                           "gpus"))), f.name
    # A spec with every field unlike its default comes back whole, and its columns hold it.
    job = Job(id=0, spec=JobSpec(**ODD_VALUES), submit_time=T0)
    with store.tx():
        store.add_jobs([job])
    again = store.get_job(job.id)
    assert again is not None and again.spec == job.spec
    row = store.conn.execute(f"SELECT {', '.join(f.name for f in spec_columns)}, spec "
                             "FROM jobs WHERE id = ?", (job.id,)).fetchone()
    assert list(row[:-1]) == [ODD_VALUES[f.name] for f in spec_columns]
    assert list(msgpack.unpackb(row[-1], raw=False)) == [f.name for f in FIELDS]


def test_cold_wait_0_opts_a_keyed_job_out_of_the_default_wait() -> None:
    # 0 is a wait of none (not a bad duration), told apart from no --cold-wait at all (None:
    # the job then waits [scheduler] cold_wait_s).
    assert _cli_spec(["--cache-key", "m1", "--cold-wait", "0"])["cold_wait_s"] == 0
    assert _cli_spec(["--cache-key", "m1", "--cold-wait", "0s"])["cold_wait_s"] == 0
    assert _cli_spec(["--cache-key", "m1"]).get("cold_wait_s") is None
    assert _cli_spec(["--cache-key", "m1"], "#!/bin/sh\n#GQ --cold-wait 0\ntrue\n")[
        "cold_wait_s"] == 0
