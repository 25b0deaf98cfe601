"""`gq run` (Slurm's srun outside an allocation) and `gq alloc` (salloc): interactive jobs.

Both submit a job with `gq submit`'s options whose script is gq's agent (gq/runagent.py), wait
for it to start, and talk to the agent over the job's own authenticated stream
(gq/runstream.py: the caller listens, the agent connects back). `gq run` runs CMD on the
job's first node attached to the caller's terminal (`--pty`: a real pty there, this terminal
raw; window size forwarded; Ctrl-C reaches the job's foreground process group) and exits with
its status. `gq alloc` holds the allocation while CMD (default $SHELL) runs here with the job's
SLURM_*/GQ_* variables, so that `srun` in it starts steps on the allocated nodes. Either way
the job ends when the command does, or when this caller goes away (the agent sees the stream
close or fall silent).

Typer-free (as the fast path), so a `gq run` costs what a `gq submit` does.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shlex
import signal
import socket
import subprocess
import sys
import termios
import tty
from collections.abc import Iterator
from typing import Any

from gq import runstream
from gq.cli import fast, submission
from gq.errors import GqError, UsageError
from gq.runstream import Stream, StreamError

RUN_OPTIONS = fast.SUBMIT_OPTIONS + ((("--pty",), "pty", bool, False),)
#: Seconds between the caller's looks at a job not yet connected back; most a finished job
#: is waited for (so that its GPUs are free once gq run returns).
PENDING_POLL_S, RELEASE_WAIT_S = 1.0, 30.0

USAGE = {
    "run": "usage: gq run [gq submit's options] [--pty] CMD [ARG...]\n"
           "Run CMD in a new job on its first node, attached to this terminal.",
    "alloc": "usage: gq alloc [gq submit's options] [CMD [ARG...]]\n"
             "Hold a new job's allocation while CMD (default: $SHELL) runs here, with the job's\n"
             "environment (srun in it starts steps on the allocated nodes).",
}


def main(command: str, argv: list[str], prog: str = "") -> int:
    """`gq run` or `gq alloc` (command) with these words; `prog`: as Slurm's srun or salloc
    (Slurm's defaults: no GPU unless asked for; its messages)."""
    name = prog or f"gq {command}"
    if argv[:1] in (["--help"], ["-h"]):
        print(USAGE[command])
        return 0
    parsed = fast.parse(RUN_OPTIONS, argv, interspersed=False)
    if parsed is None:
        raise UsageError(f"cannot read these options of {name} (gq submit's, given before "
                         f"the command: see gq {command} --help)")
    params, given, cmd = parsed
    if command == "run" and not cmd:
        raise UsageError(f"{name} needs a command to run")
    return Session(command, params, given, cmd, prog).run()


def advertised_address() -> str:
    """Where the job's node can reach this host: $GQ_RUN_ADDR, else the address this host
    uses towards gqd (a login host's [relay] head, a TCP [client] endpoint, [node] head: the
    first that names a host other than loopback), else its name's."""
    if os.environ.get("GQ_RUN_ADDR"):
        return os.environ["GQ_RUN_ADDR"]
    from gq import config as config_mod
    try:
        cfg = config_mod.load()
        endpoints = [cfg.relay.head, *cfg.client.endpoints, cfg.node.head]
    except (GqError, OSError, ValueError):
        endpoints = []
    hosts = [ep.rpartition("//")[2].rpartition(":")[0].strip("[]")
             for ep in endpoints if ep.startswith("tcp://")]
    hosts = [h for h in hosts if h not in ("", "*", "0.0.0.0")]
    target = next((h for h in hosts if not _loopback(h)), hosts[0] if hosts else "")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target or socket.gethostname(), 9))
            return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


class Session:
    def __init__(self, command: str, params: dict[str, Any], given: set[str], cmd: list[str],
                 prog: str = ""):
        self.command, self.params, self.given, self.cmd = command, params, given, cmd
        self.prog = prog
        #: Messages start so: `gq: `, or Slurm's `srun: `, `salloc: `.
        self.say = f"{prog or 'gq'}: "
        self.job_id: int | None = None
        self.stop: list[int] = []

    # ------------------------------------------------------------ the job

    def _spec(self, endpoint: str, secret: str) -> dict[str, Any]:
        agent = [sys.executable, "-sE", "-m", "gq.runagent"]
        text = f"#!/bin/sh\nexec {shlex.join(agent)} \"$@\"\n"
        mode = ["--hold"] if self.command == "alloc" else ["--pty"] if self.params["pty"] else []
        fields, _, _ = submission.gather(text, self.params, self.given, _no_directives)
        fields.setdefault("output", "/dev/null")
        env = dict(fields.get("env") or os.environ)
        env.update({runstream.ENDPOINT_ENV: endpoint, runstream.SECRET_ENV: secret})
        fields["env"] = env
        name = os.path.basename(self.cmd[0]) if self.cmd and self.command == "run" \
            else "interactive"
        fields["name"] = fields.get("name") or name
        return submission.build_spec(text, name, mode + self.cmd, fields, slurm=bool(self.prog))

    def run(self) -> int:
        from gq.client import Client
        secret = secrets.token_hex(32)
        address = advertised_address()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as listener, Client() as client:
            listener.bind((address, 0))
            listener.listen(8)
            port = listener.getsockname()[1]
            endpoint = f"[{address}]:{port}" if family == socket.AF_INET6 else f"{address}:{port}"
            with self._signals():
                reply = client.submit_reply([self._spec(endpoint, secret)])
                self.job_id = int(reply["ids"][0])
                for warning in reply.get("warnings") or ():
                    print(f"{self.say}warning: {warning}", file=sys.stderr)
                try:
                    stream = self._wait_for_agent(client, listener, secret)
                    if stream is None:
                        return 128 + (self.stop[0] if self.stop else signal.SIGTERM)
                    code = self._attached(stream) if self.command == "run" \
                        else self._local(stream)
                except BaseException:
                    with contextlib.suppress(GqError, OSError):
                        client.cancel([self.job_id])
                    raise
            self._release(client)
            return code

    def _wait_for_agent(self, client: Any, listener: socket.socket, secret: str
                        ) -> Stream | None:
        """The agent's authenticated stream once the job runs; None when stopped (Ctrl-C, a
        signal) first: the job is cancelled. A job that ends before connecting is an error."""
        said = False
        while not self.stop:
            if select.select([listener], [], [], PENDING_POLL_S)[0]:
                sock, _ = listener.accept()
                try:
                    return Stream.accept(sock, secret)
                except (OSError, StreamError) as exc:
                    print(f"{self.say}refused a connection: {exc}", file=sys.stderr)
                    sock.close()
                    continue
            job = client.show(self.job_id)
            if job["state"] not in ("PENDING", "RUNNING"):
                raise GqError(f"job {self.job_id} ended {job['state']} before it started "
                              f"the command ({job.get('reason') or 'no reason given'})")
            if not said and job["state"] == "PENDING":
                print(f"{self.say}job {self.job_id} queued and waiting for resources",
                      file=sys.stderr)
                said = True
        client.cancel([self.job_id])
        return None

    def _release(self, client: Any) -> None:
        """Wait for the job to end (it does once the agent exits), so that what it held is
        free when this returns; cancel it if it has not."""
        try:
            jobs = client.wait([self.job_id], timeout_s=RELEASE_WAIT_S)
            if jobs and jobs[0]["state"] in ("PENDING", "RUNNING"):
                client.cancel([self.job_id])
        except (GqError, OSError):
            pass

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        """SIGTERM and SIGHUP stop this caller (the job is cancelled); SIGINT too before the
        command runs. The handlers are put back afterwards."""
        def stopping(signum: int, _: Any) -> None:
            self.stop.append(signum)
        old = {s: signal.signal(s, stopping) for s in (signal.SIGINT, signal.SIGTERM,
                                                       signal.SIGHUP)}
        try:
            yield
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    # ------------------------------------------------------------ gq run

    def _attached(self, stream: Stream) -> int:
        """Relay this terminal (or these pipes) to the command until it exits: its status."""
        interrupts: list[int] = []
        signal.signal(signal.SIGINT, lambda signum, _: interrupts.append(signum))
        stdin = sys.stdin.fileno()
        raw = self.params["pty"] and os.isatty(stdin)

        def send_size(*_: Any) -> None:
            if os.isatty(stdin):
                cols, rows = os.get_terminal_size(stdin)
                stream.send(runstream.WINSIZE, runstream.winsize(rows, cols))
        send_size()
        signal.signal(signal.SIGWINCH, send_size)
        saved = termios.tcgetattr(stdin) if raw else None
        if raw:
            tty.setraw(stdin)
        stdin_open = True
        try:
            while True:
                if self.stop:
                    raise GqError(f"stopped by signal {self.stop[0]}: cancelling job "
                                  f"{self.job_id}")
                while interrupts:
                    stream.send(runstream.SIGNAL, bytes([interrupts.pop()]))
                readers: list[Any] = [stream.sock] + ([stdin] if stdin_open else [])
                try:
                    ready = select.select(readers, [], [], 0.5)[0]
                except InterruptedError:
                    continue
                if stdin in ready:
                    data = os.read(stdin, 1 << 16)
                    if data:
                        stream.send(runstream.STDIN, data)
                    else:
                        stream.send(runstream.STDIN_EOF)
                        stdin_open = False
                if stream.sock in ready:
                    for kind, payload in stream.feed():
                        if kind in (runstream.STDOUT, runstream.STDERR):
                            out = 1 if kind == runstream.STDOUT else 2
                            _write_all(out, payload)
                        elif kind == runstream.EXIT:
                            return int(payload.decode() or 0)
                stream.heartbeat()
        except StreamError as exc:
            raise GqError(f"lost the job's stream ({exc})") from None
        finally:
            signal.signal(signal.SIGWINCH, signal.SIG_DFL)
            if saved is not None:
                termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
            stream.close()

    # ------------------------------------------------------------ gq alloc

    def _local(self, stream: Stream) -> int:
        """CMD here with the job's environment while the agent holds the allocation."""
        env: dict[str, str] = {}
        while not env:
            if select.select([stream.sock], [], [], runstream.LOST_S)[0]:
                for kind, payload in stream.feed():
                    if kind == runstream.ENV:
                        env = json.loads(payload.decode())
            else:
                raise GqError("the job sent no environment")
        from gq.slurm import shims
        merged = {**os.environ, **env}
        merged["PATH"] = f"{shims.ensure(shims.user_dir())}:{merged.get('PATH', '')}"
        print(f"{self.say}Granted job allocation {self.job_id} "
              f"({env.get('SLURM_JOB_NODELIST', '')})", file=sys.stderr)
        cmd = self.cmd or [os.environ.get("SHELL", "/bin/sh")]
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the command's
        try:
            child = subprocess.Popen(cmd, env=merged)
        except OSError as exc:
            raise UsageError(f"{cmd[0]}: {exc.strerror}") from None
        lost = False
        while child.poll() is None:
            if self.stop:
                child.send_signal(self.stop.pop())
            if lost:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.5)
                continue
            try:
                if select.select([stream.sock], [], [], 0.5)[0]:
                    stream.feed()
                stream.heartbeat()
            except (StreamError, OSError, InterruptedError) as exc:
                if isinstance(exc, InterruptedError):
                    continue
                print(f"{self.say}job {self.job_id}: the allocation is gone ({exc})",
                      file=sys.stderr)
                lost = True
        code = child.returncode if child.returncode >= 0 else 128 - child.returncode
        stream.finish(runstream.EXIT, str(code).encode())
        print(f"{self.say}Relinquishing job allocation {self.job_id}", file=sys.stderr)
        return code


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            select.select([], [fd], [])


def _no_directives(words: list[str]) -> submission.Parsed:
    raise UsageError("an interactive job's script has no directives")
