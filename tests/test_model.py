"""Unit tests for gq.model: parsing/formatting of durations, sizes and GPU specs, and the job types."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gq.errors import ExitStatus, GqError, UsageError
from gq.model import (
    FAKE_GPU_MEMORY,
    JOB_FIELDS,
    Gpu,
    Job,
    JobSpec,
    JobState,
    expand_pattern,
    format_duration,
    format_size,
    iso_time,
    job_record,
    parse_duration,
    parse_gpu_spec,
    parse_size,
)

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4


# ---------------------------------------------------------------- errors


def test_usage_error_exit_status_is_2():
    assert UsageError.exit_status == 2
    assert UsageError.exit_status == ExitStatus.USAGE
    assert UsageError("x").exit_status == 2
    assert issubclass(UsageError, GqError)


# ---------------------------------------------------------------- parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # bare number = minutes, as in Slurm
        ("30", 1800),
        ("1", 60),
        ("90", 5400),
        # MM:SS
        ("5:30", 330),
        ("0:45", 45),
        ("00:01", 1),
        # HH:MM:SS
        ("1:00:00", 3600),
        ("01:02:03", 3723),
        ("0:0:1", 1),
        ("48:00:00", 48 * 3600),
        # D-HH
        ("1-2", 93600),
        ("0-1", 3600),
        ("2-00", 2 * 86400),
        # D-HH:MM
        ("1-2:30", 86400 + 2 * 3600 + 30 * 60),
        ("0-0:5", 300),
        # D-HH:MM:SS
        ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4),
        ("3-00:00:01", 3 * 86400 + 1),
        # number with a unit
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1.5h", 5400),
        ("0.5m", 30),
        ("2.5d", 216000),
        ("1s", 1),
    ],
)
def test_parse_duration_forms(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("  30  ", 1800),
        ("\t5:30\n", 330),
        (" 1-2 ", 93600),
        (" 2h ", 7200),
        ("  unlimited ", 0),
    ],
)
def test_parse_duration_tolerates_surrounding_whitespace(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2H", "30M", "90S", "1D"])
def test_parse_duration_units_case_insensitive(text):
    assert parse_duration(text) == parse_duration(text.lower())


@pytest.mark.parametrize("text", ["unlimited", "UNLIMITED", "Unlimited", "infinite"])
def test_parse_duration_unlimited_is_zero(text):
    assert parse_duration(text) == 0


def test_parse_duration_int_means_minutes():
    assert parse_duration(30) == 1800
    assert parse_duration(1) == 60


@pytest.mark.parametrize("text", ["abc", "-5", "1:2:3:4", "5x", "", "   ", "1.5", "h", "1-", "-1-2",
                                  "1:", ":30", "1 h", "5 30", "1-2:3:4:5"])
def test_parse_duration_rejects_malformed_with_forms_in_message(text):
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    msg = str(info.value)
    assert repr(text) in msg or repr(text.strip()) in msg
    assert "HH:MM:SS" in msg
    assert "D-HH" in msg
    assert info.value.exit_status == 2


@pytest.mark.parametrize("text", ["0", "0s", "0m", "00:00", "0:00:00", "0-0", "0-00:00:00"])
def test_parse_duration_rejects_zero_naming_the_value(text):
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert repr(text) in str(info.value)
    assert info.value.exit_status == 2


@pytest.mark.parametrize("text", ["0", "0s"])
def test_parse_duration_zero_message_mentions_accepted_forms(text):
    with pytest.raises(UsageError) as info:
        parse_duration(text)
    assert "HH:MM:SS" in str(info.value)


def test_parse_duration_rejects_zero_and_negative_ints():
    with pytest.raises(UsageError):
        parse_duration(0)
    with pytest.raises(UsageError):
        parse_duration(-5)


# ---------------------------------------------------------------- format_duration


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (1, "00:00:01"),
        (59, "00:00:59"),
        (60, "00:01:00"),
        (3723, "01:02:03"),
        (86399, "23:59:59"),
        (86400, "1-00:00:00"),
        (93600, "1-02:00:00"),
        (10 * 86400 + 3661, "10-01:01:01"),
        (0, "UNLIMITED"),
        (None, ""),
    ],
)
def test_format_duration_examples(seconds, text):
    assert format_duration(seconds) == text


def test_format_duration_unlimited_round_trips():
    assert parse_duration(format_duration(0)) == 0


@given(st.integers(min_value=1, max_value=10**7))
def test_format_duration_round_trips(seconds):
    text = format_duration(seconds)
    assert parse_duration(text) == seconds
    if seconds < 86400:
        assert "-" not in text and text.count(":") == 2
    else:
        assert "-" in text and text.count(":") == 2


# ---------------------------------------------------------------- sizes


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("40G", 40 * GiB),
        ("512M", 512 * MiB),
        ("1.5T", int(1.5 * TiB)),
        ("1024K", MiB),
        ("40GB", 40 * GiB),
        ("40GiB", 40 * GiB),
        ("40gib", 40 * GiB),
        ("40g", 40 * GiB),
        ("512m", 512 * MiB),
        ("1t", TiB),
        ("2k", 2 * KiB),
        ("1P", 1024**5),
        ("100", 100 * MiB),
        ("1", MiB),
        (" 40G ", 40 * GiB),
        ("40 G", 40 * GiB),
        ("0.5G", 512 * MiB),
        (100, 100 * MiB),
    ],
)
def test_parse_size(text, nbytes):
    assert parse_size(text) == nbytes


@pytest.mark.parametrize("text", ["abc", "", "-1", "G", "40X", "40GBB", "1.2.3G", "4 0G", "40Gi B", "1e3"])
def test_parse_size_rejects_bad_values_naming_them(text):
    with pytest.raises(UsageError) as info:
        parse_size(text)
    assert repr(text) in str(info.value)
    assert info.value.exit_status == 2


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [
        (None, "-"),
        (0, "-"),
        (1, "1B"),
        (1023, "1023B"),
        (KiB, "1K"),
        (MiB, "1M"),
        (512 * MiB, "512M"),
        (40 * GiB, "40G"),
        (int(1.5 * GiB), "1.5G"),
        (TiB, "1T"),
        (int(1.5 * TiB), "1.5T"),
        (150 * MiB + 1, "150M"),
        (2048 * TiB, "2048T"),
    ],
)
def test_format_size(nbytes, text):
    assert format_size(nbytes) == text


@pytest.mark.parametrize("nbytes", [KiB, 3 * MiB, 40 * GiB, 80 * GiB, 2 * TiB])
def test_format_size_round_trips_whole_units(nbytes):
    assert parse_size(format_size(nbytes)) == nbytes


# ---------------------------------------------------------------- GPU specs


def test_parse_gpu_spec_bare_count():
    gpus = parse_gpu_spec("8")
    assert len(gpus) == 8
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.type == "fake" for g in gpus)
    assert all(g.memory == 80 * GiB for g in gpus)
    assert FAKE_GPU_MEMORY == 80 * GiB
    assert all(isinstance(g, Gpu) for g in gpus)
    assert len({g.uuid for g in gpus}) == 8


def test_parse_gpu_spec_typed_with_memory():
    gpus = parse_gpu_spec("8xh100:80G")
    assert [g.index for g in gpus] == list(range(8))
    assert {g.type for g in gpus} == {"h100"}
    assert {g.memory for g in gpus} == {80 * GiB}


def test_parse_gpu_spec_typed_without_memory_uses_default():
    gpus = parse_gpu_spec("2xa100")
    assert [(g.index, g.type, g.memory) for g in gpus] == [(0, "a100", FAKE_GPU_MEMORY),
                                                           (1, "a100", FAKE_GPU_MEMORY)]


def test_parse_gpu_spec_mixed_list():
    gpus = parse_gpu_spec("4xa100:40G,4xl4:24G")
    assert [g.index for g in gpus] == list(range(8))
    assert [g.type for g in gpus] == ["a100"] * 4 + ["l4"] * 4
    assert [g.memory for g in gpus] == [40 * GiB] * 4 + [24 * GiB] * 4
    assert len({g.uuid for g in gpus}) == 8


def test_parse_gpu_spec_case_and_whitespace():
    gpus = parse_gpu_spec(" 2xH100:80G , 1xL4:24G ")
    assert [(g.index, g.type, g.memory) for g in gpus] == [
        (0, "h100", 80 * GiB), (1, "h100", 80 * GiB), (2, "l4", 24 * GiB)]


def test_parse_gpu_spec_allows_64():
    assert len(parse_gpu_spec("64")) == 64
    assert len(parse_gpu_spec("32xh100,32xa100")) == 64


@pytest.mark.parametrize("text", ["x", "", "0x", "100", "65", "xh100", "8xh100:", "8,", ",8",
                                  "8xh100:80G,", "-1", "33xa100,32xl4", "8 x h100"])
def test_parse_gpu_spec_rejects_bad_specs_naming_them(text):
    with pytest.raises(UsageError) as info:
        parse_gpu_spec(text)
    assert repr(text) in str(info.value)
    assert info.value.exit_status == 2


def test_parse_gpu_spec_rejects_bad_memory():
    with pytest.raises(UsageError) as info:
        parse_gpu_spec("8xh100:zz")
    assert "zz" in str(info.value)
    assert info.value.exit_status == 2


# ---------------------------------------------------------------- JobState


TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY"}


def test_job_state_values_equal_names():
    assert {s.name for s in JobState} == TERMINAL | {"PENDING", "RUNNING"}
    for state in JobState:
        assert state.value == state.name
        assert state == state.name  # str enum: compares equal to its stored string
        assert JobState(state.name) is state


@pytest.mark.parametrize("state", list(JobState))
def test_job_state_terminal(state):
    assert state.terminal is (state.name in TERMINAL)


# ---------------------------------------------------------------- JobSpec


def _full_spec() -> JobSpec:
    return JobSpec(
        script="#!/bin/sh\necho hi\n", name="train", args=["--lr", "0.1"], user="alice", uid=1000,
        gid=1000, cwd="/home/alice/run", env={"A": "1", "B": "two"}, nodes=2, gpus=4,
        gpu_type="h100", gpu_mem=80 * GiB, cpus=16, mem=64 * GiB, time_limit_s=7200, qos="high",
        output="out-%j.log", error="err-%j.log", requeue=False,
    )


@pytest.mark.parametrize("spec", [JobSpec(script="echo"), _full_spec()])
def test_job_spec_round_trip(spec):
    data = spec.to_dict()
    assert isinstance(data, dict)
    assert data["script"] == spec.script
    again = JobSpec.from_dict(data)
    assert again == spec
    assert again is not spec


def test_job_spec_to_dict_is_a_copy():
    spec = _full_spec()
    data = spec.to_dict()
    data["env"]["C"] = "3"
    data["args"].append("x")
    assert "C" not in spec.env
    assert spec.args == ["--lr", "0.1"]


def test_job_spec_from_dict_ignores_unknown_keys():
    spec = _full_spec()
    data = spec.to_dict() | {"bogus": 1, "from_the_future": {"x": 2}}
    assert JobSpec.from_dict(data) == spec


def test_job_spec_from_dict_defaults_missing_keys():
    spec = JobSpec.from_dict({"script": "echo hi", "gpus": 2})
    assert spec == JobSpec(script="echo hi", gpus=2)
    assert spec.name == "job" and spec.nodes == 1 and spec.requeue is True


# ---------------------------------------------------------------- Job.to_json


DOCUMENTED_KEYS = {
    "id", "name", "user", "state", "reason", "qos", "priority", "nodes", "gpus_per_node",
    "gpu_type", "time_limit_s", "submit_time", "start_time", "end_time", "exit_code",
    "node_list", "gpu_ids", "array_job_id", "array_index",
}


def _job(**kw) -> Job:
    spec_kw = {"script": "echo", "name": "train", "user": "alice", "cwd": "/home/alice"}
    spec_kw.update({k: kw.pop(k) for k in list(kw) if k in JobSpec.__dataclass_fields__})
    spec = JobSpec(**spec_kw)
    return Job(id=kw.pop("id", 42), spec=spec, **kw)


def test_job_to_json_has_documented_keys():
    assert DOCUMENTED_KEYS <= set(_job().to_json())


def test_job_to_json_values():
    job = _job(id=7, state=JobState.RUNNING, reason="", priority=123, nodes=2, gpus=4,
               gpu_type="h100", time_limit_s=3600, qos="high", submit_time=1700000000,
               start_time=1700000060.7, end_time=None, exit_code=None,
               alloc={"n1": [0, 1, 2, 3], "n2": [4, 5, 6, 7]})
    data = job.to_json()
    assert data["id"] == 7
    assert data["name"] == "train"
    assert data["user"] == "alice"
    assert data["state"] == "RUNNING"
    assert type(data["state"]) is str
    assert data["qos"] == "high"
    assert data["priority"] == 123
    assert data["nodes"] == 2
    assert data["gpus_per_node"] == 4
    assert data["gpu_type"] == "h100"
    assert data["time_limit_s"] == 3600
    assert data["submit_time"] == "2023-11-14T22:13:20Z"
    assert data["start_time"] == "2023-11-14T22:14:20Z"
    assert data["end_time"] is None
    assert data["exit_code"] is None
    assert data["node_list"] == ["n1", "n2"]
    assert data["gpu_ids"] == {"n1": [0, 1, 2, 3], "n2": [4, 5, 6, 7]}
    assert data["array_job_id"] is None
    assert data["array_index"] is None


def test_job_to_json_gpu_ids_are_copies():
    job = _job(alloc={"n1": [0, 1]})
    job.to_json()["gpu_ids"]["n1"].append(9)
    assert job.alloc == {"n1": [0, 1]}


def test_job_to_json_terminal_fields_and_array():
    job = _job(state=JobState.NODE_FAIL, reason="NodeDown", submit_time=0, start_time=1700000000,
               end_time=1700003600, exit_code=-9, array_job_id=40, array_index=3)
    data = job.to_json()
    assert data["state"] == "NODE_FAIL"
    assert data["reason"] == "NodeDown"
    assert data["submit_time"] is None
    assert data["start_time"] == "2023-11-14T22:13:20Z"
    assert data["end_time"] == "2023-11-14T23:13:20Z"
    assert data["exit_code"] == -9
    assert data["array_job_id"] == 40
    assert data["array_index"] == 3


@pytest.mark.parametrize(
    ("ts", "text"),
    [(0, None), (None, None), (float("nan"), None), (1700000000, "2023-11-14T22:13:20Z"),
     (1700000000.999, "2023-11-14T22:13:20Z"), (86400, "1970-01-02T00:00:00Z")],
)
def test_iso_time(ts, text):
    assert iso_time(ts) == text


@given(st.floats(min_value=-1e10, max_value=2.5e11) | st.integers(-10**10, 2 * 10**11)
       | st.sampled_from([1.9999995, 1.9999994999, 59.99999951, 0.9999995, -0.0000001, -5.5]))
def test_iso_time_is_datetimes_text(ts):
    """iso_time formats by the minute and its own arithmetic; datetime is the reference, down to
    its rounding to the microsecond (x.9999995 is the next second) and times before 1970."""
    import datetime as dt
    want = None if not ts else dt.datetime.fromtimestamp(ts, dt.timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ")
    assert iso_time(ts) == want


def test_job_record_of_fields_is_that_part_of_the_full_record_in_that_order():
    job = _job(state=JobState.RUNNING, start_time=1700000000.5, end_time=1700000060,
               alloc={"n1": [0, 1]}, array_job_id=40, array_index=3, array="0-9%4",
               output="o-%A_%a.txt", cwd="/w")
    job.hold = "user"
    full = job.to_json()
    assert list(full) == list(JOB_FIELDS)
    fields = ["stderr", "id", "state", "array_task_limit", "start_time", "hold", "job_id"]
    assert list(job_record(tuple(fields))(job).items()) == [(f, full[f]) for f in fields]
    assert job.to_json(fields) == {f: full[f] for f in fields}
    assert (full["array_task_limit"], full["job_id"], full["stdout"]) == (
        4, "40_3", "/w/o-40_3.txt")
    with pytest.raises(KeyError):
        job_record(("id", "no_such_field"))


# ---------------------------------------------------------------- output patterns


def test_expand_pattern_fields():
    job = _job(id=42)
    assert expand_pattern("%j", job) == "42"
    assert expand_pattern("%x", job) == "train"
    assert expand_pattern("%u", job) == "alice"
    assert expand_pattern("%A", job) == "42"
    assert expand_pattern("%%", job) == "%"
    assert expand_pattern("%q", job) == "%q"
    assert expand_pattern("out-%x-%j.%u.log", job) == "out-train-42.alice.log"
    assert expand_pattern("no-pattern.txt", job) == "no-pattern.txt"
    # The batch script is node 0 and task 0 of its job (corpus 27: %x-%j_%n.out).
    assert expand_pattern("%x-%j_%n.%t", job) == "train-42_0.0"


def test_expand_pattern_double_percent_is_literal():
    job = _job(id=42)
    assert expand_pattern("%%j", job) == "%j"
    assert expand_pattern("100%%-%j", job) == "100%-42"
    assert expand_pattern("%%%j", job) == "%42"


def test_expand_pattern_array():
    job = _job(id=45, array_job_id=40, array_index=5)
    assert expand_pattern("%A_%a", job) == "40_5"
    assert expand_pattern("%j", job) == "45"
    # %J: the batch script is no numbered step, so the task's own id (a real script's
    # `-o slurm_output/%J.out` must give each task its file, not one literal `%J.out`).
    assert expand_pattern("%J.out", job) == "45.out"
    assert expand_pattern("%A", _job(id=40, array_job_id=40, array_index=0)) == "40"
    assert expand_pattern("%a", _job(id=40, array_job_id=40, array_index=0)) == "0"


def test_expand_pattern_node():
    assert expand_pattern("%N", _job(alloc={"gpu01": [0], "gpu02": [0]})) == "gpu01"


def test_output_path_default():
    job = _job(id=42)
    assert job.output_path("output") == "/home/alice/gq-42.out"
    assert job.output_path("error") == "/home/alice/gq-42.out"


def test_output_path_relative_pattern_is_under_cwd():
    job = _job(id=42, cwd="/scratch/run/", output="logs/%x-%j.out")
    path = job.output_path("output")
    assert path == "/scratch/run/logs/train-42.out"
    assert path.startswith("/")


def test_output_path_root_cwd():
    job = _job(id=3, cwd="/")
    assert job.output_path("output") == "/gq-3.out"


def test_output_path_absolute_pattern_kept():
    job = _job(id=42, output="/var/log/%u/%j.log")
    assert job.output_path("output") == "/var/log/alice/42.log"


def test_output_path_error_falls_back_to_output():
    job = _job(id=42, output="run-%j.log")
    assert job.output_path("error") == "/home/alice/run-42.log"
    assert job.output_path("error") == job.output_path("output")


def test_output_path_error_pattern_used_when_set():
    job = _job(id=42, output="run-%j.log", error="run-%j.err")
    assert job.output_path("output") == "/home/alice/run-42.log"
    assert job.output_path("error") == "/home/alice/run-42.err"


def test_to_json_carries_output_paths():
    data = _job(id=42, output="o-%j", error="/tmp/e-%j").to_json()
    assert data["stdout"] == "/home/alice/o-42"
    assert data["stderr"] == "/tmp/e-42"
    assert data["work_dir"] == "/home/alice"


def test_parse_duration_fractional_minutes_number():
    assert parse_duration(1.5) == 90


def test_parse_size_plain_bytes_and_bad_suffix():
    assert parse_size("100B") == 100
    with pytest.raises(UsageError, match="100i"):
        parse_size("100i")


@pytest.mark.parametrize("spec", ["0", "0xh100", "4xa100,0xl4"])
def test_parse_gpu_spec_refuses_zero_counts(spec):
    with pytest.raises(UsageError, match="at least 1"):
        parse_gpu_spec(spec)


def test_parse_gpu_spec_bad_memory_names_whole_spec():
    with pytest.raises(UsageError, match="8xh100:zz"):
        parse_gpu_spec("8xh100:zz")
