"""Unit tests for gq.config: defaults, validation with messages naming key and file, TOML I/O."""

from __future__ import annotations

from pathlib import Path

import pytest

from gq import config as cfgmod
from gq import defaults
from gq.config import (
    AuthConfig,
    ClientConfig,
    Config,
    HeadConfig,
    NodeConfig,
    QosConfig,
    SchedulerConfig,
    find_config,
    from_dict,
    load,
    to_toml,
)
from gq.errors import ConfigError, ExitStatus

SRC = "/etc/gq/test-gq.toml"

FULL = {
    "head": {"state_dir": "/srv/gq", "client_endpoints": ["ipc:///tmp/gq.sock"],
             "node_endpoint": "tcp://0.0.0.0:7000", "node_timeout_s": 45.5, "kill_grace_s": 3,
             "checkpoint_root": "/ckpt"},
    "node": {"head": "tcp://head:7000", "state_dir": "/srv/gq/{name}", "heartbeat_s": 1.0,
             "cpus": 32, "mem": "256G"},
    "client": {"endpoints": ["tcp://head:6817"], "timeout_s": 5.0},
    "scheduler": {"weight_qos": 2000, "weight_age": 500, "max_age_s": 86400},
    "qos": {"normal": {"priority": 10, "default_time": "2h", "max_time": "1-00:00:00"},
            "pro": {"priority": 100, "preempts": ["free"], "max_time_s": 3600},
            "free": {"priority": 1, "default_time": "30", "grace_s": 120}},
    "auth": {"admins": ["root", "ops"]},
}


# ---------------------------------------------------------------- defaults


def test_defaults():
    c = Config()
    assert c.path == ""
    assert c.head.state_dir == "/var/lib/gq"
    assert c.head.node_timeout_s == defaults.NODE_TIMEOUT_S
    assert c.head.kill_grace_s == defaults.KILL_GRACE_S
    assert c.node.heartbeat_s == defaults.HEARTBEAT_INTERVAL_S
    assert c.client.timeout_s == defaults.CLIENT_TIMEOUT_S
    assert c.client.endpoints == []
    assert c.client_endpoints() == c.head.client_endpoints
    assert set(c.qos) == {"normal", "pro", "free"}
    assert defaults.DEFAULT_QOS in c.qos
    assert c.qos["pro"].priority > c.qos["normal"].priority > c.qos["free"].priority
    assert c.qos["pro"].preempts == ["free"]
    assert c.qos["normal"].default_time_s == defaults.DEFAULT_TIME_LIMIT_S
    assert c.qos["normal"].max_time_s == 0
    assert c.auth.admins == ["root"]
    assert (c.scheduler.weight_qos, c.scheduler.weight_age) == (1000, 1000)


def test_defaults_are_not_shared_between_instances():
    a, b = Config(), Config()
    a.head.client_endpoints.append("tcp://x:1")
    a.qos["pro"].preempts.append("normal")
    a.auth.admins.append("eve")
    assert b.head.client_endpoints == Config().head.client_endpoints
    assert b.qos["pro"].preempts == ["free"] and b.auth.admins == ["root"]


def test_empty_dict_gives_defaults_with_source():
    c = from_dict({}, SRC)
    assert c.path == SRC
    assert c.head == HeadConfig() and c.qos == Config().qos


# ---------------------------------------------------------------- from_dict


def test_from_dict_full_example():
    c = from_dict(FULL, SRC)
    assert c.path == SRC
    assert c.head == HeadConfig(state_dir="/srv/gq", client_endpoints=["ipc:///tmp/gq.sock"],
                                node_endpoint="tcp://0.0.0.0:7000", node_timeout_s=45.5,
                                kill_grace_s=3, checkpoint_root="/ckpt")
    assert c.node == NodeConfig(head="tcp://head:7000", state_dir="/srv/gq/{name}",
                                heartbeat_s=1.0, cpus=32, mem="256G")
    assert c.client == ClientConfig(endpoints=["tcp://head:6817"], timeout_s=5.0)
    assert c.client_endpoints() == ["tcp://head:6817"]
    assert c.scheduler == SchedulerConfig(weight_qos=2000, weight_age=500, max_age_s=86400)
    assert c.qos == {  # a QOS without grace_s gets [head] kill_grace_s
        "normal": QosConfig(priority=10, default_time_s=7200, max_time_s=86400, grace_s=3),
        "pro": QosConfig(priority=100, preempts=["free"], max_time_s=3600, grace_s=3),
        # a bare number is minutes
        "free": QosConfig(priority=1, default_time_s=30 * 60, grace_s=120),
    }
    assert c.auth == AuthConfig(admins=["root", "ops"])


def test_partial_section_keeps_other_defaults():
    c = from_dict({"head": {"state_dir": "/x"}}, SRC)
    assert c.head.state_dir == "/x"
    assert c.head.node_endpoint == HeadConfig().node_endpoint
    assert c.node == NodeConfig()


def test_int_accepted_for_float_key():
    c = from_dict({"head": {"node_timeout_s": 5}}, SRC)
    assert c.head.node_timeout_s == 5


def test_unknown_section_names_section_and_file():
    with pytest.raises(ConfigError, match=r"/etc/gq/test-gq\.toml: unknown section \[heed\]"):
        from_dict({"heed": {}}, SRC)


@pytest.mark.parametrize("section,key", [("head", "state_dri"), ("node", "gpus"),
                                          ("client", "endpoint"), ("scheduler", "backfill"),
                                          ("auth", "users"), ("qos.pro", "prio")])
def test_unknown_key_names_key_section_and_file(section: str, key: str):
    data = ({"qos": {"normal": {}, "pro": {key: 1}}} if section.startswith("qos")
            else {section: {key: 1}})
    with pytest.raises(ConfigError) as info:
        from_dict(data, SRC)
    msg = str(info.value)
    assert SRC in msg and repr(key) in msg and f"[{section}]" in msg


@pytest.mark.parametrize("section,key,value", [
    ("head", "node_timeout_s", "30"),
    ("head", "client_endpoints", "ipc:///x"),
    ("head", "state_dir", 5),
    ("node", "cpus", 1.5),
    ("node", "cpus", True),  # a bool is not an int here
    ("node", "mem", 1024),
    ("client", "timeout_s", False),
    ("scheduler", "weight_qos", "1000"),
    ("auth", "admins", "root"),
])
def test_wrong_type_names_key_and_file(section: str, key: str, value: object):
    with pytest.raises(ConfigError) as info:
        from_dict({section: {key: value}}, SRC)
    msg = str(info.value)
    assert SRC in msg and f"[{section}] {key}" in msg and repr(value) in msg
    assert info.value.exit_status == ExitStatus.USAGE


def test_section_that_is_not_a_table():
    with pytest.raises(ConfigError, match=r"test-gq\.toml: \[head\] must be a table"):
        from_dict({"head": "x"}, SRC)
    with pytest.raises(ConfigError, match=r"\[qos\.pro\] must be a table"):
        from_dict({"qos": {"normal": {}, "pro": 3}}, SRC)


def test_qos_wrong_type_names_key():
    with pytest.raises(ConfigError, match=r"test-gq\.toml: \[qos\.normal\] priority"):
        from_dict({"qos": {"normal": {"priority": "high"}}}, SRC)
    with pytest.raises(ConfigError, match=r"\[qos\.normal\] preempts"):
        from_dict({"qos": {"normal": {"preempts": "free"}}}, SRC)


# ---------------------------------------------------------------- QOS durations


@pytest.mark.parametrize("text,seconds", [("2h", 7200), ("1-00:00:00", 86400), ("90s", 90),
                                          ("01:30:00", 5400), ("2-12", 216000), (45, 2700)])
def test_qos_durations_parse_to_seconds(text: object, seconds: int):
    c = from_dict({"qos": {"normal": {"default_time": text, "max_time": text}}}, SRC)
    assert c.qos["normal"].default_time_s == seconds
    assert c.qos["normal"].max_time_s == seconds


def test_qos_max_time_unlimited_is_no_cap():
    c = from_dict({"qos": {"normal": {"max_time": "unlimited"}}}, SRC)
    assert c.qos["normal"].max_time_s == 0


@pytest.mark.parametrize("key", ["default_time", "max_time"])
@pytest.mark.parametrize("bad", ["forever", "0", "-5", "1:2:3:4", ""])
def test_bad_qos_duration_names_key_and_file(key: str, bad: str):
    with pytest.raises(ConfigError) as info:
        from_dict({"qos": {"normal": {key: bad}}}, SRC)
    msg = str(info.value)
    assert SRC in msg and f"[qos.normal] {key}" in msg


def test_missing_normal_qos_is_refused():
    with pytest.raises(ConfigError, match=r"test-gq\.toml: the QOS 'normal' must be defined"):
        from_dict({"qos": {"pro": {"priority": 100}}}, SRC)
    with pytest.raises(ConfigError, match="'normal'"):
        from_dict({"qos": {}}, SRC)


def test_qos_section_replaces_default_qos_set():
    c = from_dict({"qos": {"normal": {"priority": 5}}}, SRC)
    assert set(c.qos) == {"normal"} and c.qos["normal"].priority == 5


# ---------------------------------------------------------------- QOS grace time


def test_qos_grace_defaults_to_head_kill_grace_wherever_head_stands():
    assert all(q.grace_s == defaults.KILL_GRACE_S for q in Config().qos.values())
    built_in = from_dict({"head": {"kill_grace_s": 4}}, SRC)
    assert {q.grace_s for q in built_in.qos.values()} == {4}
    # [qos] before [head] in the file: the grace is still the head's.
    c = from_dict({"qos": {"normal": {}, "free": {"grace_s": 0}}, "head": {"kill_grace_s": 7.5}},
                  SRC)
    assert (c.qos["normal"].grace_s, c.qos["free"].grace_s) == (7.5, 0)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_bad_qos_grace_names_key_and_file(bad: float):
    with pytest.raises(ConfigError, match=r"test-gq\.toml: \[qos\.free\] grace_s must be"):
        from_dict({"qos": {"normal": {}, "free": {"grace_s": bad}}}, SRC)


# ---------------------------------------------------------------- files


TOML_TEXT = """
[head]
state_dir = "/srv/gq"
node_timeout_s = 12

[node]
cpus = 16

[qos.normal]
priority = 10
default_time = "2h"
max_time = "1-00:00:00"

[qos.pro]
priority = 100
preempts = ["normal"]
"""


def test_load_toml_file(tmp_path: Path):
    path = tmp_path / "gq.toml"
    path.write_text(TOML_TEXT)
    c = load(path)
    assert c.path == str(path)
    assert c.head.state_dir == "/srv/gq" and c.head.node_timeout_s == 12
    assert c.node.cpus == 16
    assert c.qos["normal"] == QosConfig(priority=10, default_time_s=7200, max_time_s=86400)
    assert c.qos["pro"].preempts == ["normal"]
    assert set(c.qos) == {"normal", "pro"}


def test_load_error_names_the_file(tmp_path: Path):
    path = tmp_path / "bad.toml"
    path.write_text("[head]\nstate_dir = 5\n")
    with pytest.raises(ConfigError) as info:
        load(path)
    assert str(path) in str(info.value) and "state_dir" in str(info.value)


def test_load_invalid_toml_names_the_file(tmp_path: Path):
    path = tmp_path / "broken.toml"
    path.write_text("[head\nstate_dir = \n")
    with pytest.raises(ConfigError, match=str(path)):
        load(path)


def test_load_missing_explicit_file_is_an_error(tmp_path: Path):
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"{path} does not exist"):
        load(path)


def test_to_toml_round_trip(tmp_path: Path):
    c = from_dict(FULL, SRC)
    c.head.state_dir = 'C:\\odd "dir" ünïcode'
    c.node.mem = "1.5T"
    path = tmp_path / "gq.toml"
    path.write_text(to_toml(c))
    back = load(path)
    assert back.head == c.head
    assert back.node == c.node
    assert back.client == c.client
    assert back.auth == c.auth


def test_to_toml_round_trip_of_defaults(tmp_path: Path):
    path = tmp_path / "gq.toml"
    path.write_text(to_toml(Config()))
    back = load(path)
    assert (back.head, back.node, back.client, back.auth) == (
        HeadConfig(), NodeConfig(), ClientConfig(), AuthConfig())


def test_to_toml_round_trip_control_characters(tmp_path: Path):
    c = Config()
    c.head.state_dir = "/srv/odd\nname\x01"
    path = tmp_path / "gq.toml"
    path.write_text(to_toml(c))
    assert load(path).head.state_dir == c.head.state_dir


# ---------------------------------------------------------------- finding the file


def test_find_config_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    path = tmp_path / "elsewhere.toml"
    monkeypatch.setenv("GQ_CONFIG", str(path))
    assert find_config() == path
    path.write_text('[head]\nstate_dir = "/from/env"\n')
    c = load()
    assert c.path == str(path) and c.head.state_dir == "/from/env"


def test_find_config_without_env_falls_back_to_personal(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path):
    if Path(defaults.SYSTEM_CONFIG).exists():
        pytest.skip("a system config exists on this host")
    monkeypatch.delenv("GQ_CONFIG", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert find_config() == tmp_path / "state" / "gq" / defaults.PERSONAL_CONFIG
    assert cfgmod.personal_config_path() == find_config()
    # With nothing written yet, load() gives the built-in defaults.
    assert load().path == ""
    personal = cfgmod.personal_config_path()
    personal.parent.mkdir(parents=True)
    personal.write_text('[head]\nstate_dir = "/personal"\n')
    assert load().head.state_dir == "/personal"


def test_personal_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "r"))
    assert cfgmod.personal_runtime_dir() == tmp_path / "r" / "gq"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert cfgmod.personal_runtime_dir() == tmp_path / "s" / "gq" / "run"


def test_missing_file_named_by_gq_config_is_an_error(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("GQ_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="nope.toml"):
        load()


def test_pools_become_the_policy_and_a_node_is_in_one_pool():
    from gq.config import from_dict
    cfg = from_dict({"qos": {"normal": {}, "pro": {"pool": ["n1", "n2"]}}})
    assert cfg.policy().pools == {"pro": frozenset({"n1", "n2"})}
    assert cfg.policy().owner == {"n1": "pro", "n2": "pro"}
    with pytest.raises(ConfigError, match="pools of both"):
        from_dict({"qos": {"normal": {"pool": ["n1"]}, "pro": {"pool": ["n1"]}}})
    with pytest.raises(ConfigError, match="node names"):
        from_dict({"qos": {"normal": {"pool": [""]}}})
