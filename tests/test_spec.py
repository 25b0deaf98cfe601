"""A job spec is declared once (gq/spec.py), and every form of it agrees with that declaration,
field by field (name, type, default, bounds): the JobSpec dataclass, the protocol's schema, the
fast path's and typer's option tables, the spec `gq submit` builds, gqd's checks and the store's
columns. And JobSpec is frozen: gqd's changes make new specs."""

from __future__ import annotations

import dataclasses
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
    "account": "vis", "share": True,
}


@pytest.fixture(scope="module")
def typer_submit() -> Any:
    from gq.cli import app
    return app.command().commands["submit"]


def _head() -> Head:
    """gqd's state machine on an in-memory store, no nodes registered (so no job is refused
    as one no node could hold)."""
    return Head(Config(path=""), Store(":memory:"), T0)


def _head_submit(head: Head, **fields: Any) -> JobSpec:
    raw = {"script": "#!/bin/sh\ntrue\n", "cwd": "/tmp", **fields}
    with head.store.tx():
        reply = head.handle_client({"type": protocol.SUBMIT, "rid": 1, "jobs": [raw]}, OWNER,
                                   None, T0)
    return head.jobs[reply["ids"][0]].spec


def _cli_spec(words: list[str]) -> dict[str, Any]:
    """The spec `gq submit WORDS --wrap true` sends, read by the fast path's parser."""
    parsed = fast.parse(fast.SUBMIT_OPTIONS, [*words, "--wrap", "true"], interspersed=False)
    assert parsed is not None, words
    return submission.build_spec("#!/bin/sh\ntrue\n", "wrap", [], parsed[0])


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
        assert (tuple(p.opts), kind, p.default, p.help, p.metavar) == \
            (o.flags, o.kind, o.default, o.help, o.metavar), o.dest
    assert [p.name for p in typer_submit.params if p.param_type_name == "argument"] == \
        ["script", "args"]


def test_every_option_sets_a_declared_field_and_every_field_is_set() -> None:
    set_by_options = [o.field for o in OPTIONS if o.field is not None]
    assert len(set_by_options) == len(set(set_by_options))  # one option per field
    assert set(set_by_options) <= {f.name for f in FIELDS}
    # The others: the script and its arguments, and who submits (the CLI's process, then gqd).
    assert {f.name for f in FIELDS} - set(set_by_options) == {"script", "args", "user", "uid",
                                                                "gid"}


def test_a_plain_submit_sends_each_fields_default(typer_submit: Any) -> None:
    """With no options, both parsers give the values whose spec holds every field's declared
    default, but for what `gq submit` takes from its caller (script, directory, environment)."""
    fast_spec = _cli_spec([])
    ctx = typer_submit.make_context("submit", ["--wrap", "true"])
    typer_spec = submission.build_spec("#!/bin/sh\ntrue\n", "wrap", [], ctx.params)
    assert fast_spec == typer_spec
    for f in FIELDS:
        if not f.context:
            assert fast_spec[f.name] == f.default, f.name


def test_options_become_their_fields(typer_submit: Any) -> None:
    words = ["-g", "3", "-N", "2", "--gpu-type", "H100", "--gpu-mem", "20G", "--share", "-c",
             "5", "--mem", "6G", "-t", "11:40", "-q", "pro", "-J", "odd", "-o", "o-%j", "-e",
             "e-%j", "-D", "/tmp/odd", "--export", "NONE,A=1", "--no-requeue", "--retries", "0",
             "--signal", "b:usr1@30", "-a", "0-3%2", "-d", "afterok:1", "--kill-on-invalid-dep",
             "-H", "-A", "vis"]
    spec = _cli_spec(words)
    ctx = typer_submit.make_context("submit", [*words, "--wrap", "true"])
    assert submission.build_spec("#!/bin/sh\ntrue\n", "wrap", [], ctx.params) == spec
    expected = {k: v for k, v in ODD_VALUES.items()
                if k not in ("script", "args", "user", "uid", "gid", "begin_time")}
    assert {k: spec[k] for k in expected} == expected


def test_sbatch_names_come_from_the_options() -> None:
    longs = {o.flags[-1] for o in OPTIONS}
    for o in OPTIONS:
        for name in o.slurm:
            assert directives._SLURM_NAMES[name] == o.flags[-1]
            value = [] if o.kind is bool else ["7"]
            assert directives.translate_slurm([name, *value], []) == [o.flags[-1], *value]
    assert set(directives._SLURM_NAMES.values()) - {None} <= longs


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
    for ok in (low, high):
        assert _cli_spec([f"{option.flags[-1]}={ok}"])[field.name] == ok
        assert getattr(_head_submit(head, **{field.name: ok}), field.name) == ok
    for bad in (low - 1, high + 1):
        with pytest.raises(UsageError) as cli:
            _cli_spec([f"{option.flags[-1]}={bad}"])
        wire_low, wire_high = protocol.RANGES[field.name]
        if wire_low <= bad <= wire_high:
            with pytest.raises(UsageError) as head_said:
                _head_submit(head, **{field.name: bad})
            assert str(head_said.value) == str(cli.value)
        else:  # the wire's range is the bound itself: a raw client hears it from the protocol
            with pytest.raises(ProtocolError, match=repr(field.name)):
                _head_submit(head, **{field.name: bad})


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
                                              "gpu_type", "time_limit_s", "qos"]
    assert {f.name for f in dataclasses.fields(Job)} & {f.name for f in FIELDS} == {"hold"}
    for f in spec_columns:
        kind, notnull = columns[f.name]
        (python_type,) = set(f.types) - {NONE}
        assert kind == _SQL_TYPES[python_type], f.name
        # NOT NULL only where no accepted spec holds None (gqd fills `filled` ones in).
        assert notnull == (NONE not in f.types or (f.filled and f.name == "qos")), f.name
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
