"""A node speaks only for the runs it holds: a report from another registered node (its own valid
CURVE key, a forged report) about a job running elsewhere is logged and dropped by a real gqd."""

from __future__ import annotations

import os
from pathlib import Path

import zmq

from gq import keys, protocol
from tests.conftest import LiveCluster, wait_for

FORGER = "node9"


class NodeClient:
    """A node of its own, allow-listed with its own key, speaking the node protocol by hand."""

    def __init__(self, live: LiveCluster, name: str):
        cfg = live.config()
        key_dir = Path(cfg.auth.key_dir)
        keys.keygen(key_dir, name)
        curve = keys.node_keys(key_dir, name)
        self.name = name
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"{name}/{os.urandom(8).hex()}".encode())
        self.sock.linger = 0
        self.sock.curve_secretkey, self.sock.curve_publickey = curve.secret, curve.public
        self.sock.curve_serverkey = curve.server
        self.sock.connect(cfg.head.node_endpoint)

    def send(self, msg_type: str, **fields: object) -> None:
        self.sock.send(protocol.encode(msg_type, node=self.name, **fields))

    def acked(self, seq: int) -> bool:
        """An ack for `seq` came (gqd handled that report and committed what it did)."""
        while self.sock.poll(100):
            msg = protocol.decode(self.sock.recv(), protocol.HEAD_TO_NODE)
            if msg["type"] == protocol.ACK and msg["seq"] == seq:
                return True
        return False

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def test_a_report_from_a_node_that_does_not_hold_the_run_is_dropped(cluster: LiveCluster) -> None:
    go = cluster.work / "go"
    job = cluster.submit("-g", "1", "--wrap", f"while [ ! -e {go} ]; do sleep 0.1; done; exit 5")
    shown = cluster.wait_state(job, "RUNNING")
    forger = NodeClient(cluster, FORGER)
    try:
        forger.send(protocol.REGISTER, cpus=1, mem=1 << 30, gpus=[], running=[], addr="forger")
        wait_for(lambda: any(n["name"] == FORGER and n["state"] == "UP"
                             for n in cluster.nodes()), "the forging node to register")
        for seq, fields in enumerate(({"event": protocol.STARTED},
                                      {"event": protocol.FINISHED, "state": "COMPLETED",
                                       "exit_code": 0}), start=1):
            forger.send(protocol.REPORT, seq=seq, job_id=job, restart=0, time=0.0, **fields)
            wait_for(lambda: forger.acked(seq), f"gqd to handle forged report {seq}")
    finally:
        forger.close()
    assert cluster.show(job)["state"] == "RUNNING", "a forged end must not end the job"
    log = cluster.log("gqd")
    assert f"dropping finished report for job {job} run 0 from node {FORGER}, which does not " \
        f"hold it (it runs on {shown['node_list'][0]})" in log
    assert f"dropping started report for job {job} run 0 from node {FORGER}" in log
    go.touch()
    done = cluster.wait_state(job, "FAILED", "COMPLETED")
    assert (done["state"], done["exit_code"], done["restart_count"]) == ("FAILED", 5, 0)
