"""CurveZMQ key pairs for gqd and gqnode: writing them (secrets 0600), loading, the allow-list.

Layout of a key directory (`[auth] key_dir`):

    gqd.key             gqd's public key; every node and login host needs it
    gqd.key_secret      gqd's secret key; the head host only
    NAME.key_secret     node or relay NAME's secret key; that host only
    nodes/NAME.key      the allow-list on the head host: node NAME's public key
    relays/NAME.key     the relays' allow-list on the head host: relay NAME's public key, and
                        its kind (`login`: may speak for the uids it sees; `api`: tokens only)

The files use pyzmq's certificate format (`zmq.auth.load_certificate` reads them), but unlike
`zmq.auth.create_certificates` a secret file is created 0600 from the start, never world-readable.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth

from gq.errors import ConfigError, UsageError

#: The key pair name of the head.
HEAD = "gqd"
#: The allow-list subdirectory of node public keys.
NODES = "nodes"
#: The allow-list subdirectory of relay public keys (login hosts, gq api).
RELAYS = "relays"
#: A relay's kinds: a login host's `gq relay` forwards the uid the kernel gave it (`as_uid`);
#: gq api's may act only through a user's token, so a compromised API host cannot impersonate
#: users who have none.
LOGIN, API = "login", "api"
RELAY_KINDS = (LOGIN, API)
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
#: What a node name may be, so it is a safe file name too.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

_CERT = """#   ZeroMQ CURVE {kind} Certificate, written by gq admin keygen
#   {warning}

metadata
{metadata}curve
    public-key = "{public}"
{secret}"""
#: The line of a relay's certificate that names its kind (in the metadata section, which
#: pyzmq's load_certificate skips).
_KIND_RE = re.compile(r'^\s+kind\s*=\s*"([a-z]+)"\s*$', re.MULTILINE)


@dataclass(frozen=True)
class CurveKeys:
    """What one side needs: its own pair, and (for a node) the server's public key."""

    public: bytes
    secret: bytes
    server: bytes | None = None


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise UsageError(f"bad key name {name!r}: letters, digits, '.', '_', '-' only "
                         "(at most 63), starting with a letter or digit")
    return name


def keygen(key_dir: Path, name: str, force: bool = False, relay: str | None = None
           ) -> list[Path]:
    """Write NAME.key and NAME.key_secret (0600) into `key_dir`; for a node, also put its public
    key into the allow-list (nodes/NAME.key); for a relay of kind `relay` (login, api), into the
    relays' (relays/NAME.key). The paths written."""
    check_name(name)
    if relay is not None and relay not in RELAY_KINDS:
        raise UsageError(f"bad relay kind {relay!r}: expected {' or '.join(RELAY_KINDS)}")
    if relay is not None and name == HEAD:
        raise UsageError(f"{HEAD!r} is the head's key, not a relay's")
    listed = key_dir / (RELAYS if relay else NODES) / f"{name}{PUBLIC_SUFFIX}"
    # A node and a relay of one name would share NAME.key_secret: the second would replace it.
    other = key_dir / (NODES if relay else RELAYS) / f"{name}{PUBLIC_SUFFIX}"
    if other.exists():
        raise UsageError(f"{name!r} is already a {'node' if relay else 'relay'} ({other}): "
                         "a node and a relay need different names")
    public, secret = zmq.curve_keypair()
    key_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    paths = [key_dir / f"{name}{PUBLIC_SUFFIX}", key_dir / f"{name}{SECRET_SUFFIX}"]
    if name != HEAD:
        paths.append(listed)
    existing = [p for p in paths if p.exists()]
    if existing and not force:
        raise UsageError(f"{existing[0]} exists; --force replaces it (and the host or gqd using "
                         "the old key must get the new one)")
    _write(paths[1], _cert(public, secret, relay), 0o600)
    _write(paths[0], _cert(public, None, relay), 0o644)
    if name != HEAD:
        paths[2].parent.mkdir(exist_ok=True, mode=0o755)
        _write(paths[2], _cert(public, None, relay), 0o644)
    return paths


def ensure(key_dir: Path, names: list[str]) -> None:
    """Key pairs for each name that has none yet (`gq up`: no manual steps)."""
    for name in names:
        if not (key_dir / f"{name}{SECRET_SUFFIX}").exists():
            keygen(key_dir, name, force=True)


def _cert(public: bytes, secret: bytes | None, relay: str | None = None) -> str:
    kind = "**Secret**" if secret else "Public"
    warning = ("Keep this file 0600, on its own host only." if secret
               else "Safe to copy to the hosts that need it.")
    secret_line = f'    secret-key = "{secret.decode()}"\n' if secret else ""
    metadata = f'    kind = "{relay}"\n' if relay else ""
    return _CERT.format(kind=kind, warning=warning, public=public.decode(), secret=secret_line,
                        metadata=metadata)


def _write(path: Path, text: str, mode: int) -> None:
    """Create `path` with `mode` from the first byte (no window where a secret is readable)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask may have taken bits from a public file's mode
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_public(path: Path) -> bytes:
    try:
        public, _ = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CURVE public key {path}: {exc} (gq admin keygen "
                          "writes key pairs)") from None
    return public


def load_secret(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a secret key file that no one else can read."""
    try:
        mode = os.stat(path).st_mode
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CURVE secret key {path}: {exc} (gq admin keygen "
                          "writes key pairs)") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"CURVE secret key {path} is accessible to other users (mode "
                          f"{stat.S_IMODE(mode):04o}); chmod 600 it")
    if secret is None:
        raise ConfigError(f"{path} holds no secret key")
    return public, secret


def head_keys(key_dir: Path) -> CurveKeys:
    public, secret = load_secret(key_dir / f"{HEAD}{SECRET_SUFFIX}")
    return CurveKeys(public=public, secret=secret)


def node_keys(key_dir: Path, name: str) -> CurveKeys:
    """A node's or a relay's own pair, with gqd's public key."""
    public, secret = load_secret(key_dir / f"{check_name(name)}{SECRET_SUFFIX}")
    return CurveKeys(public=public, secret=secret,
                     server=load_public(key_dir / f"{HEAD}{PUBLIC_SUFFIX}"))


def allowed_nodes(key_dir: Path) -> dict[bytes, str]:
    """The allow-list: public key (Z85) -> the node name it is bound to. Read on each node
    connection, so a node added with `gq admin keygen` needs no gqd restart."""
    found: dict[bytes, str] = {}
    for path in sorted((key_dir / NODES).glob(f"*{PUBLIC_SUFFIX}")):
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (OSError, ValueError):
            continue
        found[public] = path.name[:-len(PUBLIC_SUFFIX)]
    return found


def allowed_relays(key_dir: Path) -> dict[bytes, tuple[str, str]]:
    """The relays' allow-list: public key (Z85) -> (the relay name it is bound to, its kind).
    Read on each relay connection, like the nodes'. A file naming an unknown kind is left
    out: a relay is never given more trust than its file says."""
    found: dict[bytes, tuple[str, str]] = {}
    for path in sorted((key_dir / RELAYS).glob(f"*{PUBLIC_SUFFIX}")):
        try:
            public, _ = zmq.auth.load_certificate(path)
            match = _KIND_RE.search(path.read_text(errors="replace"))
        except (OSError, ValueError):
            continue
        kind = match.group(1) if match else LOGIN
        if kind in RELAY_KINDS:
            found[public] = (path.name[:-len(PUBLIC_SUFFIX)], kind)
    return found
