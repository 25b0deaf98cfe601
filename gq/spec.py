"""A job spec, declared once: its fields (FIELDS), the options of `gq submit` that set them
(OPTIONS), and the one check of what a spec's values mean (`check`).

Derived from here: the protocol's spec schema (gq/protocol.py SPEC_SCHEMA), the fast path's
option table (gq/cli/fast.py), the typer command's parameters (gq/cli/submit.py), the sbatch
names `#SBATCH` lines may use (gq/cli/directives.py) and the spec `gq submit` builds
(gq/cli/submission.py). Written out by hand, because mypy must read the one and SQL the other:
the JobSpec dataclass (gq/model.py) and the store's spec columns (gq/store.py).
tests/test_spec.py holds those two, both CLI parsers and the protocol to FIELDS, field by field.

`check` is the one reading of what a spec's values mean, with one wording: the CLI calls it
before anything is sent (early, clear errors), gqd when it accepts a spec (the authority: any
client may send anything). What needs gqd's config or state (QOS names and their maximum times,
per-user limits, whether a node could ever hold the job, whether a dependency's jobs exist)
stays gqd's (gq/head/core.py `_accept_spec`).

Every `gq submit` loads this (the fast path, gq/cli/fast.py): plain classes and tuples, no
dataclasses or typing at run time.
"""

from __future__ import annotations

import os
import time

from gq.defaults import MAX_GPUS_PER_NODE, MAX_NODES_PER_JOB, MAX_RETRIES, MAX_TIME_LIMIT_S
from gq.errors import UsageError
from gq.units import parse_duration, parse_size, parse_time, signal_parts, signal_text

TYPE_CHECKING = False  # mypy reads the block below; the fast path does not import typing
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

NONE = type(None)
#: The default of the one field every spec must give (its script).
REQUIRED: Any = Ellipsis
_I64 = 2**63 - 1
_ID = 2**32 - 1


class Field:
    """One field of a job spec: JobSpec's attribute, a key of its wire and stored forms."""

    __slots__ = ("name", "types", "default", "bounds", "unit", "canon", "filled", "context",
                 "label")

    def __init__(self, name: str, types: tuple[type, ...], default: Any = REQUIRED, *,
                 bounds: tuple[int, int] | None = None, unit: str = "",
                 canon: Callable[[Any], Any] | None = None, filled: bool = False,
                 context: bool = False) -> None:
        self.name = name
        #: The types its value may have on the wire (NONE: it may be None, "not given").
        self.types = types
        #: Its value when a spec leaves it out (a list or dict default is copied for each spec).
        self.default = default
        #: An integer's bounds (lowest, highest).
        self.bounds = bounds
        #: What its number counts, for messages ("seconds").
        self.unit = unit
        #: Checks a given value (not None) and returns its canonical form, or UsageError.
        self.canon = canon
        #: None means "gqd's default": gqd fills it in when it accepts the spec (the default
        #: QOS, the QOS's default time limit, `[head] default_retries`).
        self.filled = filled
        #: `gq submit` takes it from the caller (the script, its arguments, the process's ids,
        #: directory and environment), not from the default.
        self.context = context
        #: How messages name it: the option that sets it (set from OPTIONS below), else its name.
        self.label = name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def out_of_bounds(self, value: int, low: int, high: int) -> str:
        unit = f" ({self.unit})" if self.unit else ""
        return f"bad {self.label} {value}: expected {low}..{high}{unit}"


def _absolute(path: str) -> str:
    if not path.startswith("/"):
        raise UsageError(f"working directory {path!r} is not absolute")
    return path


def _signal(text: str) -> str:
    """The canonical form (`B:USR1@60`): the shepherd and the preemption code read no other."""
    return signal_text(*signal_parts(text))


def _dependency(text: str) -> str:
    from gq.deps import parse_dependency  # loaded only for a job that has one
    return str(parse_dependency(text))


def _array(text: str) -> str:
    from gq.arrays import parse_array  # loaded only for an array
    parse_array(text)
    return text.strip()


#: Every field of a job spec, in JobSpec's order (the order of its wire and stored forms).
FIELDS: tuple[Field, ...] = (
    Field("script", (str,), context=True),
    Field("name", (str,), "job", context=True),
    Field("args", (list,), [], context=True),
    # gqd sets user and uid (and gid, from the passwd database) to the caller's.
    Field("user", (str,), ""),
    Field("uid", (int,), -1, bounds=(-1, _ID), context=True),
    Field("gid", (int,), -1, bounds=(-1, _ID), context=True),
    Field("cwd", (str,), "/", canon=_absolute, context=True),
    Field("env", (dict,), {}, context=True),
    Field("nodes", (int,), 1, bounds=(1, MAX_NODES_PER_JOB)),
    Field("gpus", (int,), 1, bounds=(0, MAX_GPUS_PER_NODE)),
    Field("gpu_type", (str, NONE), None, canon=str.lower),
    Field("gpu_mem", (int, NONE), None, bounds=(0, _I64), unit="bytes"),
    Field("cpus", (int,), 0, bounds=(0, 2**31)),
    Field("mem", (int,), 0, bounds=(0, _I64), unit="bytes"),
    Field("time_limit_s", (int, NONE), None, bounds=(0, MAX_TIME_LIMIT_S),
          unit="seconds", filled=True),
    Field("qos", (str, NONE), None, filled=True),
    Field("output", (str, NONE), None),
    Field("error", (str, NONE), None),
    Field("requeue", (bool,), True),
    Field("retries", (int, NONE), None, bounds=(0, MAX_RETRIES), filled=True),
    Field("signal", (str, NONE), None, canon=_signal),
    Field("hold", (bool,), False),
    Field("begin_time", (int, float, NONE), None),
    Field("dependency", (str, NONE), None, canon=_dependency),
    Field("kill_on_invalid_dep", (bool,), False),
    Field("array", (str, NONE), None, canon=_array),
    Field("account", (str, NONE), None),
    Field("share", (bool,), False),
)


class Option:
    """One option of `gq submit` (on its command line and in `#GQ` lines): its flags, the long
    one last; its parameter name; its kind (str, int, or bool: a flag), default and help; the
    spec field it sets (None: it steers the command instead), with how its value becomes the
    field's (`convert`; None: as it is); and the sbatch options `#SBATCH` lines give it as."""

    __slots__ = ("flags", "dest", "kind", "default", "help", "metavar", "field", "convert",
                 "slurm")

    def __init__(self, flags: tuple[str, ...], dest: str, kind: type, default: Any, help: str,
                 *, metavar: str | None = None, field: str | None = None,
                 convert: Callable[[Any], Any] | None = None,
                 slurm: tuple[str, ...] = ()) -> None:
        self.flags, self.dest, self.kind, self.default = flags, dest, kind, default
        self.help, self.metavar = help, metavar
        self.field, self.convert, self.slurm = field, convert, slurm


def export_env(export: str, environ: dict[str, str]) -> dict[str, str]:
    """Slurm's --export: ALL, NONE, or a list of VAR / VAR=VALUE (with ALL: added to everything)."""
    items = [i for i in export.split(",") if i]
    if not items:
        raise UsageError("bad --export '': expected ALL, NONE or VAR[=VALUE],...")
    env: dict[str, str] = {}
    for item in items:
        if item == "ALL":
            env.update(environ)
        elif item == "NONE":
            continue
        elif "=" in item:
            key, _, value = item.partition("=")
            env[key] = value
        elif item.replace("_", "").isalnum():
            if item in environ:
                env[item] = environ[item]
        else:
            raise UsageError(f"bad --export item {item!r}: expected ALL, NONE, VAR or VAR=VALUE")
    return env


#: `gq submit`'s options, in the order its help lists them.
OPTIONS: tuple[Option, ...] = (
    Option(("--wrap",), "wrap", str, None, "run this shell command instead of a script"),
    Option(("-g", "--gpus"), "gpus", int, 1, "GPUs per node", field="gpus",
           slurm=("-G", "--gpus", "--gpus-per-node")),
    Option(("-N", "--nodes"), "nodes", int, 1, "nodes, started together (gang)", field="nodes",
           slurm=("-N", "--nodes")),
    Option(("--gpu-type",), "gpu_type", str, None, "GPU model, e.g. h100", field="gpu_type"),
    Option(("--gpu-mem",), "gpu_mem", str, None, "minimum VRAM per GPU, e.g. 40G",
           field="gpu_mem", convert=lambda text: parse_size(text) if text else None),
    Option(("--share",), "share", bool, False, "share GPUs with other --share jobs while "
           "their --gpu-mem sums fit in VRAM", field="share"),
    Option(("-c", "--cpus"), "cpus", int, 0, "CPUs per node", field="cpus",
           slurm=("-c", "--cpus-per-task")),
    Option(("--mem",), "mem", str, None, "memory per node, e.g. 64G", field="mem",
           convert=lambda text: parse_size(text) if text else 0, slurm=("--mem",)),
    Option(("-t", "--time"), "time", str, None, "time limit: MM, HH:MM:SS, D-HH, 2h ...",
           field="time_limit_s", convert=lambda text: parse_duration(text) if text else None,
           slurm=("-t", "--time")),
    Option(("-q", "--qos"), "qos", str, None, "quality of service (tier)", field="qos",
           slurm=("-q", "--qos")),
    Option(("-J", "--name"), "name", str, None, "job name", field="name",
           slurm=("-J", "--job-name")),
    Option(("-o", "--output"), "output", str, None, "stdout file pattern (%j %x %u %A %a)",
           field="output", slurm=("-o", "--output")),
    Option(("-e", "--error"), "error", str, None, "stderr file pattern (default: with stdout)",
           field="error", slurm=("-e", "--error")),
    Option(("-D", "--chdir"), "chdir", str, None, "working directory", field="cwd",
           convert=lambda path: os.path.abspath(path) if path else os.getcwd(),
           slurm=("-D", "--chdir", "--workdir")),
    Option(("--export",), "export", str, "ALL", "ALL, NONE, or VAR[=VAL],... (with ALL, added)",
           field="env", convert=lambda text: export_env(text, dict(os.environ)),
           slurm=("--export",)),
    Option(("--no-requeue",), "no_requeue", bool, False, "never requeue after a node failure",
           field="requeue", convert=lambda flag: not flag, slurm=("--no-requeue",)),
    Option(("--retries",), "retries", int, None,
           "requeue after a node fault at most N times, then end NODE_FAIL "
           "(default: [head] default_retries)", metavar="N", field="retries"),
    # An empty --signal or --dependency names none (as an empty #SBATCH value does).
    Option(("--signal",), "job_signal", str, None,
           "send SIG SECONDS (default 60) before the time limit, and instead of SIGTERM "
           "when preempted; B: only to the script's own process",
           metavar="[B:]SIG[@SECONDS]", field="signal", convert=lambda text: text or None,
           slurm=("--signal",)),
    Option(("-a", "--array"), "array", str, None,
           "a job array: one task per index (0-99, 1,3,7, 0-99:2), at most LIMIT running",
           metavar="INDICES[%LIMIT]", field="array", slurm=("-a", "--array")),
    Option(("-d", "--dependency"), "dependency", str, None,
           "start after other jobs: after, afterany, afterok, afternotok, singleton; "
           "',' all of them, '?' any", metavar="TYPE:ID[:ID][,...]", field="dependency",
           convert=lambda text: text or None, slurm=("-d", "--dependency")),
    # sbatch's --kill-on-invalid-dep takes yes or no: gq/cli/directives.py reads it.
    Option(("--kill-on-invalid-dep",), "kill_on_invalid_dep", bool, False,
           "cancel the job when its dependency can never be met", field="kill_on_invalid_dep"),
    Option(("-H", "--hold"), "hold", bool, False, "submit held: it waits for gq release",
           field="hold", slurm=("-H", "--hold")),
    Option(("-b", "--begin"), "begin", str, None,
           "not before TIME: now+1h, 16:00, 2026-12-01T09:00", metavar="TIME",
           field="begin_time",
           convert=lambda text: parse_time(text, time.time(), future=True) if text else None,
           slurm=("-b", "--begin")),
    Option(("-A", "--account"), "account", str, None, "account charged in gq report",
           field="account", slurm=("-A", "--account")),
    Option(("--wait",), "wait", bool, False, "block until the job ends; exit with its exit code",
           slurm=("--wait",)),
    Option(("--parsable",), "parsable", bool, False, "print only the job id",
           slurm=("--parsable",)),
    Option(("--json",), "as_json", bool, False, "print the result as JSON"),
)

#: Field name -> its declaration.
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
for _option in OPTIONS:
    if _option.field is not None:
        BY_NAME[_option.field].label = _option.flags[-1]
#: The fields `check` looks at one by one.
_CHECKED = tuple(f for f in FIELDS if f.bounds is not None or f.canon is not None)
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in FIELDS}


def complete(data: dict[str, Any]) -> dict[str, Any]:
    """`data`'s values of the spec's fields, in field order, with the default of each one it
    leaves out (a new list or dict for args and env); keys that name no field are dropped."""
    values = {**_DEFAULTS, **data}
    if len(values) != len(_DEFAULTS):
        values = {name: values[name] for name in _DEFAULTS}
    if values["script"] is REQUIRED:
        raise TypeError("a job spec needs a script")
    if "args" not in data:
        values["args"] = []
    if "env" not in data:
        values["env"] = {}
    return values


def check(values: dict[str, Any]) -> dict[str, Any]:
    """A spec's values (every field's, as `complete` gives them) checked and in canonical form,
    as a new dict; else UsageError naming the option at fault. A None passes (not given: gqd
    fills in its default, then checks again)."""
    out = dict(values)
    for field in _CHECKED:
        value = out[field.name]
        if value is None:
            continue
        if field.bounds is not None:
            low, high = field.bounds
            if not low <= value <= high:
                raise UsageError(field.out_of_bounds(value, low, high))
        if field.canon is not None:
            out[field.name] = field.canon(value)
    if out["share"] and not (out["gpu_mem"] and out["gpus"]):
        raise UsageError("--share needs --gpu-mem (the VRAM each of its GPUs must leave it), "
                         "e.g. --share --gpu-mem 20G, and at least one GPU")
    if out["retries"] and not out["requeue"]:
        raise UsageError("--retries and --no-requeue contradict each other: --no-requeue "
                         "means no requeue at all (use --retries 0 to end NODE_FAIL at the "
                         "first node fault but stay requeueable)")
    return out
