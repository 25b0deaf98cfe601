"""Interactive jobs (issue 15, Done when 3), live: `gq run -g 1 --pty bash` driven through a
real pty (pexpect): typed commands run in the job on its node (its GPU, a /dev/pts terminal,
the caller's window size and its changes), Ctrl-C interrupts the job's foreground command and
the shell survives, `exit 3` makes gq run exit 3, and the GPU is free afterwards; killing the
caller ends the job; `gq alloc -N 2` runs its command here and `srun -N 2` in it starts a step
on both allocated nodes. The live ones run on one host and with the job's node in a network
namespace of its own (tests/test_live_steps.py's `nodes` fixture), so the stream crosses a
real network. The stream's handshake refuses a peer without the job's secret."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

import pexpect
import psutil
import pytest

from gq.runstream import Stream, StreamError
from tests.conftest import LiveCluster, cluster, wait_for  # noqa: F401 (fixture)
from tests.faults.test_partition import net  # noqa: F401  (the namespace fixture)
from tests.test_live_steps import nodes  # noqa: F401  (one host / two network namespaces)

PROMPT = "PROMPT> "


def _spawn(cluster: LiveCluster, *args: str, rows: int = 30, cols: int = 100) -> Any:
    env = dict(cluster.env, PS1=PROMPT, XDG_DATA_HOME=str(cluster.root / "data"))
    return pexpect.spawn(sys.executable, ["-m", "gq.cli.main", *args], env=env,
                         cwd=str(cluster.work), encoding="utf-8", timeout=60,
                         dimensions=(rows, cols))


def _gpus_held(cluster: LiveCluster) -> list[Any]:
    return [g["job"] for n in cluster.nodes() for g in n["gpus"] if g["job"] is not None]


def test_run_pty_bash_types_reads_interrupts_and_exits_with_its_status(
        nodes: tuple[LiveCluster, list[str]]) -> None:  # noqa: F811
    cluster, names = nodes
    target = names[1]  # in the namespace, for the second cluster
    term = _spawn(cluster, "run", "-g", "1", "-w", target, "--pty", "bash", "--norc",
                  "--noprofile")
    try:
        term.expect_exact(PROMPT)
        term.sendline('echo "job=$SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES on=$SLURMD_NODENAME"')
        term.expect(r"job=(\d+) gpus=(\d+) on=(\S+)\r\n")
        job, on = int(term.match.group(1)), term.match.group(3)
        assert on == target
        assert _gpus_held(cluster) == [job], "the job holds one GPU while it runs"
        term.expect_exact(PROMPT)
        term.sendline("tty; stty size")
        term.expect(r"(/dev/pts/\d+)\r\n(\d+) (\d+)\r\n")
        assert term.match.group(2, 3) == ("30", "100"), "the caller's window size at start"
        term.expect_exact(PROMPT)
        term.setwinsize(40, 120)  # SIGWINCH to gq run, which forwards the new size
        wait_for(lambda: _size(term) == ("40", "120"), "the new window size in the job")
        term.sendline("sleep 100")
        wait_for(lambda: _sleeping(job), "sleep 100 to run in the job")
        term.sendcontrol("c")
        term.expect_exact(PROMPT, timeout=15)  # the shell survived the interrupt
        term.sendline("echo status=$?")
        term.expect(r"status=(\d+)\r\n")
        assert term.match.group(1) == "130", "sleep ended by SIGINT"
        term.expect_exact(PROMPT)
        term.sendline("exit 3")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert term.exitstatus == 3, term.before
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    assert done["exit_code"] == 3, done
    assert _gpus_held(cluster) == [], "the GPU is free once gq run has returned"
    nxt = cluster.gq("run", "-g", "8", "-w", target, "true", timeout=60)
    assert nxt.returncode == 0, nxt.stderr


def _sleeping(job: int) -> bool:
    """The job's `sleep 100` runs (the same host's processes, namespace or not)."""
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = proc.info.get("environ") or {}
            if proc.info["cmdline"] == ["sleep", "100"] and env.get("SLURM_JOB_ID") == str(job):
                return True
        except (psutil.Error, TypeError):
            continue
    return False


def _size(term: Any) -> tuple[str, str] | None:
    term.sendline("stty size")
    term.expect(r"(\d+) (\d+)\r\n")
    size = term.match.group(1, 2)
    term.expect_exact(PROMPT)
    return size if size == ("40", "120") else None


def test_killing_the_caller_ends_the_job_and_frees_its_gpu(
        nodes: tuple[LiveCluster, list[str]]) -> None:  # noqa: F811
    cluster, names = nodes
    term = _spawn(cluster, "run", "-g", "2", "-w", names[1], "--pty", "bash", "--norc",
                  "--noprofile")
    try:
        term.expect_exact(PROMPT)
        term.sendline("echo job=$SLURM_JOB_ID")
        term.expect(r"job=(\d+)\r\n")
        job = int(term.match.group(1))
        term.expect_exact(PROMPT)
        term.sendline("sleep 1000 & echo started")
        term.expect_exact("started")
        assert cluster.show(job)["state"] == "RUNNING"
        os.kill(term.pid, signal.SIGKILL)  # no chance to say goodbye
        done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
        assert done["state"] != "COMPLETED" or done["exit_code"] != 0, done
        wait_for(lambda: _gpus_held(cluster) == [], "the job's GPUs to be free")
    finally:
        term.close(force=True)


def test_run_without_pty_streams_pipes_and_the_exit_code(
        nodes: tuple[LiveCluster, list[str]]) -> None:  # noqa: F811
    cluster, names = nodes
    proc = cluster.gq("run", "-g", "0", "-w", names[1], "sh", "-c",
                      'tr a-z A-Z; echo "err $SLURMD_NODENAME" >&2; exit 7',
                      input="hello stream\n", timeout=60)
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "HELLO STREAM\n"
    assert f"err {names[1]}\n" in proc.stderr
    missing = cluster.gq("run", "-g", "0", "no-such-program-xyz", timeout=60)
    assert missing.returncode == 127 and "no-such-program-xyz" in missing.stderr


def test_alloc_holds_two_nodes_while_srun_runs_a_step_on_both(
        nodes: tuple[LiveCluster, list[str]]) -> None:  # noqa: F811
    cluster, names = nodes
    term = _spawn(cluster, "alloc", "-N", "2", "-g", "1", "sh", "-c",
                  'echo "alloc $SLURM_JOB_ID $SLURM_NNODES"; '
                  'srun -N 2 sh -c "echo step on \\$SLURMD_NODENAME"; exit 4')
    try:
        term.expect(r"alloc (\d+) 2\r\n")
        job = int(term.match.group(1))
        seen = set()
        while len(seen) < 2:
            term.expect(r"step on (\S+)\r\n")
            seen.add(term.match.group(1))
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert seen == set(names)
    assert term.exitstatus == 4, term.before
    done = cluster.wait_state(job, "COMPLETED", "FAILED", "CANCELLED")
    assert done["exit_code"] == 4, done
    assert _gpus_held(cluster) == []
    with cluster.client() as c:
        steps = c.show(job).get("steps") or []
    assert any(s.get("state") == "COMPLETED" for s in steps) or not steps, steps


def test_the_stream_refuses_a_peer_without_the_jobs_secret() -> None:
    for caller_secret, agent_secret in (("a" * 64, "b" * 64), ("c" * 64, "c" * 64)):
        left, right = socket.socketpair()
        result: dict[str, Any] = {}

        def agent(sock: socket.socket = right, secret: str = agent_secret) -> None:
            try:
                result["agent"] = Stream.connect(sock, secret)
            except (StreamError, OSError) as exc:
                result["agent"] = exc
            finally:
                if isinstance(result["agent"], Exception):
                    sock.close()
        thread = threading.Thread(target=agent)
        thread.start()
        try:
            stream: Any = Stream.accept(left, caller_secret)
        except StreamError as exc:
            stream = exc
        thread.join(30)
        if caller_secret != agent_secret:
            assert isinstance(stream, StreamError) and isinstance(result["agent"], StreamError)
            left.close()
            continue
        assert isinstance(stream, Stream) and isinstance(result["agent"], Stream)
        result["agent"].send(b"o", b"payload")
        assert stream.feed() == [(b"o", b"payload")]
        # A frame altered on the way fails its MAC.
        raw = bytearray(b"o" + (4).to_bytes(4, "big") + b"evil" + bytes(16))
        right.sendall(bytes(raw))
        with pytest.raises(StreamError, match="authentication"):
            stream.feed()
        left.close()
        right.close()


def test_run_refuses_options_it_cannot_read_and_needs_a_command() -> None:
    gq = [sys.executable, "-m", "gq.cli.main"]
    no_cmd = subprocess.run([*gq, "run"], capture_output=True, text=True, timeout=30)
    assert no_cmd.returncode != 0 and "needs a command" in no_cmd.stderr
    bad = subprocess.run([*gq, "run", "--no-such-option", "true"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode != 0 and "cannot read these options" in bad.stderr
    usage = subprocess.run([*gq, "alloc", "--help"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0 and re.search(r"usage: gq alloc", usage.stdout)


def test_srun_outside_a_job_is_gq_run_and_salloc_is_gq_alloc(cluster: LiveCluster) -> None:
    env = dict(cluster.env, XDG_DATA_HOME=str(cluster.root / "data"))
    srun = subprocess.run(
        [sys.executable, "-c", "import sys; from gq.slurm.srun import main; sys.exit(main())",
         "-N", "1", "-l", "--gres=gpu:1", "sh", "-c",
         'echo "alone $SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES"; exit 5'],
        env=env, cwd=cluster.work, capture_output=True, text=True, timeout=60)
    assert srun.returncode == 5, srun.stderr
    assert re.fullmatch(r"alone \d+ gpus=\d\n", srun.stdout), srun.stdout
    salloc = subprocess.run(
        [sys.executable, "-c", "import sys; from gq.slurm.salloc import main; sys.exit(main())",
         "-N", "2", "sh", "-c", 'echo "name=$SLURM_JOB_NAME gpus=${CUDA_VISIBLE_DEVICES-}"; '
         'srun -N 2 -o step-%t.out true'],
        env=env, cwd=cluster.work, capture_output=True, text=True, timeout=60)
    assert salloc.returncode == 0, salloc.stderr
    assert salloc.stdout == "name=interactive gpus=\n", "Slurm's salloc: no GPU unless asked"
    assert re.search(r"^salloc: Granted job allocation \d+", salloc.stderr, re.M), salloc.stderr
    assert "salloc: Relinquishing job allocation" in salloc.stderr


def test_gq_run_and_alloc_load_neither_typer_nor_rich_nor_zmq() -> None:
    code = ("import sys; from gq.cli import main, interactive; import gq.client, gq.runagent; "
            "from gq.slurm import srun, salloc; "
            "print(sorted({'typer', 'rich', 'zmq'} & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_ctrl_c_without_pty_reaches_the_command_as_sigint(cluster: LiveCluster) -> None:
    term = _spawn(cluster, "run", "-g", "0", "sh", "-c",
                  'trap "echo got-int; exit 9" INT; echo ready; while :; do sleep 0.1; done')
    try:
        term.expect_exact("ready")
        term.sendcontrol("c")  # this terminal is not raw: SIGINT to gq run, sent on
        term.expect_exact("got-int")
        term.expect(pexpect.EOF)
    finally:
        term.close(force=True)
    assert term.exitstatus == 9, term.before


def test_sigterm_to_gq_run_cancels_its_job(cluster: LiveCluster) -> None:
    caller = subprocess.Popen([sys.executable, "-m", "gq.cli.main", "run", "-g", "1", "sleep",
                               "100"], env=cluster.env, cwd=cluster.work,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        def running() -> int | None:
            with cluster.client() as c:
                jobs = [j for j in c.queue() if j["state"] == "RUNNING"]
            return jobs[0]["id"] if jobs and _gpus_held(cluster) else None
        job = wait_for(running, "gq run's job to run")
        wait_for(lambda: any(p.info["cmdline"] == ["sleep", "100"]
                             for p in psutil.process_iter(["cmdline"])), "the command to run")
        caller.send_signal(signal.SIGTERM)
        _, err = caller.communicate(timeout=60)
    finally:
        caller.kill()
    assert caller.returncode != 0 and "cancelling job" in err, err
    assert cluster.wait_state(job, "CANCELLED", "FAILED", "COMPLETED")["state"] == "CANCELLED"
    wait_for(lambda: _gpus_held(cluster) == [], "the job's GPU to be free")
