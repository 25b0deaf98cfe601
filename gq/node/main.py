"""gqnode's command line: parse it, build the node (or `--virtual` nodes), run the loop.

Apart from gq.node.daemon so that the daemon and gq.node.virtual, which both this module builds,
need not import each other.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import psutil
import zmq

from gq import config as config_mod
from gq import keys, service
from gq.errors import GqError, start_status
from gq.fsutil import private_dir
from gq.model import parse_size
from gq.node.cache import WarmCache
from gq.node.daemon import NodeDaemon
from gq.node.gpus import FAULT_FILE, TELEMETRY_FILE, open_gpus
from gq.node.health import HealthCheck
from gq.node.isolation import NodeIsolation
from gq.node.virtual import VirtualNodes
from gq.pidfile import acquire

log = logging.getLogger("gq.node")


def main(argv: list[str] | None = None) -> int:
    parser = service.parser("gqnode", "gq node daemon")
    parser.add_argument("--head", help="gqd's node endpoint, e.g. tcp://head:6818")
    parser.add_argument("--name", default=None, help="node name (default: the host name)")
    parser.add_argument("--fake-gpus", default=None, metavar="SPEC",
                        help="pretend to have these GPUs: 8, 8xh100:80G, 4xa100:40G,4xl4:24G")
    parser.add_argument("--state-dir", default=None)
    parser.add_argument("--addr", default=None, help="address other nodes reach this one at")
    parser.add_argument("--cpus", type=int, default=None,
                        help="CPUs offered to jobs (default: [node] cpus, else the host's)")
    parser.add_argument("--mem", default=None,
                        help="memory offered to jobs, e.g. 256G (default: [node] mem, else the host's)")
    parser.add_argument("--features", default=None,
                        help="the node's features, comma-separated (default: [node] features)")
    parser.add_argument("--virtual", type=int, default=0, metavar="N",
                        help="TEST/BENCHMARK MODE, not for production: run N node identities "
                        "NAME-v001... in this one process, each with its own state directory "
                        "(under this one), CURVE key and --fake-gpus")
    args = parser.parse_args(argv)
    if args.virtual < 0 or (args.virtual and not args.fake_gpus):
        # Real GPUs belong to one node: N identities sharing them would hand each out N times.
        parser.error("--virtual takes a count of 1 or more, and needs --fake-gpus")
    service.setup_logging(args.log_level)
    os.umask(0o077)  # what gqnode writes is its own (a shepherd sets the job's umask)
    try:
        cfg = config_mod.load(args.config)
        name = args.name or socket.gethostname().split(".")[0]
        state_dir = Path((args.state_dir or cfg.node.state_dir).replace("{name}", name))
        private_dir(state_dir, 0o711)
        lock = acquire(state_dir / "gqnode.pid")
        if args.virtual:
            daemon: NodeDaemon | VirtualNodes = VirtualNodes(
                lambda vname, ctx, signals: _node(args, cfg, vname, state_dir / vname, ctx,
                                                  signals), name, args.virtual)
        else:
            daemon = _node(args, cfg, name, state_dir)
    except (GqError, OSError, zmq.ZMQError) as exc:
        log.error("gqnode cannot start: %s", exc)
        return start_status(exc)
    try:
        return daemon.run()
    finally:
        daemon.close()
        os.close(lock)


def _node(args: Any, cfg: config_mod.Config, name: str, state_dir: Path,
          ctx: zmq.Context | None = None, signals: service.Signals | None = None) -> NodeDaemon:
    """The node `name` as the command line and configuration describe it."""
    gpus = open_gpus(args.fake_gpus, fault_file=state_dir / FAULT_FILE,
                     telemetry_file=state_dir / TELEMETRY_FILE)
    cpus = args.cpus or cfg.node.cpus or os.cpu_count() or 1
    mem = parse_size(args.mem or cfg.node.mem) or psutil.virtual_memory().total
    # Virtual identities share one host: their CPU picks would collide, and a benchmark of
    # thousands of jobs measures gq, not cgroups. They get cgroups only when asked for.
    kind = "off" if args.virtual and cfg.node.cgroups == "auto" else None
    isolation = NodeIsolation.configured(cfg.node, name, state_dir, gpus.discover(),
                                         gpus.device_minors(), args.cpus or cfg.node.cpus, mem,
                                         kind)
    return NodeDaemon(
        name=name, head=args.head or cfg.node.head, state_dir=state_dir, gpus=gpus,
        addr=args.addr or socket.gethostname(), cpus=cpus, mem=mem, isolation=isolation,
        features=args.features.split(",") if args.features is not None else cfg.node.features,
        heartbeat_s=cfg.node.heartbeat_s, head_lease_s=cfg.node.head_lease_s,
        curve=keys.node_keys(Path(cfg.auth.key_dir), name) if cfg.auth.curve else None,
        health=HealthCheck(cfg.node.health_check, cfg.node.health_check_interval_s,
                           cfg.node.health_check_timeout_s, state_dir / "health-check.out",
                           name)
        if cfg.node.health_check else None, ctx=ctx, signals=signals, relay=cfg.relay.head,
        cache=WarmCache(cfg.node.cache_keys_per_gpu, cfg.node.cache_dirs))


if __name__ == "__main__":
    sys.exit(main())
