"""`gqnode --virtual N`: N node identities in one process, a test and benchmark mode.

Each identity is a whole `NodeDaemon`, with its own name (NAME-v001, ...), socket, CURVE key,
state directory, fake GPUs, outbox and runs. This module only gives them one ZeroMQ context and
one set of signal flags, runs their loops on one poller, and hands each reaped child to the
identity that owns it, so that a few processes can stand in for hundreds of hosts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import zmq

from gq import service
from gq.node.daemon import NodeDaemon, reap_children

log = logging.getLogger("gq.node")

#: Makes the identity of a name, on the shared context and signal flags.
MakeNode = Callable[[str, zmq.Context, service.Signals], NodeDaemon]


def names(base: str, count: int) -> list[str]:
    """BASE-v001 ... BASE-vNNN (wider numbers past 999, so they still sort in order)."""
    width = max(3, len(str(count)))
    return [f"{base}-v{i:0{width}d}" for i in range(1, count + 1)]


class VirtualNodes:
    def __init__(self, make: MakeNode, base: str, count: int):
        self.ctx = zmq.Context()
        self.signals = service.Signals()
        self.nodes: list[NodeDaemon] = []
        try:
            for name in names(base, count):
                self.nodes.append(make(name, self.ctx, self.signals))
        except BaseException:
            self.close()  # the sockets made so far, or the context never terminates
            raise

    def run(self) -> int:
        for node in self.nodes:
            node.start()
        poller = zmq.Poller()
        by_sock = {}
        for node in self.nodes:
            poller.register(node.sock, zmq.POLLIN)
            by_sock[node.sock] = node
        poller.register(self.signals.wake_r, zmq.POLLIN)
        service.notify("READY=1")
        log.info("gqnode: %d virtual nodes %s..%s up (a test mode), %d GPUs each",
                 len(self.nodes), self.nodes[0].name, self.nodes[-1].name,
                 len(self.nodes[0].gpus))
        while True:
            timeout = max(0.0, min(n.due() for n in self.nodes) - time.monotonic())
            readable = {by_sock[s] for s, _ in poller.poll(int(timeout * 1000) + 1)
                        if s in by_sock}
            self.signals.drain()
            if self.signals.stop_requests:
                log.info("stop signal: gqnode stops; %d jobs keep running",
                         sum(len(n.runs) for n in self.nodes))
                return 0
            woken = set(readable)
            if self.signals.child_exited:
                self.signals.child_exited = False
                for pid, status in reap_children():
                    woken.update(n for n in self.nodes if n.reaped(pid, status))
            now = time.monotonic()
            # Only the identities with news or a timer due take a turn, as each would wake
            # alone on its own host.
            for node in self.nodes:
                if node in woken or node.due() <= now:
                    node.step(node in readable)
                    self._timers()

    def _timers(self) -> None:
        """Serve the timers (heartbeats above all) that came due while another identity
        worked: launching its jobs forks a shepherd each, and a host's worth for each of many
        identities in one pass would otherwise keep the rest silent past gqd's node timeout."""
        now = time.monotonic()
        for node in self.nodes:
            if node.due() <= now:
                node.step(False)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        self.ctx.term()
