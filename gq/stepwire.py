"""The job-step messages: the names of srun's requests to gqd (client requests, typed in
gq/requests.py as every client request is), the names of gqd's orders to the nodes and of the
nodes' step reports (typed messages, declared in gq/messages.py: Step, StepKill, a Report's
STEP_STARTED and STEP_ENDED), and the rules for what their argv, env and layout hold, which both
sides use. gq.protocol and gq.messages take them in; kept here so that steps change in one
place. A leaf: it imports nothing of gq's but its errors.
"""

from __future__ import annotations


from gq.errors import ProtocolError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any

# Client -> head.
#: srun: start a step of the caller's running job; how it is; end it.
STEP_LAUNCH = "step_launch"
STEP_STATUS = "step_status"
STEP_CANCEL = "step_cancel"
# Head -> node: start this node's tasks of a step; stop them (gq/node/steps.py).
STEP = "step"
STEP_KILL = "step_kill"
#: A node's REPORT events: it started its tasks of step `step`; they have all ended.
STEP_STARTED = "step_started"
STEP_ENDED = "step_ended"

CLIENT_REQUESTS = frozenset({STEP_LAUNCH, STEP_STATUS, STEP_CANCEL})


#: Most tasks one node of a step runs, and longest argv item and environment value.
MAX_NODE_TASKS, MAX_ARG, MAX_VALUE = 4096, 128 * 1024, 32 * 1024



def command(key: str, value: list[Any], what: str) -> None:
    """A command to exec: at least its program; strings without NUL."""
    if not value or not all(type(a) is str and len(a) <= MAX_ARG and "\0" not in a
                            for a in value):
        raise ProtocolError(f"{what}: {key!r} must be a command: strings, without NUL")


def environment(key: str, value: dict[Any, Any], what: str) -> None:
    """An environment, as execve takes one: names without '=' or NUL, values without NUL."""
    for name, val in value.items():
        if type(name) is not str or not 0 < len(name) <= 1024 or "=" in name or "\0" in name \
                or type(val) is not str or len(val) > MAX_VALUE or "\0" in val:
            raise ProtocolError(f"{what}: {key!r} must map variable names to values (strings, "
                                "no NUL, no '=' in a name)")


def layout(key: str, value: list[Any], what: str) -> None:
    """Each node's entry: its name, SLURM_NODEID and tasks [procid, localid, [gpu, ...]]."""
    for i, part in enumerate(value):
        ok = type(part) is dict and type(part.get("node")) is str and \
            type(part.get("node_id")) is int and 0 <= part["node_id"] <= 65_535 and \
            type(part.get("tasks")) is list and \
            len(part["tasks"]) <= MAX_NODE_TASKS
        for task in part.get("tasks", []) if ok else []:
            ok = ok and type(task) is list and len(task) == 3 and type(task[0]) is int and \
                type(task[1]) is int and 0 <= task[0] < 2**31 and 0 <= task[1] < 2**31 and \
                type(task[2]) is list and len(task[2]) <= 1024 and \
                all(type(g) is int and 0 <= g <= 65_535 for g in task[2])
        if not ok:
            raise ProtocolError(f"{what}: {key}[{i}] is not a node's part of a step layout")


def node_names(key: str, value: Any, what: str) -> None:
    """Node names."""
    if len(value) > 65_536 or not all(type(n) is str and 0 < len(n) <= 255 and "\0" not in n
                                      for n in value):
        raise ProtocolError(f"{what}: {key!r} must be node names")


