"""The manual pages in man/ keep up with the code: every command, option and config key is in them."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gq import config as config_mod

MAN = Path(__file__).resolve().parent.parent / "man"
#: How gq.conf.5 names each Python type of a config key.
TYPE_WORDS = {str: "string", int: "integer", float: "float", bool: "boolean",
              list: "list of strings"}


@pytest.fixture(scope="module")
def cli() -> Any:
    """The click command behind `gq` (its commands are registered once per process)."""
    from gq.cli import app
    return app.command()


def _source(name: str) -> str:
    return (MAN / name).read_text()


def _unwrap_xo(text: str) -> str:
    """Join each `.It Xo` ... `.Xc` item head into one `.It` line, macros kept."""
    def join(m: re.Match[str]) -> str:
        return ".It " + " ".join(line.lstrip(".") for line in m[1].splitlines())
    return re.sub(r"^\.It Xo\n((?:.*\n)*?)\.Xc$", join, text, flags=re.M)


def _command_chunks(text: str) -> dict[str, str]:
    """Command name (`submit`, `admin drain`) -> its entry in gq.1's command list, up to the next
    command or section."""
    text = _unwrap_xo(text)
    starts = [(m.start(), m[1]) for m in re.finditer(r"^\.It Cm ([a-z]+(?: [a-z]+)*)", text,
                                                     flags=re.M)]
    chunks = {}
    for i, (pos, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
        section_end = text.find("\n.Sh ", pos)
        chunks[name] = text[pos:min(end, section_end if section_end >= 0 else end)]
    return chunks


def _has_option(text: str, opt: str) -> bool:
    """`--gpus` as mdoc writes it (`Fl -gpus`, or after a comma in a `Fl` list), or literally."""
    flag = re.escape(opt[1:])
    return re.search(rf"(?:\bFl |, ){flag}(?![\w-])", text) is not None or \
        re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text) is not None


def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every visible command, subcommands of groups (`gq admin drain`) included."""
    out = {}
    for name, command in group.commands.items():
        if command.hidden:
            continue
        if hasattr(command, "commands"):
            out.update(_commands(command, f"{prefix}{name} "))
        else:
            out[prefix + name] = command
    return out


def test_every_command_and_option_is_in_gq_1(cli: Any) -> None:
    text = _source("gq.1")
    chunks = _command_chunks(text)
    missing = []
    for name, command in _commands(cli).items():
        if name not in chunks:
            missing.append(f"command {name}")
            continue
        for param in command.params:
            for opt in (*param.opts, *param.secondary_opts):
                if opt.startswith("-") and opt != "--help" and not _has_option(chunks[name], opt):
                    missing.append(f"{name} {opt}")
    for param in cli.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("--") and opt != "--help" and not _has_option(text, opt):
                missing.append(f"gq {opt}")
    assert not missing, f"not documented in man/gq.1: {', '.join(missing)}"


def _config_sections() -> dict[str, type]:
    """TOML table name (`head`, `qos.NAME`, ...) -> the dataclass of its keys."""
    cfg = config_mod.Config()
    sections: dict[str, type] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            sections[f.name] = type(value)
        elif isinstance(value, dict) and value and all(
                dataclasses.is_dataclass(v) for v in value.values()):
            sections[f"{f.name}.NAME"] = type(next(iter(value.values())))
    return sections


def _section_text(text: str, section: str) -> str:
    """The `.Ss [section]` part of gq.conf.5 (for `qos.NAME`, the `.Ss [qos. ...` one)."""
    head = section.split(".")[0] + "." if section.endswith(".NAME") else section + "]"
    parts = re.split(r"^\.Ss ", text, flags=re.M)
    found = [p for p in parts if p.startswith("[" + head)]
    assert found, f"man/gq.conf.5 has no subsection for [{section}]"
    return _unwrap_xo(found[0])


def _man_default(raw: str) -> str:
    """A default as gq.conf.5 writes it (`Qq /var/lib/gq`, `Li [\\(dqroot\\(dq]`) in TOML."""
    raw = raw.strip()
    raw = re.sub(r"\s*\bPc$", "", raw)
    if raw == "Qq" or raw.startswith("Qq "):
        raw = '"' + raw[3:] + '"'
    raw = re.sub(r"^Li ", "", raw)
    return raw.replace("\\(dq", '"')


def test_every_config_key_is_in_gq_conf_5() -> None:
    text = _source("gq.conf.5")
    sections = _config_sections()
    assert {"head", "node", "client", "scheduler", "qos.NAME", "auth"} <= sections.keys()
    problems = []
    for section, cls in sections.items():
        body = _section_text(text, section)
        for f in dataclasses.fields(cls):
            m = re.search(rf"^\.It Ic {f.name} P[qo] Vt (\"[^\"]*\"|\w+) , No default(.*)$",
                          body, flags=re.M)
            if m is None:
                problems.append(f"[{section}] {f.name} is missing")
                continue
            default = getattr(cls(), f.name)
            if m[1].strip('"') != TYPE_WORDS[type(default)]:
                problems.append(f"[{section}] {f.name}: type {m[1]}, not "
                                f"{TYPE_WORDS[type(default)]}")
            if _man_default(m[2]) != config_mod._toml_value(default):
                problems.append(f"[{section}] {f.name}: default {_man_default(m[2])}, not "
                                f"{config_mod._toml_value(default)}")
    assert not problems, "man/gq.conf.5 disagrees with gq/config.py: " + "; ".join(problems)


def test_built_in_qos_are_in_gq_conf_5() -> None:
    text = _source("gq.conf.5")
    for name, qos in config_mod._default_qos().items():
        preempts = config_mod._toml_value(qos.preempts).replace('"', "\\(dq")
        row = f".It Li {name} Ta {qos.priority} Ta Li {preempts}"
        assert row in text, f"man/gq.conf.5 lacks the built-in QOS row {row!r}"


@pytest.mark.skipif(shutil.which("mandoc") is None, reason="mandoc is not installed")
def test_man_pages_pass_mandoc_lint() -> None:
    pages = sorted(str(p) for p in MAN.iterdir() if p.is_file())
    assert {Path(p).name for p in pages} >= {"gq.1", "gq.conf.5", "gqd.8", "gqnode.8"}
    result = subprocess.run(["mandoc", "-Tlint", "-W", "warning", *pages], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
