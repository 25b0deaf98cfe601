"""`gq watch` in a real terminal (a pty) and into a pipe, against a live cluster (issue 6,
Done when 6), and colour as --color and NO_COLOR say."""

from __future__ import annotations

import fcntl
import os
import re
import select
import struct
import subprocess
import sys
import termios
import time

from tests.conftest import DEADLINE_S, LiveCluster

#: CSI and OSC escape sequences, and the charset switches some terminals get.
ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][0-9A-B]")


def in_pty(cluster: LiveCluster, *args: str, rows: int = 40, cols: int = 160,
           env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `gq ARGS` with a pty as its terminal; (exit code, everything it drew)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gq.cli.main", *args], stdin=slave,
                            stdout=slave, stderr=slave, cwd=cluster.work, start_new_session=True,
                            env={**cluster.env, "TERM": "xterm-256color", **(env or {})})
    os.close(slave)
    screen = b""
    deadline = time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                screen += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return code, screen.decode(errors="replace")


def test_watch_draws_jobs_and_gpu_holders_in_a_terminal(cluster: LiveCluster) -> None:
    job = cluster.submit("-g", "2", "-J", "watched", "--wrap", "sleep 60")
    waiting = cluster.submit("--hold", "--wrap", "true")
    node = next(iter(cluster.wait_state(job, "RUNNING")["gpu_ids"]))
    code, raw = in_pty(cluster, "watch", "--count", "2", "--interval", "0.3")
    assert code == 0, raw
    assert "\x1b[?1049h" in raw and "\x1b[?1049l" in raw  # the full screen, left on exit
    text = ANSI.sub("", raw)
    assert "1 running, 1 pending, 2/16 GPUs in use" in text, text
    assert re.search(rf"{node}\s+UP\s+2/8\s+0:{job} 0%\s+1:{job} 0%\s+2:- 0%", text), text
    assert "watched" in text and f"{waiting}" in text and "(JobHeldUser)" in text
    cluster.gq("cancel", str(job), str(waiting), check=True)


def test_watch_off_a_terminal_prints_plain_refreshes(cluster: LiveCluster) -> None:
    job = cluster.submit("--hold", "-J", "piped", "--wrap", "true")
    out = cluster.gq("watch", "-n", "2", "-i", "0.1", check=True).stdout
    assert "\x1b" not in out
    refreshes = [ln for ln in out.splitlines() if ln.startswith("# ")]
    assert len(refreshes) == 2, out
    assert out.count("NODE ") == 2 and out.count("JOBID ") == 2
    assert re.search(rf"^{job}\s+piped\s", out, flags=re.M), out
    assert re.search(r"^node2\s+UP\s+7\s", out, flags=re.M), out  # every GPU, none cut
    assert cluster.gq("watch", "-i", "0").returncode == 2
    cluster.gq("cancel", str(job), check=True)


def test_colour_follows_color_option_and_no_color(cluster: LiveCluster) -> None:
    cluster.submit("--hold", "--wrap", "true")
    code, raw = in_pty(cluster, "queue")
    assert code == 0 and "\x1b[1m" in raw  # bold headers on a terminal
    for args, env in ((("--color", "never", "queue"), {}), (("queue",), {"NO_COLOR": "1"})):
        code, raw = in_pty(cluster, *args, env=env)
        assert code == 0 and "JOBID" in raw and "\x1b[" not in raw, (args, raw)
    piped = cluster.gq("--color", "always", "queue", check=True).stdout
    assert "\x1b[" in piped and "JOBID" in piped
    assert "\x1b" not in cluster.gq("queue", check=True).stdout
