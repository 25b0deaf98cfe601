"""What the CLI prints, without a cluster: `--json` documents byte for byte as
`json.dumps(indent=2)` writes them, and long tables as plain text even on a terminal."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from gq.cli import render
from gq.model import Job, JobSpec


def _value(rng: random.Random, depth: int = 0) -> Any:
    """Anything a document may hold: JSON's types, odd strings, odd keys, tuples."""
    pick = rng.random()
    if depth > 3 or pick < 0.5:
        return rng.choice([None, True, False, 0, -7, 2**70, 3.25, -0.0, float("inf"),
                           float("nan"), "", "plain", "quote\" back\\slash", "new\nline",
                           "\x00\x1f\u2028", "é日本", "\ud800"])
    if pick < 0.75:
        return rng.choice([list, tuple])(_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    keys = ["k", "é", "x y", 1, None, 2.5, True]
    return {rng.choice(keys) if rng.random() < 0.2 else f"k{rng.randint(0, 9)}":
            _value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def test_json_documents_are_exactly_what_json_dumps_writes(capsys: pytest.CaptureFixture) -> None:
    rng = random.Random(11)
    jobs = [Job(id=i, spec=JobSpec(script="x", name=f"n{i}", cwd="/w", array="0-3%2"),
                alloc={"node1": [0, 1]} if i % 2 else {}).to_json() for i in range(1, 50)]
    # Lists of dicts: the same keys in another order, odd keys, values of every kind.
    dicts = [{"a": 1, "b": "x"}, {"b": None, "a": [1, {"c": 2}]}, {"b": 2.5, "a": {}},
             {1: "one"}, {1: None}, {}, {"a": True, "b": ()}, [{"a": 1}], "s", None]
    for doc in [{"schema_version": 1, "jobs": jobs}, dicts,
                *(_value(rng) for _ in range(3000))]:
        render.emit_json(doc)
        assert capsys.readouterr().out == json.dumps(doc, indent=2) + "\n"


def test_long_tables_are_plain_text_on_a_terminal_too(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(render, "_is_tty", lambda: True)
    monkeypatch.setattr(render, "console", lambda: pytest.fail("rich drew a long table"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("GQ_PLAIN", raising=False)
    rows = [[i, f"job{i}", None] for i in range(render.RICH_MAX_ROWS + 1)]
    render.table(["ID", "NAME", "NOTE"], rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ID    NAME     NOTE"  # no colour asked for: no escape sequences
    assert lines[1] == "0     job0" and lines[-1] == f"{len(rows) - 1}  job{len(rows) - 1}"
    assert len(lines) == len(rows) + 1
    monkeypatch.delenv("NO_COLOR")
    render.table(["ID"], [[1]] * (render.RICH_MAX_ROWS + 1))
    assert capsys.readouterr().out.startswith("\x1b[1mID\x1b[0m\n1\n")
