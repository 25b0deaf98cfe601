"""`[power]`: Slurm's power saving for gq (docs/SCHEDULING.md, "Autoscaling (power saving)").

Nodes declared here may be powered down: gqd knows their shape (GPUs, CPUs, memory, features)
before they ever register, so it can tell which pending jobs they would take, resumes them with
`resume_program` (Slurm's ResumeProgram) and suspends them with `suspend_program` after
`suspend_time` seconds idle. The logic is in gq/head/power.py; the pure choice of nodes in
gq/sched/resume.py.

Kept apart from gq/config.py (which holds the dataclass in its Config) so that the CLI, which
reads every config, loads no GPU parsing for it: `check` imports gq.model only when the file has
a [power] table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gq import defaults
from gq.errors import ConfigError, GqError

if TYPE_CHECKING:
    from gq.model import Node



@dataclass
class PowerConfig:
    #: Run by gqd as `PROGRAM HOSTLIST` (e.g. `cloud[1-2]`) to start nodes; "" is off.
    resume_program: str = ""
    #: Run as `PROGRAM HOSTLIST` to stop nodes idle for suspend_time; "" suspends none.
    suspend_program: str = ""
    #: Seconds a node of `nodes` is idle (no job) before it is suspended.
    suspend_time: float = defaults.POWER_SUSPEND_TIME_S
    #: Seconds a resumed node has to register; past them it is DOWN with the reason.
    resume_timeout: float = defaults.POWER_RESUME_TIMEOUT_S
    #: Seconds a suspended node stays POWERING_DOWN (its messages ignored) at most, while the
    #: suspend program runs.
    suspend_timeout: float = defaults.POWER_SUSPEND_TIMEOUT_S
    #: Most nodes resumed a minute; 0 is no limit.
    resume_rate: int = defaults.POWER_RESUME_RATE
    #: The nodes that may be powered down, each `NAME[:cpus=N,mem=SIZE,gpus=SPEC,features=A+B]`
    #: as `gq up --node` takes (NAME may be a hostlist, `cloud[1-4]:gpus=4xa100:80G`).
    nodes: list[str] = field(default_factory=list)


def shapes(power: PowerConfig, source: str = "<config>") -> list[Node]:
    """The declared nodes, POWERED_DOWN, with their shapes; ConfigError naming the key."""
    from gq.hostlist import expand
    from gq.model import Node, NodeState, parse_gpu_spec, parse_size
    out: dict[str, Node] = {}
    for text in power.nodes:
        if not isinstance(text, str):
            raise ConfigError(f"{source}: [power] nodes must list node specs, not {text!r}")
        name, colon, rest = text.partition(":")
        try:
            names = expand(name)
            member = _fields(rest)
            node = dict(gpus=parse_gpu_spec(member["fake_gpus"]) if "fake_gpus" in member
                        else [], cpus=int(member.get("cpus", "0")),
                        mem=parse_size(member["mem"]) if "mem" in member else 0,
                        features=[f for f in member.get("features", "").split(",") if f])
        except (GqError, ValueError) as exc:
            raise ConfigError(f"{source}: [power] nodes: {text!r}: {exc}") from None
        for each in names:
            if each in out:
                raise ConfigError(f"{source}: [power] nodes: {each!r} is declared twice")
            out[each] = Node(name=each, state=NodeState.POWERED_DOWN, **node)  # type: ignore[arg-type]
    return list(out.values())


#: The keys of a node spec (`gq up --node`'s, gq/cluster.py: parse_node, which this module may
#: not import, as gq.cluster imports gq.config).
_KEYS = ("cpus", "mem", "gpus", "features")


def _fields(rest: str) -> dict[str, str]:
    """`cpus=N,mem=SIZE,gpus=SPEC,features=A+B` as a map (gpus under fake_gpus, as parse_node
    names it; features comma-separated)."""
    member: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = (p.strip() for p in item.partition("="))
        if not eq or key not in _KEYS:
            raise ConfigError(f"{item!r}: expected cpus=, mem=, gpus= or features=")
        member["fake_gpus" if key == "gpus" else key] = \
            value.replace("+", ",") if key == "features" else value
    return member


def check(power: PowerConfig, source: str) -> None:
    """Start-up validation of [power] (gqd refuses to start on a bad one)."""
    for key in ("suspend_time", "resume_timeout", "suspend_timeout"):
        if not 0 < getattr(power, key) < math.inf:
            raise ConfigError(f"{source}: [power] {key} must be a number of seconds over 0, not "
                              f"{getattr(power, key)!r}")
    if power.resume_rate < 0:
        raise ConfigError(f"{source}: [power] resume_rate must be nodes a minute, 0 (no limit) "
                          f"or more, not {power.resume_rate}")
    if power.nodes and not power.resume_program:
        raise ConfigError(f"{source}: [power] nodes are declared but no resume_program starts "
                          "them")
    if power.nodes:
        shapes(power, source)
