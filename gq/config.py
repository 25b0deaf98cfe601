"""Configuration: typed dataclasses with every default in one place, loaded from TOML and validated.

Where the config comes from: `$GQ_CONFIG`; else the personal cluster's (`gq up`) if it is running;
else `/etc/gq/gq.toml`; else the personal cluster's path (so `gq` can say how to start one).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gq import configfile, defaults
from gq.configfile import read_toml  # noqa: F401 (callers read it here)
from gq.errors import ConfigError, GqError
from gq.powercfg import PowerConfig
from gq.powercfg import check as check_power
from gq.units import parse_duration

if TYPE_CHECKING:
    from pathlib import Path

    from gq.sched.types import Policy


@dataclass
class HeadConfig:
    #: Where gqd keeps its SQLite database.
    state_dir: str = "/var/lib/gq"
    #: Endpoints gqd binds for the CLI: a local ipc socket and optionally TCP.
    client_endpoints: list[str] = field(
        default_factory=lambda: list(defaults.HEAD_CLIENT_ENDPOINTS))
    #: Endpoint gqd binds for gqnodes.
    node_endpoint: str = "tcp://0.0.0.0:6818"
    #: Endpoint gqd binds for relays: login hosts' `gq relay` and gqnodes forward their users'
    #: requests here over CURVE (keys in key_dir/relays/ and key_dir/nodes/); "" binds none.
    relay_endpoint: str = "tcp://0.0.0.0:6820"
    #: Seconds of silence after which a node is DOWN.
    node_timeout_s: float = defaults.NODE_TIMEOUT_S
    #: Seconds after which a node's last GPU telemetry is stale: shown so in `gq nodes`, and
    #: placement goes by the GPUs' type and VRAM alone there (docs/SCHEDULING.md).
    telemetry_stale_s: float = defaults.TELEMETRY_STALE_S
    #: Seconds between SIGTERM and SIGKILL when a job is cancelled.
    kill_grace_s: float = defaults.KILL_GRACE_S
    #: Jobs' GQ_CHECKPOINT_DIR is ROOT/USER/JOBID; empty means ~USER/.gq/checkpoints/JOBID.
    checkpoint_root: str = ""
    #: Most jobs the queue holds (pending and running, all users): submits past it are refused,
    #: so a 10x spike cannot grow gqd's memory and passes without bound; 0 is no cap.
    max_queued_jobs: int = defaults.MAX_QUEUED_JOBS
    #: Node-fault requeues of a job submitted without `--retries` (0: it ends NODE_FAIL at once).
    default_retries: int = defaults.DEFAULT_RETRIES
    #: Prometheus endpoint, HOST:PORT (port 0: any free one, written to STATE_DIR/metrics.addr);
    #: "" serves none. Loopback by default: it names users and jobs.
    metrics_addr: str = "127.0.0.1:6819"
    #: Slurm's MailProg: run by gqd, as `PROGRAM -s SUBJECT USER`, when a job that asked for
    #: mail (--mail-type) begins, ends, fails or is requeued; "" sends none.
    mail_program: str = ""
    #: Slurm's ClusterName, which jobs see as SLURM_CLUSTER_NAME.
    cluster_name: str = defaults.CLUSTER_NAME
    #: Job and node events (gq events, gq api's /v1/events) are kept this long, in seconds,
    #: and at most this many of the newest.
    events_keep_s: float = defaults.EVENTS_KEEP_S
    events_keep_rows: int = defaults.EVENTS_KEEP_ROWS


#: `[node] cgroups` values (gq.node.cgroups).
CGROUP_KINDS = ("auto", "v2", "v1", "systemd", "off")


@dataclass
class NodeConfig:
    #: Where gqd is, for gqnode.
    head: str = "tcp://127.0.0.1:6818"
    #: gqnode's state directory; `{name}` is replaced by the node's name.
    state_dir: str = "/var/lib/gq/node"
    heartbeat_s: float = defaults.HEARTBEAT_INTERVAL_S
    #: A GPU hotter than this (Celsius, by its fresh telemetry) gets no new jobs (gqd reads it
    #: from its own configuration: one limit for the cluster).
    max_gpu_temp_c: float = defaults.MAX_GPU_TEMP_C
    #: CPUs and memory offered to jobs; 0 means what the host has.
    cpus: int = 0
    mem: str = "0"
    #: A program run every `health_check_interval_s` (Slurm's HealthCheckProgram); when it exits
    #: non-zero or runs past `health_check_timeout_s`, the node is drained with its first output
    #: line as the reason and its jobs are requeued. Empty: none.
    health_check: str = ""
    health_check_interval_s: float = defaults.HEALTH_CHECK_INTERVAL_S
    health_check_timeout_s: float = defaults.HEALTH_CHECK_TIMEOUT_S
    #: Confine each job in a cgroup (memory, CPUs, pids, devices; its processes tracked):
    #: "auto" (what the host has: v2, through systemd where systemd runs the host, else v1;
    #: none unless root), "v2", "v1", "systemd" or "off".
    cgroups: str = "auto"
    #: gq's subtree in each cgroup hierarchy: an absolute path, or one relative to gqnode's own
    #: cgroup. Runs are ROOT/NODE/job_J.R (with systemd: scopes in the slice named after it).
    cgroup_root: str = "/gq"
    #: Most processes and threads a job may have at once (pids.max); 0 is no limit.
    job_pids_max: int = defaults.JOB_PIDS_MAX
    #: Where the GPUs' device files are: a job may open only its own GPUs' DIR/nvidiaN.
    dev_dir: str = "/dev"
    #: Give each job a /tmp of its own, removed at its end (Slurm's job_container/tmpfs).
    private_tmp: bool = False
    #: The node's features, which jobs' --constraint names (Slurm's Feature=).
    features: list[str] = field(default_factory=list)
    #: HTCondor's job lease: a gqnode that hears nothing from gqd for this many seconds stops
    #: its jobs (NODE_FAIL, "head lease expired"), and gqd requeues a silent node's jobs only
    #: once that has surely happened, so no job runs in two places. 0: no lease (jobs run on
    #: through any head outage; a silent node's jobs are requeued at node_timeout_s).
    head_lease_s: float = 0.0
    #: Model affinity: how many recent jobs' --cache-key each GPU remembers as warm, and
    #: directories whose subdirectories name keys warm on every GPU of the node.
    cache_keys_per_gpu: int = defaults.CACHE_KEYS_PER_GPU
    cache_dirs: list[str] = field(default_factory=list)


@dataclass
class ClientConfig:
    #: Endpoints the CLI tries, in order; empty means gqd's client endpoints.
    endpoints: list[str] = field(default_factory=list)
    timeout_s: float = defaults.CLIENT_TIMEOUT_S


@dataclass
class RelayConfig:
    #: gqd's relay endpoint as this host reaches it, for `gq relay` on a login host and for
    #: gqnode, which relays the requests of the jobs on its host; "": gqnode relays none.
    head: str = ""
    #: The local socket `gq relay` serves this host's users on (the CLI's [client] endpoints
    #: name it).
    socket: str = "ipc:///run/gq/relay.sock"
    #: The relay's key pair, key_dir/NAME.key_secret (gq admin keygen --relay NAME); "" is
    #: the host name.
    name: str = ""


@dataclass
class ApiConfig:
    """`gq api`, the HTTP API (docs/API.md, gq-api(8))."""

    #: HOST:PORT it serves HTTP on: loopback by default (put TLS in front, docs/API.md).
    listen: str = defaults.API_LISTEN
    #: gqd's relay endpoint as this host reaches it; "" is [relay] head, else gqd's own
    #: relay_endpoint with 127.0.0.1 for a wildcard host (gq api on the head host).
    head: str = ""
    #: Its key pair, key_dir/NAME.key_secret, listed in gqd's key_dir/relays/ with kind api
    #: (gq admin keygen --relay NAME --kind api).
    name: str = "api"
    #: DEALER sockets to gqd that all HTTP requests share.
    sockets: int = 2
    #: TLS: a PEM certificate (chain) and its key; both "" serves plain HTTP.
    tls_cert: str = ""
    tls_key: str = ""
    #: Largest request body, in bytes (413 past it).
    max_body_bytes: int = defaults.API_MAX_BODY_BYTES
    #: Most job specs one POST /v1/jobs may hold, and most jobs a page of GET /v1/jobs.
    max_jobs_per_submit: int = defaults.API_MAX_JOBS_PER_SUBMIT
    max_page: int = defaults.API_MAX_PAGE
    #: Requests per second each token may make on average, and in a burst (429 with
    #: Retry-After past them); 0 is no limit.
    rate_per_s: float = defaults.API_RATE_PER_S
    rate_burst: int = defaults.API_RATE_BURST
    #: Most gq requests waiting for gqd at once, all tokens together (503 past it): a flood of
    #: HTTP requests queues here, not in gqd.
    max_in_flight: int = defaults.API_MAX_IN_FLIGHT
    #: How long gq api waits for gqd's reply, in seconds.
    timeout_s: float = defaults.CLIENT_TIMEOUT_S


@dataclass
class SchedulerConfig:
    #: Priority points per unit of QOS priority.
    weight_qos: int = 1000
    #: Priority points a job gains by waiting `max_age_s` (linear, then flat).
    weight_age: int = 1000
    max_age_s: int = 7 * 86400
    #: Priority points of a user with no recent usage (fewer as their share of usage grows).
    weight_fairshare: int = 500
    #: Half-life of the GPU-seconds counted for fair share, in seconds.
    fairshare_half_life_s: int = 7 * 86400
    #: Priority points per doubling of a job's response ratio (wait + limit) / limit.
    weight_ratio: int = 1000
    #: How many blocked jobs (in order) get a reservation each pass (1 was best in simulation).
    reserve_depth: int = 1
    #: Jobs pending longer than this go first and always get a reservation, in seconds (96 h
    #: was best in simulation against standard EASY, docs/SCHEDULING.md).
    reserve_age_s: int = 96 * 3600
    #: How many blocked jobs of 8 GPUs or more, first come first, get a reservation besides.
    big_reserve_depth: int = 4
    #: Model affinity: a cold start of a --cache-key job that has waited less than this (s)
    #: gives its GPUs to a queued job whose key is warm there; 0: never (docs/SCHEDULING.md).
    warm_swap_s: int = 300
    #: Model affinity: how long a --cache-key job without --cold-wait waits for a warm GPU (s).
    cold_wait_s: int = 15
    #: A job that started less than this long ago is not preempted, in seconds (nor one that
    #: has run less than a quarter of its limit); the default of QOS that set none.
    preempt_exempt_s: int = 600
    #: GPUs per node of a `gq submit` job that asks for none in any form (a Slurm script, or
    #: an `sbatch` call, that asks for none gets none).
    default_gpus: int = defaults.DEFAULT_GPUS


@dataclass
class QosConfig:
    priority: int = 0
    #: Time limit of jobs that name none, in seconds.
    default_time_s: int = defaults.DEFAULT_TIME_LIMIT_S
    #: Longest time limit a job of this QOS may ask for, in seconds; 0 is no cap.
    max_time_s: int = 0
    #: QOS names whose jobs this QOS may preempt (the scheduler issue uses it).
    preempts: list[str] = field(default_factory=list)
    #: Nodes this QOS owns (its guaranteed pool): jobs of other QOS may borrow them while no
    #: job of this QOS waits, and are preempted when one needs them back.
    pool: list[str] = field(default_factory=list)
    #: Seconds a blocked job of this QOS waits rather than preempt: it preempts only when its
    #: reservation is further off, and never a job that will end sooner by its limit.
    preempt_after_s: float = defaults.PREEMPT_AFTER_S
    #: Seconds a job of this QOS runs before it may be preempted (at most a quarter of its
    #: limit); a QOS that names none gets [scheduler] preempt_exempt_s (see `from_dict`).
    preempt_exempt_s: int = 600
    #: Share of the cluster's GPUs (0..1) this QOS's pending work may always claim: while its
    #: running jobs hold less, its jobs are scheduled before other tiers' and its jobs within
    #: the share are never preempted.
    min_share: float = 0.0
    #: Seconds a preempted job of this QOS has between its signal and SIGKILL (Slurm's
    #: GraceTime); a file that names none gets [head] kill_grace_s (see `from_dict`).
    grace_s: float = defaults.KILL_GRACE_S
    #: Per user, jobs of this QOS queued or running at once (Slurm's MaxSubmitJobsPerUser):
    #: more are refused at submit; 0 is no limit.
    max_submit_per_user: int = 0
    #: Per user, jobs of this QOS running at once (MaxJobsPerUser): more wait with reason
    #: QOSLimit; 0 is no limit.
    max_running_per_user: int = 0
    #: Per user, GPUs in use by running jobs of this QOS (MaxTRESPerUser=gres/gpu): more wait
    #: with reason QOSLimit; 0 is no limit.
    max_gpus_per_user: int = 0


@dataclass
class PartitionConfig:
    """A named set of nodes jobs choose with -p (Slurm's PartitionName=)."""

    #: Node names, each a name or a hostlist (`node[1-4]`).
    nodes: list[str] = field(default_factory=list)
    #: The QOS of its jobs that name none ("": the built-in default, normal).
    default_qos: str = ""
    #: Time limit of its jobs that name none, in seconds (0: the QOS's default).
    default_time_s: int = 0
    #: Longest time limit its jobs may ask for, in seconds; 0 is no cap.
    max_time_s: int = 0
    #: The partition of jobs that name none (one at most; else the first defined).
    default: bool = False


def _default_qos() -> dict[str, QosConfig]:
    return {"normal": QosConfig(priority=10), "pro": QosConfig(priority=100, preempts=["free"]),
            "free": QosConfig(priority=1)}


@dataclass
class AuthConfig:
    #: Users who may act on any job and manage nodes.
    admins: list[str] = field(default_factory=lambda: ["root"])
    #: Believe the user a TCP caller claims to be (only for closed test setups): until CURVE
    #: keys exist, TCP callers may otherwise only read (queue, show, nodes, wait).
    trust_tcp: bool = False
    #: When set, only this user may talk to gqd (the kernel's uid on the ipc socket; TCP
    #: callers are refused): `gq up` sets it to the personal cluster's owner.
    owner: str = ""
    #: Run jobs of uid 0. A system cluster refuses them; `gq up` run by root allows them, as
    #: a personal cluster runs every job as its owner anyway.
    allow_root_jobs: bool = False
    #: Encrypt and authenticate gqnode <-> gqd traffic with CurveZMQ keys from key_dir.
    curve: bool = True
    #: gqd.key (gqd's public key, on every host), gqd.key_secret (the head host only),
    #: NAME.key_secret (node NAME's own, on that node), and nodes/NAME.key: the allow-list of
    #: node public keys on the head host, each binding a node name to its key.
    key_dir: str = "/etc/gq/keys"


@dataclass
class Config:
    head: HeadConfig = field(default_factory=HeadConfig)
    node: NodeConfig = field(default_factory=NodeConfig)
    client: ClientConfig = field(default_factory=ClientConfig)
    relay: RelayConfig = field(default_factory=RelayConfig)
    api: ApiConfig = field(default_factory=ApiConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    qos: dict[str, QosConfig] = field(default_factory=_default_qos)
    #: None defined: one partition, defaults.DEFAULT_PARTITION, of every node.
    partition: dict[str, PartitionConfig] = field(default_factory=dict)
    auth: AuthConfig = field(default_factory=AuthConfig)
    #: Power saving: nodes gqd resumes and suspends (gq/powercfg.py).
    power: PowerConfig = field(default_factory=PowerConfig)
    #: The file this came from, for messages ("" for built-in defaults).
    path: str = ""

    def client_endpoints(self) -> list[str]:
        return self.client.endpoints or self.head.client_endpoints

    def policy(self) -> Policy:
        """The scheduler's knobs from this config (the daemon and the simulator share it)."""
        from gq.sched.types import Policy  # here: the CLI reads configs and never schedules
        sc = self.scheduler
        return Policy(qos_priority={n: q.priority for n, q in self.qos.items()},
                      weight_qos=sc.weight_qos, weight_age=sc.weight_age, max_age_s=sc.max_age_s,
                      weight_fairshare=sc.weight_fairshare, weight_ratio=sc.weight_ratio,
                      reserve_depth=sc.reserve_depth,
                      reserve_age_s=sc.reserve_age_s,
                      big_reserve_depth=sc.big_reserve_depth, warm_swap_s=sc.warm_swap_s,
                      cold_wait_s=sc.cold_wait_s,
                      preempts={n: tuple(q.preempts) for n, q in self.qos.items() if q.preempts},
                      preempt_exempt_s=sc.preempt_exempt_s,
                      qos_exempt_s={n: q.preempt_exempt_s for n, q in self.qos.items()},
                      preempt_after_s={n: q.preempt_after_s for n, q in self.qos.items()},
                      min_share={n: q.min_share for n, q in self.qos.items() if q.min_share},
                      pools={n: frozenset(q.pool) for n, q in self.qos.items() if q.pool})


_SECTIONS = {"head": HeadConfig, "node": NodeConfig, "client": ClientConfig,
             "relay": RelayConfig, "api": ApiConfig, "scheduler": SchedulerConfig,
             "auth": AuthConfig, "power": PowerConfig}
_DURATION_KEYS = {"default_time", "max_time"}


def load(path: str | os.PathLike[str] | None = None) -> Config:
    """The config at `path`, or found as the module docstring says."""
    chosen = str(_path(path)) if path else _config_file()
    if not os.path.exists(chosen):
        if path or os.environ.get("GQ_CONFIG"):
            raise ConfigError(f"config file {chosen} does not exist")
        return Config(path="")
    return from_dict(read_toml(chosen), chosen)


def from_dict(data: dict[str, Any], source: str = "<config>") -> Config:
    cfg = Config(path=source)
    graced: set[str] = set()  # QOS whose table names its own grace_s
    exempted: set[str] = set()  # ... and its own preempt_exempt_s
    for section, value in data.items():
        if section == "qos":
            cfg.qos = {name: _qos(name, v, source) for name, v in _table(value, "qos", source).items()}
            graced = {name for name, v in value.items() if "grace_s" in v}
            exempted = {name for name, v in value.items() if "preempt_exempt_s" in v}
        elif section == "partition":
            cfg.partition = {name: _partition(name, v, source)
                             for name, v in _table(value, "partition", source).items()}
        elif section in _SECTIONS:
            setattr(cfg, section, _fill(_SECTIONS[section], _table(value, section, source),
                                        section, source))
        else:
            raise ConfigError(f"{source}: unknown section [{section}]")
    if defaults.DEFAULT_QOS not in cfg.qos:
        raise ConfigError(f"{source}: the QOS {defaults.DEFAULT_QOS!r} must be defined")
    _check_pools(cfg, source)
    _check_partitions(cfg, source)
    for key in ("health_check_interval_s", "health_check_timeout_s"):
        if not 0 < getattr(cfg.node, key) < math.inf:
            raise ConfigError(f"{source}: [node] {key} must be a number of seconds over 0, not "
                              f"{getattr(cfg.node, key)!r}")
    _check_node(cfg.node, source)
    if not 0 < cfg.head.telemetry_stale_s < math.inf:
        raise ConfigError(f"{source}: [head] telemetry_stale_s must be a number of seconds over "
                          f"0, not {cfg.head.telemetry_stale_s!r}")
    if not 0 < cfg.node.max_gpu_temp_c < math.inf:
        raise ConfigError(f"{source}: [node] max_gpu_temp_c must be degrees Celsius over 0, not "
                          f"{cfg.node.max_gpu_temp_c!r}")
    if not 0 <= cfg.head.default_retries <= defaults.MAX_RETRIES:
        raise ConfigError(f"{source}: [head] default_retries must be 0..{defaults.MAX_RETRIES}, "
                          f"not {cfg.head.default_retries}")
    if not (0 < cfg.head.events_keep_s < math.inf and cfg.head.events_keep_rows >= 1):
        raise ConfigError(f"{source}: [head] events_keep_s must be seconds over 0 and "
                          f"events_keep_rows 1 or more")
    # Known only once [head] is read, wherever it stands in the file.
    for name, qos in cfg.qos.items():
        if name not in graced:
            qos.grace_s = cfg.head.kill_grace_s
        if name not in exempted:
            qos.preempt_exempt_s = cfg.scheduler.preempt_exempt_s
    _check_shares(cfg, source)
    check_power(cfg.power, source)
    return cfg


def _check_node(node: NodeConfig, source: str) -> None:
    """The isolation keys of [node]."""
    if node.cgroups not in CGROUP_KINDS:
        raise ConfigError(f"{source}: [node] cgroups must be one of "
                          f"{', '.join(CGROUP_KINDS)}, not {node.cgroups!r}")
    parts = node.cgroup_root.strip("/").split("/")
    if not node.cgroup_root.strip("/") or any(p in ("", ".", "..") for p in parts):
        raise ConfigError(f"{source}: [node] cgroup_root must be a path like /gq (absolute) or "
                          f"gq (under gqnode's own cgroup), not {node.cgroup_root!r}")
    lease = node.head_lease_s
    if not (lease == 0 or 2 * node.heartbeat_s <= lease < math.inf):
        raise ConfigError(f"{source}: [node] head_lease_s must be 0 (no lease) or seconds of at "
                          f"least two heartbeats ({2 * node.heartbeat_s:g}), not {lease!r}")
    if not 0 <= node.cache_keys_per_gpu <= 256:
        raise ConfigError(f"{source}: [node] cache_keys_per_gpu must be 0 to 256, not "
                          f"{node.cache_keys_per_gpu!r}")
    if node.job_pids_max < 0:
        raise ConfigError(f"{source}: [node] job_pids_max must be 0 (no limit) or more, not "
                          f"{node.job_pids_max}")
def _check_shares(cfg: Config, source: str) -> None:
    """Guaranteed shares are fractions of one cluster: each 0..1, together at most 1."""
    for name, qos in cfg.qos.items():
        if not 0 <= qos.min_share <= 1:
            raise ConfigError(f"{source}: [qos.{name}] min_share must be a fraction from 0 to 1, "
                              f"not {qos.min_share!r}")
        for key in ("preempt_after_s", "preempt_exempt_s"):
            if not 0 <= getattr(qos, key) < math.inf:
                raise ConfigError(f"{source}: [qos.{name}] {key} must be a number of seconds, "
                                  f"0 or more, not {getattr(qos, key)!r}")
    total = sum(q.min_share for q in cfg.qos.values())
    if total > 1 + 1e-9:
        raise ConfigError(f"{source}: the QOS' min_share add up to {total:g}, more than the "
                          "whole cluster (1)")


def _check_pools(cfg: Config, source: str) -> None:
    """A pool is a list of node names, and a node is in one pool at most."""
    owner: dict[str, str] = {}
    for name, qos in cfg.qos.items():
        for node in qos.pool:
            if not isinstance(node, str) or not node:
                raise ConfigError(f"{source}: [qos.{name}] pool must list node names, "
                                  f"not {node!r}")
            if node in owner:
                raise ConfigError(f"{source}: node {node!r} is in the pools of both "
                                  f"{owner[node]!r} and {name!r}")
            owner[node] = name


def _check_partitions(cfg: Config, source: str) -> None:
    """Partitions name their nodes, at most one is the default, and their QOS exist."""
    from gq.hostlist import expand
    if sum(p.default for p in cfg.partition.values()) > 1:
        raise ConfigError(f"{source}: more than one [partition.NAME] has default = true")
    for name, part in cfg.partition.items():
        if not part.nodes or not all(isinstance(n, str) and n for n in part.nodes):
            raise ConfigError(f"{source}: [partition.{name}] nodes must list node names, e.g. "
                              "[\"node[1-4]\"]")
        try:
            for item in part.nodes:
                expand(item)
        except GqError as exc:
            raise ConfigError(f"{source}: [partition.{name}] nodes: {exc}") from None
        if part.default_qos and part.default_qos not in cfg.qos:
            raise ConfigError(f"{source}: [partition.{name}] default_qos {part.default_qos!r} "
                              f"is no [qos.NAME]; known: {', '.join(sorted(cfg.qos))}")
        if "," in name or not name.strip():
            raise ConfigError(f"{source}: bad partition name {name!r}")


def _partition(name: str, value: Any, source: str) -> PartitionConfig:
    return _timed(PartitionConfig, f"partition.{name}", value, source)


def _timed(cls: type, section: str, value: Any, source: str) -> Any:
    """A table's dataclass, its `default_time` and `max_time` durations read into their
    `_s` keys."""
    table = dict(_table(value, section, source))
    for key in _DURATION_KEYS & table.keys():
        try:
            table[f"{key}_s"] = parse_duration(table.pop(key))
        except GqError as exc:
            raise ConfigError(f"{source}: [{section}] {key}: {exc}") from None
    return _fill(cls, table, section, source)


def _table(value: Any, name: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{source}: [{name}] must be a table")
    return value


def _qos(name: str, value: Any, source: str) -> QosConfig:
    qos: QosConfig = _timed(QosConfig, f"qos.{name}", value, source)
    if not 0 <= qos.grace_s < math.inf:  # nan or inf would never come to the SIGKILL
        raise ConfigError(f"{source}: [qos.{name}] grace_s must be a number of seconds, 0 or "
                          f"more, not {qos.grace_s!r}")
    return qos


def _fill(cls: type, table: dict[str, Any], section: str, source: str) -> Any:
    obj = cls()
    known = {f.name: f for f in dataclasses.fields(cls)}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"{source}: unknown key {key!r} in [{section}]")
        expected = type(getattr(obj, key))
        if not configfile.type_ok(expected, value):
            raise configfile.type_error(source, section, key, expected, value)
        setattr(obj, key, value)
    return obj


# ---------------------------------------------------------------- where things live


# Where the file is: gq.configfile's (strings and os.path, for `gq submit`); the functions
# that return a Path import pathlib when called.


def _path(path: str | os.PathLike[str]) -> Path:
    from pathlib import Path
    return Path(path)


def personal_dir() -> Path:
    """State of the personal cluster `gq up` runs: $XDG_STATE_HOME/gq."""
    return _path(_personal_dir())


def _personal_dir() -> str:
    return configfile.personal_dir()


def personal_runtime_dir() -> Path:
    """Sockets of the personal cluster: $XDG_RUNTIME_DIR/gq, else beside its state."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    return _path(base) / "gq" if base else personal_dir() / "run"


def personal_config_path() -> Path:
    return personal_dir() / defaults.PERSONAL_CONFIG


def find_config() -> Path:
    return _path(_config_file())


def _config_file() -> str:
    return configfile.config_file()


def to_toml(cfg: Config) -> str:
    """TOML text of the parts `gq up` writes (head, node, client, relay, api, auth), for a
    personal cluster."""
    lines: list[str] = []
    for section in ("head", "node", "client", "relay", "api"):
        lines.append(f"[{section}]")
        for key, value in dataclasses.asdict(getattr(cfg, section)).items():
            lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    lines.append("[auth]")
    for key, value in dataclasses.asdict(cfg.auth).items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    # JSON's string escapes are all valid TOML basic-string escapes (control characters too).
    import json  # here: only `gq up` writes a config; every `gq` call reads one
    return json.dumps(str(value), ensure_ascii=False)
