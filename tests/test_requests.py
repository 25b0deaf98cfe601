"""The client requests, typed (gq/requests.py): declared once, their schemas the protocol's,
read once in gqd, and never loaded by the CLI."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gq import protocol, requests, stepwire
from gq.errors import ProtocolError

REPO = Path(__file__).resolve().parent.parent


def _msg(kind: str, **fields: Any) -> dict[str, Any]:
    return {"v": protocol.PROTOCOL_VERSION, "type": kind, **fields}


def test_the_declared_requests_are_the_protocols():
    assert set(requests.TYPES) == protocol.DECLARED
    assert protocol.DECLARED <= protocol.CLIENT_REQUESTS
    for kind, cls in requests.TYPES.items():
        assert cls.TYPE == kind and dataclasses.is_dataclass(cls)
        # Every request carries the caller's fields first, as the protocol's maps did.
        assert list(cls.SCHEMA)[:5] == list(protocol._CALLER), kind
        assert protocol.SCHEMAS[kind] == cls.SCHEMA
    # The constants name the same types.
    names = [getattr(module, name) for module in (protocol, stepwire) for name in dir(module)
             if name.isupper()]
    assert {n for n in names if isinstance(n, str)} >= protocol.DECLARED


def test_a_request_reads_typed_with_its_defaults():
    msg = protocol.checked(_msg(protocol.CANCEL, rid=3, ids=[1, "2_3"]))
    req = requests.read(msg)
    assert type(req) is requests.Cancel
    assert (req.rid, req.ids, req.user, req.signal, req.batch_only, req.filter) == (
        3, (1, "2_3"), None, None, False, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.ids = ()  # type: ignore[misc]
    queue = requests.read(protocol.checked(_msg(protocol.QUEUE, states=["PENDING"], limit=5)))
    assert (queue.states, queue.after, queue.limit, queue.all) == (("PENDING",), 0, 5, False)
    step = requests.read(protocol.checked(_msg("step_launch", job_id=1, argv=["x"], env={},
                                               cwd="/")))
    assert (step.argv, step.nodelist, step.label) == (("x",), None, False)
    # A type declared only as a schema in gq.protocol (none now) would stay its checked map.
    ping = _msg("ping")
    requests.TYPES.pop("ping")
    try:
        assert requests.read(ping) is ping
    finally:
        requests.TYPES["ping"] = requests.Ping


@pytest.mark.parametrize("kind,fields,words", [
    (protocol.UPDATE, {"ids": [1], "qos": None}, "update: field 'qos' has type NoneType"),
    (protocol.WAIT, {"ids": [1], "park_s": None}, "wait: field 'park_s'"),
    (protocol.SHOW, {"id": 1.5}, "show: field 'id'"),
    (protocol.CANCEL, {"ids": [1], "filter": {"bogus": 1}},
     "cancel: filter: unknown field 'bogus'"),
    (protocol.HISTORY, {"since": 0}, "history: missing field 'until'"),
])
def test_what_may_only_be_left_out_is_refused_as_before(kind: str, fields: dict[str, Any],
                                                         words: str):
    """A field that is None only when absent (unset()) may not be None on the wire."""
    with pytest.raises(ProtocolError, match=words):
        protocol.checked(_msg(kind, **fields))


def test_the_cli_never_loads_the_declarations(tmp_path: Path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "s"),
           "XDG_RUNTIME_DIR": str(tmp_path / "r")}
    env.pop("GQ_CONFIG", None)
    code = ("import sys\nfrom gq.cli.main import main\nmain(sys.argv[1:])\n"
            "print([m for m in ('gq.requests', 'gq.declare', 'gq.messages') if m in sys.modules])")
    for args in (["submit", "--wrap", "true"], ["queue"], ["cancel", "1"]):
        proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                              text=True, env=env, cwd=REPO)
        assert proc.stdout.split()[-1:] == ["[]"], (args, proc.stdout, proc.stderr)
