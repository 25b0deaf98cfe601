"""A job spec, declared once: its fields (FIELDS), the options of `gq submit` that set them
(OPTIONS), and the one check of what a spec's values mean (`check`).

Derived from here: the protocol's spec schema (gq/protocol.py SPEC_SCHEMA), the fast path's
option table (gq/cli/fast.py), the typer command's parameters (gq/cli/submit.py), `sbatch`'s
(gq/slurm/sbatch.py), the options `#SBATCH` and `#GQ` lines may give (gq/cli/directives.py: the
very same ones, Slurm's names among them) and the spec `gq submit` builds
(gq/cli/submission.py). Written out by hand, because mypy must read the one and SQL the other:
the JobSpec dataclass (gq/model.py) and the store's spec columns (gq/store.py).
tests/test_spec.py holds those two, both CLI parsers and the protocol to FIELDS, field by field.

`check` is the one reading of what a spec's values mean, with one wording: the CLI calls it
before anything is sent (early, clear errors), gqd when it accepts a spec (the authority: any
client may send anything). What needs gqd's config or state (QOS names and their maximum times,
per-user limits, partitions, how many nodes the tasks need and what each node then holds
(gq/tasks.py), whether a node could ever hold the job, whether a dependency's jobs exist) stays
gqd's (gq/head/core.py `_accept_spec`).

Every `gq submit` loads this (the fast path, gq/cli/fast.py): plain classes and tuples, no
dataclasses or typing at run time.
"""

from __future__ import annotations

import os
import time

from gq.optvalues import (canon_constraint, canon_hostlist, canon_mail_type, canon_open_mode,
                           canon_partition, gpu_count, size_or_none, to_gres, yes_no)
from gq.defaults import (MAX_CPUS, MAX_GPUS_PER_NODE, MAX_NICE, MAX_NODES_PER_JOB, MAX_RETRIES,
                         MAX_TASKS, MAX_TIME_LIMIT_S)
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


def parse_cold_wait(text: str) -> int | None:
    """--cold-wait: a duration, or 0 (no wait: a keyed job otherwise waits the default,
    [scheduler] cold_wait_s); empty: unset."""
    if not text:
        return None
    return 0 if text.strip().lower() in ("0", "0s") else parse_duration(text)


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
    # nodes and gpus (per node) are what the job holds. None (the CLI's when no option asks):
    # gqd decides, from the tasks asked for and [scheduler] default_gpus (gq/tasks.py), as it
    # works out cpus and mem per node from the per-task and per-GPU figures below.
    Field("nodes", (int, NONE), 1, bounds=(1, MAX_NODES_PER_JOB), filled=True),
    Field("gpus", (int, NONE), 1, bounds=(0, MAX_GPUS_PER_NODE), filled=True),
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
    # The host `gq submit` ran on (SLURM_SUBMIT_HOST).
    Field("submit_host", (str,), "", context=True),
    # Slurm's requests as given (None: not given); they say how many tasks the job has and
    # what each needs, and name the SLURM_* variables the job gets.
    Field("gpus_total", (int, NONE), None, bounds=(0, MAX_NODES_PER_JOB * MAX_GPUS_PER_NODE)),
    Field("gpus_per_task", (int, NONE), None, bounds=(0, MAX_GPUS_PER_NODE)),
    Field("ntasks", (int, NONE), None, bounds=(1, MAX_TASKS)),
    Field("ntasks_per_node", (int, NONE), None, bounds=(1, MAX_TASKS)),
    Field("cpus_per_task", (int, NONE), None, bounds=(1, MAX_CPUS)),
    Field("cpus_per_gpu", (int, NONE), None, bounds=(1, MAX_CPUS)),
    Field("mem_per_cpu", (int, NONE), None, bounds=(0, _I64), unit="bytes"),
    Field("mem_per_gpu", (int, NONE), None, bounds=(0, _I64), unit="bytes"),
    Field("exclusive", (bool,), False),
    # None: the cluster's default partition (gqd fills it in).
    Field("partition", (str, NONE), None, canon=canon_partition, filled=True),
    Field("constraint", (str, NONE), None, canon=canon_constraint),
    Field("nodelist", (str, NONE), None, canon=canon_hostlist),
    Field("exclude", (str, NONE), None, canon=canon_hostlist),
    Field("open_mode", (str, NONE), None, canon=canon_open_mode),
    Field("nice", (int,), 0, bounds=(-MAX_NICE, MAX_NICE)),
    Field("comment", (str, NONE), None),
    Field("mail_type", (str, NONE), None, canon=canon_mail_type),
    Field("mail_user", (str, NONE), None),
    # Model affinity (docs/SCHEDULING.md): what the job loads, and how long it may wait for a
    # GPU where that is warm before it takes a cold one.
    Field("cache_key", (str, NONE), None),
    Field("cold_wait_s", (int, NONE), None, bounds=(0, MAX_TIME_LIMIT_S), unit="seconds"),
)


class Option:
    """One option of `gq submit` (on its command line, and in `#GQ` and `#SBATCH` lines alike):
    its flags, the long one last; its parameter name; its kind (str, int, or bool: a flag),
    default and help; the spec fields it sets (none: it steers the command instead), with how
    its value becomes them (`convert`: the value of its one field, or with several fields a
    dict of those it sets; None: the value as it is). `ignored`: an sbatch option gq has no
    use for, accepted with a warning."""

    __slots__ = ("flags", "dest", "kind", "default", "help", "metavar", "fields", "convert",
                 "ignored")

    def __init__(self, flags: tuple[str, ...], dest: str, kind: type, default: Any, help: str,
                 *, metavar: str | None = None, field: str | None = None,
                 fields: tuple[str, ...] = (), convert: Callable[[Any], Any] | None = None,
                 ignored: bool = False) -> None:
        self.flags, self.dest, self.kind, self.default = flags, dest, kind, default
        self.help, self.metavar = help, metavar
        self.fields = fields or ((field,) if field else ())
        self.convert, self.ignored = convert, ignored

    @property
    def field(self) -> str | None:
        """The one field it sets (None: it sets none, or several)."""
        return self.fields[0] if len(self.fields) == 1 else None

    def sets(self, value: Any) -> dict[str, Any]:
        """The fields a value given to it sets."""
        if not self.fields:
            return {}
        out = self.convert(value) if self.convert else value
        return out if len(self.fields) > 1 else {self.fields[0]: out}


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


def _ignored(*flags: str, flag: bool = False) -> Option:
    return Option(flags, "ignored_" + flags[-1].lstrip("-").replace("-", "_"),
                  bool if flag else str, False if flag else None,
                  "sbatch's; not used by gq (a warning says so)", ignored=True)


#: `gq submit`'s options, in the order its help lists them. `sbatch` takes the same (gq/slurm).
OPTIONS: tuple[Option, ...] = (
    Option(("--wrap",), "wrap", str, None, "run this shell command instead of a script"),
    Option(("--each-node",), "each_node", bool, False,
           "run the --wrap command once on each of the job's nodes (a job step, as `srun "
           "--ntasks-per-node 1`), not once on its first node"),
    Option(("-g", "--gpus-per-node"), "gpus", str, None,
           "GPUs per node (default: [scheduler] default_gpus; none for a Slurm script)",
           metavar="[TYPE:]N", fields=("gpus", "gpu_type"),
           convert=gpu_count("gpus", "--gpus-per-node")),
    Option(("-G", "--gpus"), "gpus_total", str, None,
           "GPUs for the whole job, spread evenly over its nodes", metavar="[TYPE:]N",
           fields=("gpus_total", "gpu_type"), convert=gpu_count("gpus_total", "--gpus")),
    Option(("--gpus-per-task",), "gpus_per_task", str, None, "GPUs per task",
           metavar="[TYPE:]N", fields=("gpus_per_task", "gpu_type"),
           convert=gpu_count("gpus_per_task", "--gpus-per-task")),
    Option(("--gres",), "gres", str, None, "GPUs per node as Slurm's gres",
           metavar="gpu[:TYPE][:N]", fields=("gpus", "gpu_type"), convert=to_gres),
    Option(("-N", "--nodes"), "nodes", int, None,
           "nodes, started together (gang; default: as many as the tasks need)", field="nodes"),
    Option(("-n", "--ntasks"), "ntasks", int, None, "tasks (ranks) of the job", field="ntasks"),
    Option(("--tasks-per-node", "--ntasks-per-node"), "ntasks_per_node", int, None,
           "tasks per node", field="ntasks_per_node"),
    Option(("-c", "--cpus", "--cpus-per-task"), "cpus", int, None,
           "CPUs per task (one task per node unless -n or --ntasks-per-node)",
           field="cpus_per_task"),
    Option(("--cpus-per-gpu",), "cpus_per_gpu", int, None, "CPUs per GPU", field="cpus_per_gpu"),
    Option(("--gpu-type",), "gpu_type", str, None, "GPU model, e.g. h100", field="gpu_type"),
    Option(("--gpu-mem",), "gpu_mem", str, None, "minimum VRAM per GPU, e.g. 40G",
           field="gpu_mem", convert=size_or_none),
    Option(("--share",), "share", bool, False, "share GPUs with other --share jobs while "
           "their --gpu-mem sums fit in VRAM", field="share"),
    Option(("--mem",), "mem", str, None, "memory per node, e.g. 64G", field="mem",
           convert=lambda text: parse_size(text) if text else 0),
    Option(("--mem-per-cpu",), "mem_per_cpu", str, None, "memory per CPU",
           field="mem_per_cpu", convert=size_or_none),
    Option(("--mem-per-gpu",), "mem_per_gpu", str, None, "memory per GPU",
           field="mem_per_gpu", convert=size_or_none),
    Option(("--exclusive",), "exclusive", bool, False, "whole nodes: all their GPUs, CPUs and "
           "memory", field="exclusive"),
    Option(("-p", "--partition"), "partition", str, None, "partition(s) to run in",
           metavar="NAME[,NAME]", field="partition"),
    Option(("-C", "--constraint"), "constraint", str, None, "node features: a&b all, a|b any",
           field="constraint"),
    Option(("-w", "--nodelist"), "nodelist", str, None, "run on these nodes (node[1-4])",
           field="nodelist"),
    Option(("-x", "--exclude"), "exclude", str, None, "never run on these nodes",
           field="exclude"),
    Option(("-t", "--time"), "time", str, None, "time limit: MM, HH:MM:SS, D-HH, 2h ...",
           field="time_limit_s", convert=lambda text: parse_duration(text) if text else None),
    Option(("-q", "--qos"), "qos", str, None, "quality of service (tier)", field="qos"),
    Option(("-J", "--name", "--job-name"), "name", str, None, "job name", field="name"),
    Option(("-o", "--output"), "output", str, None, "stdout file pattern (%j %x %u %A %a %N)",
           field="output"),
    Option(("-e", "--error"), "error", str, None, "stderr file pattern (default: with stdout)",
           field="error"),
    Option(("--open-mode",), "open_mode", str, None, "append to the output files, or truncate "
           "them (default: truncate, append after a requeue)", metavar="append|truncate",
           field="open_mode"),
    Option(("-D", "--chdir", "--workdir"), "chdir", str, None, "working directory", field="cwd",
           convert=lambda path: os.path.abspath(path) if path else os.getcwd()),
    Option(("--export",), "export", str, "ALL", "ALL, NONE, or VAR[=VAL],... (with ALL, added)",
           field="env", convert=lambda text: export_env(text, dict(os.environ))),
    Option(("--requeue",), "requeue", bool, False, "requeue after a node failure (the default)",
           field="requeue", convert=lambda flag: True),
    Option(("--no-requeue",), "no_requeue", bool, False, "never requeue after a node failure",
           field="requeue", convert=lambda flag: False),
    Option(("--retries",), "retries", int, None,
           "requeue after a node fault at most N times, then end NODE_FAIL "
           "(default: [head] default_retries)", metavar="N", field="retries"),
    # An empty --signal or --dependency names none (as an empty #SBATCH value does).
    Option(("--signal",), "job_signal", str, None,
           "send SIG SECONDS (default 60) before the time limit, and instead of SIGTERM "
           "when preempted; B: only to the script's own process",
           metavar="[B:]SIG[@SECONDS]", field="signal", convert=lambda text: text or None),
    Option(("-a", "--array"), "array", str, None,
           "a job array: one task per index (0-99, 1,3,7, 0-99:2), at most LIMIT running",
           metavar="INDICES[%LIMIT]", field="array"),
    Option(("-d", "--dependency"), "dependency", str, None,
           "start after other jobs: after, afterany, afterok, afternotok, singleton; "
           "',' all of them, '?' any", metavar="TYPE:ID[:ID][,...]", field="dependency",
           convert=lambda text: text or None),
    Option(("--kill-on-invalid-dep",), "kill_on_invalid_dep", str, None,
           "yes: cancel the job when its dependency can never be met", metavar="yes|no",
           field="kill_on_invalid_dep",
           convert=yes_no("--kill-on-invalid-dep")),
    Option(("-H", "--hold"), "hold", bool, False, "submit held: it waits for gq release",
           field="hold"),
    Option(("-b", "--begin"), "begin", str, None,
           "not before TIME: now+1h, 16:00, 2026-12-01T09:00", metavar="TIME",
           field="begin_time",
           convert=lambda text: parse_time(text, time.time(), future=True) if text else None),
    Option(("-A", "--account"), "account", str, None, "account charged in gq report",
           field="account"),
    Option(("--comment",), "comment", str, None, "a comment kept with the job", field="comment"),
    Option(("--nice",), "nice", int, None, "lower the job's priority by N points (negative: "
           "raise it, admins only)", metavar="N", field="nice"),
    Option(("--mail-type",), "mail_type", str, None, "mail on BEGIN, END, FAIL, REQUEUE, ALL "
           "(by [head] mail_program)", metavar="TYPE[,TYPE]", field="mail_type"),
    Option(("--mail-user",), "mail_user", str, None, "whom to mail (default: the job's owner)",
           field="mail_user"),
    Option(("--cache-key",), "cache_key", str, None, "what the job loads (a model's name): "
           "it goes to a GPU where KEY is warm when that delays no one", metavar="KEY",
           field="cache_key", convert=lambda text: text or None),
    Option(("--cold-wait",), "cold_wait", str, None, "wait up to DURATION for a GPU where "
           "the job's --cache-key is warm before taking a cold one (default [scheduler] "
           "cold_wait_s; 0: none)", metavar="DURATION", field="cold_wait_s", convert=parse_cold_wait),
    Option(("-W", "--wait"), "wait", bool, False,
           "block until the job ends; exit with its exit code"),
    Option(("--test-only",), "test_only", bool, False,
           "submit nothing: say when and where the job would start"),
    Option(("--parsable",), "parsable", bool, False, "print only the job id"),
    Option(("--json",), "as_json", bool, False, "print the result as JSON"),
    # sbatch's options gq has no use for: scripts that give them still run.
    _ignored("--reservation"), _ignored("-L", "--licenses"), _ignored("-m", "--distribution"),
    _ignored("--gpu-bind"), _ignored("--gpu-freq"), _ignored("--cpu-freq"),
    _ignored("--ntasks-per-gpu"), _ignored("--ntasks-per-socket"),
    _ignored("--ntasks-per-core"), _ignored("--hint"), _ignored("--threads-per-core"),
    _ignored("--cores"), _ignored("--cores-per-socket"), _ignored("--sockets-per-node"),
    _ignored("-B", "--extra-node-info"), _ignored("--tmp"), _ignored("--mincpus"),
    _ignored("--priority"), _ignored("--wckey"), _ignored("--deadline"),
    _ignored("-M", "--clusters"), _ignored("--switches"), _ignored("--acctg-freq"),
    _ignored("--profile"), _ignored("--network"), _ignored("--bb"), _ignored("-S", "--core-spec"),
    _ignored("--thread-spec"), _ignored("--gres-flags"), _ignored("--mem-bind"),
    _ignored("-i", "--input"), _ignored("--mcs-label"), _ignored("--delay-boot"),
    _ignored("-O", "--overcommit", flag=True), _ignored("-s", "--oversubscribe", flag=True),
    _ignored("--contiguous", flag=True), _ignored("--spread-job", flag=True),
    _ignored("--use-min-nodes", flag=True), _ignored("-k", "--no-kill", flag=True),
    _ignored("--get-user-env", flag=True), _ignored("--propagate", flag=True),
    _ignored("--reboot", flag=True), _ignored("-Q", "--quiet", flag=True),
    _ignored("-v", "--verbose", flag=True),
)
#: The fields that ask for GPUs in some form: a job that sets none of them holds the default.
GPU_FIELDS = frozenset({"gpus", "gpus_total", "gpus_per_task"})

#: Field name -> its declaration.
BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}
for _option in reversed(OPTIONS):  # the first option that sets a field names it
    for _name in _option.fields:
        BY_NAME[_name].label = _option.flags[-1]
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
    if out["share"] and not (out["gpu_mem"] and out["gpus"] != 0):
        raise UsageError("--share needs --gpu-mem (the VRAM each of its GPUs must leave it), "
                         "e.g. --share --gpu-mem 20G, and at least one GPU")
    if out["retries"] and not out["requeue"]:
        raise UsageError("--retries and --no-requeue contradict each other: --no-requeue "
                         "means no requeue at all (use --retries 0 to end NODE_FAIL at the "
                         "first node fault but stay requeueable)")
    given = [label for name, label in _MEM_FORMS if out[name]]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)} are mutually exclusive: give one of them")
    if out["cpus_per_task"] and out["cpus_per_gpu"]:
        raise UsageError("--cpus-per-task and --cpus-per-gpu are mutually exclusive: give one")
    return out


#: The ways to ask for memory, which exclude each other (as in Slurm).
_MEM_FORMS = (("mem", "--mem"), ("mem_per_cpu", "--mem-per-cpu"), ("mem_per_gpu", "--mem-per-gpu"))
