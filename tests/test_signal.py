"""`--signal`: its parser, the CLI and directives, and the shepherd sending it (real processes).

The shepherd tests fork a real shepherd on a run directory, as gqnode does, with no daemons.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from gq.cli.directives import translate_slurm
from gq import fsutil
from gq.errors import ExitStatus, UsageError
from gq.model import JobSignal, JobSpec, parse_signal
from gq.node import shepherd
from tests.conftest import wait_for

# ---------------------------------------------------------------- parse_signal


@pytest.mark.parametrize("text,expected", [
    ("USR1", JobSignal("USR1", 60, False)),
    ("sigusr1", JobSignal("USR1", 60, False)),
    ("SIGUSR2@120", JobSignal("USR2", 120, False)),
    ("B:USR1@90", JobSignal("USR1", 90, True)),
    ("b:term@0", JobSignal("TERM", 0, True)),
    (" urg ", JobSignal("URG", 60, False)),
    (str(int(signal.SIGUSR1)), JobSignal("USR1", 60, False)),
    ("hup@65535", JobSignal("HUP", 65535, False)),
])
def test_parse_signal_forms(text: str, expected: JobSignal) -> None:
    assert parse_signal(text) == expected


def test_signal_canonical_form_round_trips_and_numbers_are_the_os_ones() -> None:
    for text in ("USR1", "B:SIGINT@5", "10", "xcpu@1"):
        sig = parse_signal(text)
        assert parse_signal(str(sig)) == sig
    assert str(parse_signal("b:sigusr2")) == "B:USR2@60"
    assert parse_signal("USR1").number == signal.SIGUSR1


@pytest.mark.parametrize("text,why", [
    ("KILL", "SIGKILL cannot be caught"), ("SIGSTOP", "SIGSTOP cannot be caught"),
    (str(int(signal.SIGKILL)), "SIGKILL cannot be caught"),
    ("FOO", "'FOO' is not a signal"), ("SEGV", "'SEGV' is not a signal"),
    ("999", "'999' is not a signal"), ("USR1@65536", "at most 65535 seconds"),
    ("", "expected"), ("USR1@", "expected"), ("USR1@-5", "expected"), ("R:USR1", "expected"),
    ("B:", "expected"), ("USR1@1.5", "expected"), ("USR1@٣", "expected"),
])
def test_parse_signal_refuses_naming_the_value_and_the_forms(text: str, why: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_signal(text)
    message = str(info.value)
    assert f"bad --signal {text!r}" in message and why in message
    assert "[B:]SIG[@SECONDS]" in message and "USR1" in message


def test_job_spec_carries_the_signal_and_older_specs_load() -> None:
    spec = JobSpec(script="#!/bin/sh\n", signal="B:USR1@60")
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert JobSpec.from_dict({"script": "#!/bin/sh\n"}).signal is None  # a spec stored before


# ---------------------------------------------------------------- CLI and directives


def test_sbatch_signal_directive_is_translated() -> None:
    warnings: list[str] = []
    # sbatch's --signal is gq's: the words stay as they are.
    assert translate_slurm(["--signal=B:USR1@90"], warnings) == ["--signal=B:USR1@90"]
    assert translate_slurm(["--signal", "USR2"], warnings) == ["--signal", "USR2"]
    assert not warnings


@pytest.mark.parametrize("args", [["--signal", "KILL"], ["--signal", "NOPE@10"]])
def test_submit_refuses_a_bad_signal_before_sending_anything(tmp_path: Path,
                                                             args: list[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_text(f"#!/bin/sh\n#GQ {' '.join(args)}\ntrue\n")
    for how in (["--wrap", "true", *args], [str(script)]):
        env = {**os.environ, "GQ_CONFIG": str(tmp_path / "none.toml")}  # no head is needed
        proc = subprocess.run([sys.executable, "-m", "gq.cli.main", "submit", *how],
                              capture_output=True, text=True, env=env, timeout=60)
        assert proc.returncode == ExitStatus.USAGE, proc.stderr
        assert f"bad --signal {args[1]!r}" in proc.stderr and "[B:]SIG[@SECONDS]" in proc.stderr


# ---------------------------------------------------------------- the shepherd

#: A job whose script and one child each write a line on USR1 and keep running; ready once both
#: have their trap set.
_TWO_PROCESSES = """#!/bin/bash
sh -c 'trap "echo child >> got" USR1; echo child > ready.child; while :; do sleep 0.1; done' &
trap 'echo top >> got' USR1
echo top > ready.top
while :; do sleep 0.1; done
"""


def _launch(run_dir: Path, script: str, time_limit_s: int = 0, grace_s: float = 30.0,
            signal_spec: str | None = None) -> int:
    """Start a shepherd for a one-node run in `run_dir`, as gqnode does; its pid."""
    run_dir.mkdir()
    spec = {"script": script, "name": "t", "args": [], "uid": os.getuid(), "gid": os.getgid(),
            "cwd": str(run_dir), "env": {"PATH": os.environ["PATH"]}, "signal": signal_spec}
    launch: dict[str, Any] = {
        "job_id": 1, "restart": 0, "spec": spec, "gpus": [], "rank": 0, "nodelist": ["n1"],
        "time_limit_s": time_limit_s, "stdout": str(run_dir / "out"),
        "stderr": str(run_dir / "out"), "job": {}, "grace_s": grace_s,
        "checkpoint_dir": str(run_dir / "ckpt")}
    (run_dir / shepherd.LAUNCH_FILE).write_bytes(msgpack.packb(launch, use_bin_type=True))
    return shepherd.spawn(run_dir)


def _finish(pid: int, run_dir: Path, timeout: float = 60.0) -> dict[str, Any]:
    """Reap the shepherd (our child) within `timeout` and return the status it wrote."""
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGUSR1)
            os.waitpid(pid, 0)
            pytest.fail(f"the shepherd did not end within {timeout}s")
        time.sleep(0.05)
    status = shepherd.read_status(run_dir)
    assert status is not None, (run_dir / "shepherd.log").read_text()
    return status


def _ready(run_dir: Path) -> None:
    wait_for(lambda: (run_dir / "ready.top").exists() and (run_dir / "ready.child").exists(),
             "the job to set its traps")


@pytest.mark.parametrize("batch_only,expected", [(True, ["top"]), (False, ["child", "top"])])
def test_stop_order_signals_the_script_or_the_group_then_kills_after_its_grace(
        tmp_path: Path, batch_only: bool, expected: list[str]) -> None:
    run_dir = tmp_path / "1.0"
    pid = _launch(run_dir, _TWO_PROCESSES, grace_s=300.0)
    _ready(run_dir)
    shepherd.order_stop(run_dir, "USR1", batch_only, grace_s=1.0)
    os.kill(pid, signal.SIGTERM)
    # The job only notes USR1 and runs on: the order's 1 s grace, not the launch's 300 s, ends
    # it with SIGKILL (well within _finish's deadline).
    status = _finish(pid, run_dir, timeout=60.0)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 128 + signal.SIGKILL)
    assert sorted((run_dir / "got").read_text().split()) == expected


def _garbage_order(run_dir: Path) -> None:
    (run_dir / shepherd.STOP_FILE).write_text("{not json")


def _foreign_order(run_dir: Path) -> None:
    """A well-formed order that someone else (the job's owner, say) wrote."""
    if os.geteuid() != 0:
        pytest.skip("only root can make a file of another user")
    shepherd.order_stop(run_dir, "USR1", False, 3600.0)
    os.chown(run_dir / shepherd.STOP_FILE, 65534, 65534)


@pytest.mark.parametrize("tamper", [_garbage_order, _foreign_order])
def test_without_a_good_stop_order_a_stop_is_sigterm_to_the_group(tmp_path: Path,
                                                                  tamper: Any) -> None:
    run_dir = tmp_path / "1.0"
    pid = _launch(run_dir, "#!/bin/bash\ntrap 'echo term > got; exit 3' TERM\n"
                           "echo top > ready.top; touch ready.child\nwhile :; do sleep 0.1; done\n")
    _ready(run_dir)
    tamper(run_dir)
    os.kill(pid, signal.SIGTERM)
    status = _finish(pid, run_dir)
    assert (status["state"], status["exit_code"]) == ("CANCELLED", 3)
    assert (run_dir / "got").read_text() == "term\n"
    assert "bad stop order" in (run_dir / "shepherd.log").read_text()


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_what_the_job_leaves_in_its_session_is_killed_when_it_ends(tmp_path: Path) -> None:
    # A background child, and a grandchild in a process group of its own (both orphaned when
    # the script exits), must not outlive the job; nor may a job that leaves nothing cost a
    # scan of every process (the shepherd then knows itself: it adopts the job's orphans).
    run_dir = tmp_path / "1.0"
    script = (f"#!/bin/sh\nsleep 300 &\necho $! > bg.pid\n"
              f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); "
              "open(\"group.pid\", \"w\").write(str(os.getpid())); time.sleep(300)' &\n"
              "while [ ! -s group.pid ]; do sleep 0.05; done\n")
    status = _finish(_launch(run_dir, script), run_dir)
    assert (status["state"], status["exit_code"]) == ("COMPLETED", 0)
    pids = [int((run_dir / name).read_text()) for name in ("bg.pid", "group.pid")]
    wait_for(lambda: all(_gone(pid) for pid in pids), "the job's leftovers to be killed",
             timeout=10.0)


def test_a_stop_order_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.write_text("keep")
    fsutil.temp_path(tmp_path / shepherd.STOP_FILE).symlink_to(target)  # the run dir is the user's
    shepherd.order_stop(tmp_path, "USR1", True, 5.0)
    assert target.read_text() == "keep"
    assert json.loads((tmp_path / shepherd.STOP_FILE).read_text()) == {
        "signal": "USR1", "batch_only": True, "grace_s": 5.0}



def test_a_signal_only_order_is_read_once_and_a_later_plain_stop_stops(tmp_path: Path) -> None:
    shepherd.order_stop(tmp_path, "USR1", False, None, no_kill=True)
    stop = shepherd._stop_order(tmp_path, 7.0)
    assert (stop.signum, stop.no_kill) == (signal.SIGUSR1, True)
    # Used up: a SIGTERM that comes without a fresh order is a plain stop, not a signal.
    assert not (tmp_path / shepherd.STOP_FILE).exists()
    stop = shepherd._stop_order(tmp_path, 7.0)
    assert (stop.signum, stop.no_kill, stop.grace_s) == (signal.SIGTERM, False, 7.0)

def test_signal_is_sent_its_lead_time_before_the_limit(tmp_path: Path) -> None:
    run_dir = tmp_path / "1.0"
    script = ("#!/bin/bash\ntrap 'date +%s.%N > got' USR1\ndate +%s.%N > started\n"
              "while :; do sleep 0.1; done\n")
    pid = _launch(run_dir, script, time_limit_s=4, grace_s=1.0, signal_spec="B:USR1@2")
    status = _finish(pid, run_dir)
    assert status["state"] == "TIMEOUT"  # the limit's SIGTERM, which the script does not trap
    lead = float((run_dir / "got").read_text()) - float((run_dir / "started").read_text())
    assert 1.0 <= lead < 4.0, f"USR1 came {lead:.1f}s after the start, not about 2s"


def test_a_shepherd_is_forked_with_its_signals_blocked_from_its_first_instruction() -> None:
    """A stop sent the instant after the fork waits, pending, for the shepherd's own handling:
    before, it ran gqnode's handler copied into the child, and a job cancelled as it was
    launched ran on (CI)."""
    from gq.node.shepherd import fork_blocked
    before = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    stops = {signal.SIGTERM, signal.SIGUSR1}
    pid = fork_blocked(stops)
    if pid == 0:  # the child: both signals must be pending, not handled or fatal
        deadline = time.monotonic() + 10
        while not stops <= signal.sigpending() and time.monotonic() < deadline:
            time.sleep(0.01)
        os._exit(0 if stops <= signal.sigpending() else 3)
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGUSR1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert signal.pthread_sigmask(signal.SIG_BLOCK, set()) == before  # the parent's mask is back
