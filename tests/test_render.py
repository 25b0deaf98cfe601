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


def test_show_and_history_print_peak_memory_and_cpu_time_as_sacct_does() -> None:
    from gq.cli.accounting import HISTORY_COLUMNS, _history_row, summarize
    assert render.cpu_time(None) is None
    assert render.cpu_time(83.4567) == "01:23.457"
    assert render.cpu_time(7322.0) == "02:02:02"
    job = {"id": 5, "name": "t", "user": "u", "qos": "normal", "priority": 1,
           "state": "OUT_OF_MEMORY", "reason": "out of memory", "exit_code": 137,
           "time_limit_s": 60, "submit_time": "2026-01-01T00:00:00Z",
           "start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-01T00:00:10Z",
           "nodes": 1, "gpus_per_node": 1, "gpu_type": None, "node_list": ["n1"],
           "gpu_ids": {"n1": [0]}, "retries": None, "max_rss": 100 << 20, "total_cpu_s": 1.5}
    fields = dict(render.job_fields(job))
    assert (fields["MaxRSS"], fields["TotalCPU"]) == ("100M", "00:01.500")
    assert dict(render.job_fields({**job, "max_rss": None, "total_cpu_s": None}))["MaxRSS"] \
        is None, "unknown, not 0"
    row = dict(zip(HISTORY_COLUMNS, _history_row(job)))
    assert (row["State"], row["MaxRSS"], row["TotalCPU"]) == ("OUT_OF_MEMORY", "100M",
                                                              "00:01.500")
    # Out of memory is the job's own failure in `gq report`.
    report = summarize([{"user": "u", "account": "", "qos": "normal", "state": "OUT_OF_MEMORY",
                         "gpu_seconds": 3600.0}])
    assert report["wasted_by_cause"]["failed"] == 1.0
