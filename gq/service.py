"""What both daemons share: stderr logging, flag-only signal handling, and systemd readiness."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, NoReturn

from gq.errors import ExitStatus, end

if TYPE_CHECKING:
    from _typeshed import SupportsWrite


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """argparse's words, with the status of a usage error named where statuses are."""
        self.print_usage(sys.stderr)
        self.exit(int(ExitStatus.USAGE), f"{self.prog}: error: {message}\n")

    def print_help(self, file: SupportsWrite[str] | None = None) -> None:
        """argparse's, but not silent on a failed write (argparse ignores it): `gqd --help`
        into a closed pipe ends as gq's commands do."""
        if file is not None:
            return super().print_help(file)
        try:
            sys.stdout.write(self.format_help())
            sys.stdout.flush()
        except OSError as exc:
            raise SystemExit(end(exc, "")) from None


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The options every daemon takes."""
    p = _Parser(prog=prog, description=description)
    p.add_argument("--config", help="config file (default: $GQ_CONFIG or /etc/gq/gq.toml)")
    p.add_argument("--log-level", default=os.environ.get("GQ_LOG_LEVEL", "INFO"))
    return p


def setup_logging(level: str = "INFO") -> None:
    # journald stamps each line itself, but a personal cluster's log file needs the time.
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class Signals:
    """Signal handlers only count and set flags; the loop acts on them.

    A socketpair is registered as Python's wakeup fd so a poll() returns at once on a signal.
    """

    def __init__(self) -> None:
        self.stop_requests = 0
        self.reload = False
        self.child_exited = False
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        signal.signal(signal.SIGHUP, self._hup)

    def watch_children(self) -> None:
        signal.signal(signal.SIGCHLD, self._chld)

    def _stop(self, signum: int, frame: object) -> None:
        self.stop_requests += 1

    def _hup(self, signum: int, frame: object) -> None:
        self.reload = True

    def _chld(self, signum: int, frame: object) -> None:
        self.child_exited = True

    def drain(self) -> None:
        try:
            while self.wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass


def notify(state: str) -> None:
    """sd_notify(3) without libsystemd: a datagram to $NOTIFY_SOCKET, if systemd gave us one."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(state.encode(), address)
        except OSError:
            logging.getLogger("gq").warning("could not notify systemd at %s", address)
