"""The run's record: the facts gqnode and the shepherd append to one file, and the files of older
gqnodes, which a restarted gqnode must still read for runs they started."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import pytest

from gq import defaults
from gq.node import disk, shepherd


def test_facts_are_read_back_by_tag_the_last_line_of_each_winning(tmp_path: Path) -> None:
    shepherd.record(tmp_path, "shepherd", "101 1700000000.5")
    shepherd.record(tmp_path, "job", "102 1700000000.75")
    shepherd.record(tmp_path, "status", '{"state": "FAILED", "exit_code": 3}', durable=True)
    assert shepherd.read_pid(tmp_path, "shepherd", shepherd.PID_FILE) == (101, 1700000000.5)
    assert shepherd.read_pid(tmp_path, "job", shepherd.JOB_PID_FILE) == (102, 1700000000.75)
    assert shepherd.read_status(tmp_path) == {"state": "FAILED", "exit_code": 3}
    shepherd.record(tmp_path, "status", '{"state": "COMPLETED", "exit_code": 0}')
    assert shepherd.read_status(tmp_path) == {"state": "COMPLETED", "exit_code": 0}
    assert not (tmp_path / shepherd.STATUS_FILE).exists()


def test_a_line_cut_short_by_a_crash_is_no_fact(tmp_path: Path) -> None:
    shepherd.record(tmp_path, "shepherd", "101 1700000000.5")
    with open(tmp_path / shepherd.RECORD_FILE, "a") as f:
        f.write('status {"state": "COMPL')  # no newline: the write did not finish
    assert shepherd.read_status(tmp_path) is None
    assert shepherd.read_pid(tmp_path, "shepherd", shepherd.PID_FILE) == (101, 1700000000.5)


def test_the_files_of_an_older_gqnode_are_read_when_there_is_no_record(tmp_path: Path) -> None:
    (tmp_path / shepherd.PID_FILE).write_text("201 1700000001.0\n")
    (tmp_path / shepherd.JOB_PID_FILE).write_text("202 1700000002.0\n")
    (tmp_path / shepherd.STATUS_FILE).write_text('{"state": "COMPLETED", "exit_code": 0}')
    assert shepherd.read_pid(tmp_path, "shepherd", shepherd.PID_FILE) == (201, 1700000001.0)
    assert shepherd.read_pid(tmp_path, "job", shepherd.JOB_PID_FILE) == (202, 1700000002.0)
    assert shepherd.read_status(tmp_path) == {"state": "COMPLETED", "exit_code": 0}
    assert shepherd.read_pid(tmp_path / "nothing", "shepherd", shepherd.PID_FILE) == (0, 0.0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file someone else's")
def test_a_record_put_there_by_the_jobs_owner_is_neither_read_nor_written(tmp_path: Path) -> None:
    # The run's directory belongs to the job's owner, who must not be able to forge a status or
    # a job pid (gqnode would kill that pid's session).
    forged = tmp_path / shepherd.RECORD_FILE
    forged.write_text('status {"state": "COMPLETED", "exit_code": 0}\njob 1 0.0\n')
    os.chown(forged, 12345, 12345)
    assert shepherd.read_status(tmp_path) is None
    assert shepherd.read_pid(tmp_path, "job", shepherd.JOB_PID_FILE) == (0, 0.0)
    with pytest.raises(PermissionError):
        shepherd.record(tmp_path, "shepherd", "1 0.0")
    forged.unlink()
    forged.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        shepherd.record(tmp_path, "shepherd", "1 0.0")
    assert not (tmp_path / "elsewhere").exists()


def test_a_shepherd_records_its_job_and_status_and_writes_a_log_only_to_say_something(
        tmp_path: Path) -> None:
    from tests.test_signal import _finish, _launch
    run_dir = tmp_path / "1.0"
    status = _finish(_launch(run_dir, "#!/bin/sh\necho $$ > job.pid.seen\nexit 3\n"), run_dir)
    assert (status["state"], status["exit_code"]) == ("FAILED", 3)
    job_pid, _ = shepherd.read_pid(run_dir, "job", shepherd.JOB_PID_FILE)
    assert job_pid == int((run_dir / "job.pid.seen").read_text())
    # One file for all the facts, none of the files a fact each; no log with nothing to say.
    left = {p.name for p in run_dir.iterdir()}
    assert left == {shepherd.LAUNCH_FILE, shepherd.RECORD_FILE, "script", "out", "ckpt",
                    "job.pid.seen"}


def test_a_job_its_shepherd_never_recorded_is_found_by_its_environment(tmp_path: Path) -> None:
    """The shepherd killed between starting the job and recording its pid: gqnode still finds
    the job's session (by GQ_JOB_ID, GQ_RESTART_COUNT and GQ_NODE_RANK) and kills it, and only
    it: the same job's other run and another rank are left alone."""
    import subprocess

    import msgpack

    from tests.conftest import wait_for

    (tmp_path / shepherd.LAUNCH_FILE).write_bytes(
        msgpack.packb({"job_id": 4242, "restart": 1, "rank": 0}, use_bin_type=True))
    shepherd.record(tmp_path, "shepherd", "101 1700000000.5")  # and no job line

    def start(restart: int, rank: int) -> subprocess.Popen[bytes]:
        env = {**os.environ, "GQ_JOB_ID": "4242", "GQ_RESTART_COUNT": str(restart),
               "GQ_NODE_RANK": str(rank)}
        return subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)

    job, other_run, other_rank = start(1, 0), start(0, 0), start(1, 1)
    try:
        # Popen returns once sleep is exec'd: its environment is in /proc from then on.
        assert shepherd.kill_orphaned_job(tmp_path)
        wait_for(lambda: job.poll() is not None, "the job to be killed")
        assert other_run.poll() is None and other_rank.poll() is None
    finally:
        for proc in (job, other_run, other_rank):
            proc.kill()
            proc.wait()
    assert not shepherd.kill_orphaned_job(tmp_path)  # nothing left of it


@pytest.fixture
def full_disk(tmp_path: Path):  # noqa: ANN201
    """A 1 MiB tmpfs with a run's record reserved on it, then filled to the last byte."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (CI is root)")
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "gq-record", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        disk.reserve(mount / shepherd.RECORD_FILE, defaults.RUN_RECORD_RESERVE_BYTES)
        with open(mount / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:
                f.write(b"\0" * 4096)
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=False)


def test_the_status_is_written_on_a_full_disk_and_a_line_that_does_not_fit_is_none(
        full_disk: Path) -> None:
    shepherd.record(full_disk, "shepherd", "101 1700000000.5")
    shepherd.record(full_disk, "status", '{"state": "FAILED", "exit_code": 3}', durable=True)
    assert shepherd.read_status(full_disk) == {"state": "FAILED", "exit_code": 3}
    with pytest.raises(OSError) as raised:  # past the reserve: what got written is taken back
        shepherd.record(full_disk, "status", '"' + "x" * defaults.RUN_RECORD_RESERVE_BYTES + '"')
    assert raised.value.errno == errno.ENOSPC
    shepherd.record(full_disk, "job", "102 1700000000.75")  # the next line starts whole
    assert shepherd.read_pid(full_disk, "job", shepherd.JOB_PID_FILE) == (102, 1700000000.75)
    assert shepherd.read_status(full_disk) == {"state": "FAILED", "exit_code": 3}
