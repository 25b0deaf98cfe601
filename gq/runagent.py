"""The job side of an interactive job: the batch script of `gq run` and `gq alloc` jobs runs
`python -m gq.runagent [--pty|--hold] CMD...` on the job's first node, as the job's user in
its cgroup with its environment (GPUs, SLURM_*).

It connects back to the caller (gq/runstream.py: endpoint and one-time secret in its
environment, removed from the command's), then either runs CMD (in a pty with --pty, else on
pipes), relaying stdin, stdout, stderr, window size and signals until CMD ends, and exits with
its status (128+N for signal N), which ends the job; or, with --hold (`gq alloc`), sends the
job's environment and holds the allocation until the caller says quit. When the stream is
lost (the caller killed, its host gone: the connection closes, or heartbeats stop), the
command's process group gets SIGHUP, then SIGKILL, and the job ends.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from typing import Any

from gq import runstream
from gq.runstream import Stream, StreamError

#: Seconds the command's process group has between SIGHUP and SIGKILL once the caller is gone.
HANGUP_GRACE_S = 2.0
#: The job's variables `gq alloc` hands its command: not those of this node alone.
NODE_LOCAL = frozenset({"GQ_ENDPOINT", "GQ_CONFIG", "GQ_NODE_RANK", "SLURM_NODEID",
                        "SLURM_PROCID", "SLURM_LOCALID", "SLURMD_NODENAME",
                        "SLURM_TOPOLOGY_ADDR", "SLURM_GTIDS", runstream.ENDPOINT_ENV,
                        runstream.SECRET_ENV})


def _connect() -> Stream:
    endpoint = os.environ.pop(runstream.ENDPOINT_ENV, "")
    secret = os.environ.pop(runstream.SECRET_ENV, "")
    if not endpoint or not secret:
        raise StreamError("no caller to connect to: this runs as an interactive job's script")
    host, port = runstream.parse_endpoint(endpoint)
    sock = socket.create_connection((host, port), timeout=runstream.HANDSHAKE_S)
    return Stream.connect(sock, secret)


def _status(wait_status: int) -> int:
    if os.WIFSIGNALED(wait_status):
        return 128 + os.WTERMSIG(wait_status)
    return os.WEXITSTATUS(wait_status)


def _set_size(fd: int, payload: bytes) -> None:
    rows, cols = struct.unpack(">HH", payload[:4])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class Child:
    """CMD, in a pty of its own (a session whose controlling terminal it is) or on pipes."""

    def __init__(self, argv: list[str], use_pty: bool):
        self.pty = use_pty
        if use_pty:
            pid, fd = pty.fork()
            if pid == 0:
                try:
                    os.execvp(argv[0], argv)
                except OSError as exc:
                    os.write(2, f"gq run: {argv[0]}: {exc.strerror}\n".encode())
                os._exit(127)
            self.pid, self.stdin = pid, fd
            self.outputs = {fd: runstream.STDOUT}
        else:
            try:
                proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, start_new_session=True)
            except OSError as exc:
                raise StreamError(f"{argv[0]}: {exc.strerror}") from None
            assert proc.stdin and proc.stdout and proc.stderr
            self.pid, self.stdin = proc.pid, proc.stdin.fileno()
            os.set_blocking(self.stdin, False)
            self.proc = proc
            self.outputs = {proc.stdout.fileno(): runstream.STDOUT,
                            proc.stderr.fileno(): runstream.STDERR}
        self.status: int | None = None

    def poll(self) -> None:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = _status(status)

    def signal(self, signum: int) -> None:
        """To the foreground process group of its terminal, else to its own group."""
        try:
            group = os.tcgetpgrp(self.stdin) if self.pty else self.pid
        except OSError:
            group = self.pid
        for target in (group, self.pid):
            try:
                os.killpg(target, signum)
                return
            except OSError:
                continue

    def hang_up(self) -> None:
        self.signal(signal.SIGHUP)
        deadline = time.monotonic() + HANGUP_GRACE_S
        while self.status is None and time.monotonic() < deadline:
            select.select([], [], [], 0.05)
            self.poll()
        if self.status is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            os.waitpid(self.pid, 0)


def _relay(stream: Stream, child: Child) -> int:
    """Relay until CMD ends (its status) or the stream is lost (StreamError)."""
    pending_in = b""
    stdin_eof = False
    while True:
        child.poll()
        readers: list[Any] = [stream.sock, *child.outputs]
        writers = [child.stdin] if pending_in else []
        ready, writable, _ = select.select(readers, writers, [], 0.2)
        for fd in [r for r in ready if r in child.outputs]:
            try:
                data = os.read(fd, 1 << 16)
            except OSError:  # EIO: the pty's other side is closed
                data = b""
            if data:
                stream.send(child.outputs[fd], data)
            else:
                del child.outputs[fd]
        if stream.sock in ready:
            for kind, payload in stream.feed():
                if kind == runstream.STDIN and child.stdin >= 0:
                    pending_in += payload
                elif kind == runstream.STDIN_EOF:
                    stdin_eof = True
                elif kind == runstream.WINSIZE and child.pty:
                    _set_size(child.stdin, payload)
                elif kind == runstream.SIGNAL and payload:
                    child.signal(payload[0])
                elif kind == runstream.QUIT:
                    raise StreamError("the caller quit")
        if writable and pending_in:
            try:
                pending_in = pending_in[os.write(child.stdin, pending_in):]
            except OSError:
                pending_in = b""
        if stdin_eof and not pending_in:
            stdin_eof = False
            if child.pty:
                pending_in = b"\x04"  # ^D: end of input at the terminal
            else:
                os.close(child.stdin)
                child.stdin = -1
        if child.status is not None and (not child.outputs or not ready):
            return child.status
        stream.heartbeat()


def _hold(stream: Stream) -> int:
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("SLURM_", "GQ_")) and k not in NODE_LOCAL}
    stream.send(runstream.ENV, json.dumps(env).encode())
    while True:
        if select.select([stream.sock], [], [], 0.5)[0]:
            for kind, payload in stream.feed():
                if kind == runstream.EXIT:
                    return int(payload.decode() or 0)
        stream.heartbeat()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    use_pty = hold = False
    while args[:1] and args[0] in ("--pty", "--hold"):
        use_pty, hold = use_pty or args[0] == "--pty", hold or args[0] == "--hold"
        args.pop(0)
    try:
        stream = _connect()
    except (OSError, StreamError) as exc:
        print(f"gq run: cannot reach the caller: {exc}", file=sys.stderr)
        return 1
    if hold:
        try:
            return _hold(stream)
        except (OSError, StreamError):
            return 0
    try:
        child = Child(args or [os.environ.get("SHELL", "/bin/sh")], use_pty)
    except StreamError as exc:
        stream.send(runstream.STDERR, f"gq run: {exc}\n".encode())
        stream.finish(runstream.EXIT, b"127")
        return 127
    try:
        code = _relay(stream, child)
    except (OSError, StreamError) as exc:
        print(f"gq run: the caller is gone ({exc}): ending the job", file=sys.stderr)
        child.hang_up()
        return 128 + signal.SIGHUP
    stream.finish(runstream.EXIT, str(code).encode())
    return code


if __name__ == "__main__":
    sys.exit(main())
