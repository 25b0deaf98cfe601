"""`gq api`: the process. Reads [api] (gq.conf(5)), loads its relay key, serves HTTP with uvicorn
(TLS with [api] tls_cert and tls_key) until SIGTERM."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gq import config as config_mod
from gq import keys, service
from gq.errors import ConfigError, GqError, start_status

log = logging.getLogger("gq.api")


def head_endpoint(cfg: config_mod.Config) -> str:
    """gqd's relay endpoint as gq api reaches it: [api] head, [relay] head, else gqd's own
    relay_endpoint (gq api on the head host), its wildcard host made 127.0.0.1."""
    chosen = cfg.api.head or cfg.relay.head or cfg.head.relay_endpoint
    if not chosen:
        raise ConfigError(f"{cfg.path or '<defaults>'}: [api] head must name gqd's relay "
                          "endpoint (gqd's [head] relay_endpoint), e.g. tcp://head:6820")
    return chosen.replace("://*:", "://127.0.0.1:").replace("://0.0.0.0:", "://127.0.0.1:")


def listen_address(cfg: config_mod.Config) -> tuple[str, int]:
    host, sep, port = cfg.api.listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"{cfg.path or '<defaults>'}: [api] listen must be HOST:PORT, not "
                          f"{cfg.api.listen!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def serve(cfg: config_mod.Config, name: str) -> int:
    import uvicorn

    from gq.api.app import make
    from gq.api.link import HeadLink
    if bool(cfg.api.tls_cert) != bool(cfg.api.tls_key):
        raise ConfigError(f"{cfg.path or '<defaults>'}: [api] tls_cert and tls_key go together")
    curve = keys.node_keys(Path(cfg.auth.key_dir), name)  # a missing key stops us here
    head = head_endpoint(cfg)
    host, port = listen_address(cfg)
    link = HeadLink(head, curve, cfg.api.sockets, cfg.api.timeout_s)
    server = _server_class()(uvicorn.Config(
        make(cfg.api, link), host=host, port=port, log_level="warning", access_log=False,
        ssl_certfile=cfg.api.tls_cert or None, ssl_keyfile=cfg.api.tls_key or None,
        lifespan="on", timeout_graceful_shutdown=5, server_header=False))
    scheme = "https" if cfg.api.tls_cert else "http"
    log.info("gq api %s serving %s://%s:%d for gqd at %s", name, scheme, host, port, head)
    if not _loopback(host) and not cfg.api.tls_cert:
        log.warning("[api] listen %s is not loopback and has no TLS: tokens cross the network "
                    "in clear (put a TLS proxy in front, docs/API.md)", cfg.api.listen)
    server.run()
    service.notify("STOPPING=1")
    return 0


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, stopped by gq's rule: SIGTERM or SIGINT ends it gracefully and gq
        api exits 0 (uvicorn itself raises the signal again after its shutdown); a second one
        ends it at once."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            service.notify("READY=1")  # listening now (systemd's Type=notify)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            def stop(signum: int, frame: object) -> None:
                if self.should_exit:
                    self.force_exit = True
                self.should_exit = True
            old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
    return Server


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def main(argv: list[str] | None = None) -> int:
    parser = service.parser("gq api", "gq's HTTP API: jobs, nodes and events for the holders "
                            "of tokens (gq token create), forwarded to gqd")
    parser.add_argument("--name", default=None,
                        help="its relay key's name (default: [api] name)")
    parser.add_argument("--listen", default=None, help="HOST:PORT (default: [api] listen)")
    args = parser.parse_args(argv)
    service.setup_logging(args.log_level)
    try:
        cfg = config_mod.load(args.config)
        if args.listen:
            cfg.api.listen = args.listen
        name = keys.check_name(args.name or cfg.api.name or socket.gethostname().split(".")[0])
        return serve(cfg, name)
    except (GqError, OSError) as exc:
        log.error("gq api cannot start: %s", exc)
        return start_status(exc)


if __name__ == "__main__":
    sys.exit(main())
