"""gq.configfile: the client's few config values, and the plain-TOML reader that spares
`gq submit` tomllib, held to tomllib's reading of every file it takes."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from gq import config as config_mod
from gq import configfile, defaults
from gq.errors import ConfigError

#: Pieces config lines are made of: what `gq up` writes, and near misses of the plain subset.
KEYS = ["head", "client", "endpoints", "timeout_s", "a-b", "x_1", "", "a.b", '"q"', "a b", "é"]
VALUES = ["true", "false", "True", "0", "1", "-1", "+7", "007", "-0", "1_000", "15.0", "-0.5",
          "1.", ".5", "1e5", "1.5e3", "inf", "nan", "0x1f", '""', '"a"', '"ipc:///run/x.sock"',
          '"a\\"b"', '"a\\\\b"', '"tab\there"', "'lit'", '"é"', '"a" # c', '"#"', '"a"b"',
          "[]", "[ ]", '["a"]', '["a", "b"]', '["a",]', '["a,b"]', "[1, 2]", '[1, "a"]', "[,]",
          "[[1]]", "[", "]", "99999999999999999999", "12:00:00", "1979-05-27", '"\x01"',
          '"\u2028"']
TABLES = ["[head]", "[client]", "[qos.normal]", "[[a]]", "[ head ]", "[a b]", "[]", "[head"]


def _line(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.15:
        return rng.choice(TABLES)
    if kind < 0.22:
        return rng.choice(["", "  ", "# a comment", "\t# x\x01", "#", " \t"])
    sep = rng.choice([" = ", " = ", " = ", "=", "  =  ", " =\t"])
    return rng.choice(KEYS) + sep + rng.choice(VALUES) + rng.choice(["", "", "", " ", "\r"])


def _toml(text: str) -> dict | None:  # type: ignore[type-arg]
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return None


def test_the_plain_reader_reads_what_tomllib_reads_or_leaves_it_to_tomllib() -> None:
    rng = random.Random(17)
    taken = left = 0
    for _ in range(20000):
        text = "\n".join(_line(rng) for _ in range(rng.randint(0, 5)))
        ours = configfile.plain_toml(text)
        if ours is None:
            left += 1
            continue
        assert ours == _toml(text), repr(text)
        # The same types too: 1 is no 1.0, True no 1.
        assert repr(ours) == repr(_toml(text)), repr(text)
        taken += 1
    assert taken > 1000 and left > 1000


def test_what_gq_up_writes_is_read_without_tomllib() -> None:
    cfg = config_mod.Config()
    cfg.head.client_endpoints = ["ipc:///tmp/x y/gqd.sock", "tcp://127.0.0.1:6817"]
    cfg.auth.admins = ["root", "ann"]
    text = config_mod.to_toml(cfg)
    assert configfile.plain_toml(text) == tomllib.loads(text)


def _settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              text: str) -> configfile.ClientSettings:
    path = tmp_path / "gq.toml"
    path.write_text(text)
    monkeypatch.setenv("GQ_CONFIG", str(path))
    return configfile.client_settings()


def test_client_settings_are_the_full_configs(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for text in ("", "[head]\nclient_endpoints = [\"ipc:///a\"]\n",
                 "[client]\nendpoints = [\"tcp://h:1\"]\ntimeout_s = 3\n[head]\n"
                 "client_endpoints = [\"ipc:///a\"]\n",
                 "# hand-written, with comments: tomllib reads it\n"
                 "[client] # c\ntimeout_s = 2.5\n"):
        got = _settings(tmp_path, monkeypatch, text)
        full = config_mod.load()
        assert (got.path, got.client_endpoints(), got.timeout_s) == (
            full.path, full.client_endpoints(), full.client.timeout_s), text
    assert list(defaults.HEAD_CLIENT_ENDPOINTS) == config_mod.Config().head.client_endpoints


@pytest.mark.parametrize("text, message", [
    ("[client]\ntimeout_s = \"x\"\n", r"\[client\] timeout_s must be a float"),
    ("[client]\ntimeout_s = true\n", r"\[client\] timeout_s must be a float"),
    ("[client]\nendpoints = \"ipc:///a\"\n", r"\[client\] endpoints must be a list"),
    ("[client]\nbogus = 1\n", r"unknown key 'bogus' in \[client\]"),
    ("[head]\nclient_endpoints = 1\n", r"\[head\] client_endpoints must be a list"),
    ("client = 1\n", r"\[client\] must be a table"),
    ("[client\n", r"gq.toml: "),
])
def test_client_settings_refuse_what_the_full_config_refuses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(tmp_path, monkeypatch, text)
    with pytest.raises(ConfigError, match=message):
        config_mod.load()


def test_a_missing_named_config_is_an_error(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GQ_CONFIG", str(tmp_path / "none.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        configfile.client_settings()


def test_a_named_config_path_is_spelt_as_pathlib_spells_it() -> None:
    for path in ("/a/b.toml", "a/b", "./a", ".", "", "/", "//", "///a", "//a//b/", "/a/./b/../c",
                 "a/", "~/x", ".a/..b", "/a/.../b"):
        assert configfile.path_spelling(path) == str(Path(path)), path
