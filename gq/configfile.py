"""Where gq's config file is, how it is read, and the few values a request to gqd needs
(`ClientSettings`), without gq.config's dataclasses.

`gq submit`, `queue` and `show` need only the endpoints, the timeout and the file's path: building
every section's dataclass (and importing `dataclasses`, which imports `inspect`) cost them more
than the rest of the config (`python -X importtime`, docs/BENCHMARKS.md). gq.config stays the
owner of the full Config and imports the locating and reading from here; the defaults of these
keys are gq.defaults', and their type rule (`type_ok`) is the one gq.config checks every key
with. The rest of the file is checked where it is used: by gqd, gqnode and the commands that
load the full Config.
"""

from __future__ import annotations

import os
import sys

from gq import defaults
from gq.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing itself is not loaded for `gq submit`
    from typing import Any


class ClientSettings:
    """What Client needs of a config: its file ("" for none), the endpoints to try in order,
    and the reply timeout in seconds."""

    __slots__ = ("path", "endpoints", "timeout_s")

    def __init__(self, path: str, endpoints: list[str], timeout_s: float):
        self.path = path
        self.endpoints = endpoints
        self.timeout_s = timeout_s

    def client_endpoints(self) -> list[str]:
        return self.endpoints


def client_settings() -> ClientSettings:
    """The client's values from the config gq.config.load() would read: [client] endpoints
    (else [head] client_endpoints) and [client] timeout_s, checked as gq.config checks them."""
    chosen = config_file()
    if not os.path.exists(chosen):
        if os.environ.get("GQ_CONFIG"):
            raise ConfigError(f"config file {chosen} does not exist")
        return ClientSettings("", list(defaults.HEAD_CLIENT_ENDPOINTS), defaults.CLIENT_TIMEOUT_S)
    data = read_toml(chosen)
    client = _section(data, "client", chosen)
    head = _section(data, "head", chosen)
    for key in client:
        if key not in ("endpoints", "timeout_s"):
            raise ConfigError(f"{chosen}: unknown key {key!r} in [client]")
    endpoints = _typed(client, "endpoints", [], "client", chosen) or _typed(
        head, "client_endpoints", list(defaults.HEAD_CLIENT_ENDPOINTS), "head", chosen)
    timeout_s = _typed(client, "timeout_s", defaults.CLIENT_TIMEOUT_S, "client", chosen)
    return ClientSettings(chosen, endpoints, float(timeout_s))


def _section(data: dict[str, Any], name: str, source: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    return value


def _typed(table: dict[str, Any], key: str, default: Any, section: str, source: str) -> Any:
    if key not in table:
        return default
    value = table[key]
    if not type_ok(type(default), value):
        raise type_error(source, section, key, type(default), value)
    return value


def type_ok(expected: type, value: Any) -> bool:
    """A config value fits its key's default's type: an int where a float goes, never a bool
    for a number nor a number for a bool."""
    ok = isinstance(value, expected) or (expected is float and isinstance(value, int))
    return ok and isinstance(value, bool) == (expected is bool)


def type_error(source: str, section: str, key: str, expected: type, value: Any) -> ConfigError:
    return ConfigError(f"{source}: [{section}] {key} must be a {expected.__name__}, "
                       f"not {value!r}")


def read_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A config file's tables as written (to tell which keys it sets), or ConfigError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    simple = plain_toml(text)
    if simple is not None:
        return simple
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def plain_toml(text: str) -> dict[str, Any] | None:
    """The tables of a file in the plain subset of TOML that `gq up` writes (gq.config.to_toml):
    `[table]` lines, `key = value` lines, blank lines and whole-line comments; a value is true,
    false, a decimal int, a float like 15.0, a string with no escapes, or a one-line list of
    those. None for anything else, which tomllib reads (and reports). tomllib, with the
    `typing` it imports, cost `gq submit` more than the rest of its config reading;
    tests/test_configfile.py holds this to tomllib's reading."""
    tables: dict[str, Any] = {}
    table = tables
    if "\r" in text:
        return None  # a CR is TOML only before a LF: tomllib's to tell
    for line in text.split("\n"):
        line = line.strip(" \t")  # TOML's whitespace, no other
        if not line.replace("\t", " ").isprintable():
            return None  # control characters: tomllib's to refuse
        if not line or line[0] == "#":
            continue
        if line[0] == "[":
            name = line[1:-1]
            if line[-1] != "]" or not _bare(name) or name in tables:
                return None
            table = tables[name] = {}
            continue
        key, eq, raw = line.partition(" = ")
        if not eq or not _bare(key) or key in table:
            return None
        value = _plain_value(raw)
        if value is _NOT_PLAIN:
            return None
        table[key] = value
    return tables


_NOT_PLAIN = object()
_BARE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


def _bare(key: str) -> bool:
    return bool(key) and _BARE.issuperset(key)


def _plain_value(raw: str) -> Any:
    if raw[:1] == "[" and raw[-1:] == "]":
        inner = raw[1:-1].strip(" \t")
        items = [_plain_scalar(i.strip(" \t")) for i in inner.split(",")] if inner else []
        return _NOT_PLAIN if _NOT_PLAIN in items else items
    return _plain_scalar(raw)


def _plain_scalar(raw: str) -> Any:
    if raw == "true" or raw == "false":
        return raw == "true"
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        body = raw[1:-1]
        if '"' in body or "\\" in body or not body.isprintable():
            return _NOT_PLAIN
        return body
    sign = raw[:1] if raw[:1] in ("-", "+") else ""
    whole, dot, frac = raw[len(sign):].partition(".")
    if not (whole.isdigit() and whole.isascii()) or (whole[0] == "0" and len(whole) > 1):
        return _NOT_PLAIN  # not decimal, or a leading zero (TOML refuses those)
    if not dot:
        return int(raw)
    if not (frac.isdigit() and frac.isascii()):
        return _NOT_PLAIN  # exponents, inf, nan and the like: tomllib's
    return float(raw)


# Strings and os.path where `gq submit`, `queue` and `show` look for their config: pathlib
# costs them more to import than finding the file does.


def personal_dir() -> str:
    """State of the personal cluster `gq up` runs: $XDG_STATE_HOME/gq."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "state")
    return os.path.normpath(os.path.join(base, "gq"))


def config_file() -> str:
    """`$GQ_CONFIG`; else the personal cluster's if it is running (or there is no system
    config); else `/etc/gq/gq.toml` if it exists; else the personal cluster's path."""
    if env := os.environ.get("GQ_CONFIG"):
        return path_spelling(env)  # as given, in Path's spelling (messages, Config.path)
    personal = os.path.join(personal_dir(), defaults.PERSONAL_CONFIG)
    system = defaults.SYSTEM_CONFIG
    if os.path.exists(personal) and (_personal_head_alive() or not os.path.exists(system)):
        return personal
    return system if os.path.exists(system) else personal


def path_spelling(path: str) -> str:
    """str(Path(path)) without importing pathlib: no repeated or trailing "/", no "."
    components (".." stays: Path does not resolve)."""
    lead = "//" if path[:2] == "//" and path[2:3] != "/" else "/" if path[:1] == "/" else ""
    return lead + "/".join(p for p in path.split("/") if p and p != ".") or "."


def _personal_head_alive() -> bool:
    from gq.pidfile import read_alive
    return read_alive(os.path.join(personal_dir(), "head", "gqd.pid")) is not None
