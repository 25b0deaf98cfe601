"""`#GQ` and `#SBATCH` lines at the top of a batch script, turned into `gq submit` arguments.

`#GQ` lines use gq's own options. `#SBATCH` lines use Slurm's: those with a gq meaning are
translated (`--gres=gpu:a100:2`, `--gpus-per-node`, `--cpus-per-task`, `--job-name`, ...), and
the Slurm options gq has no use for (partition, mail, ...) are skipped with a warning. Which
sbatch option means which gq option is declared with gq's options, in gq/spec.py.
"""

from __future__ import annotations

import re
import shlex

from gq.errors import UsageError
from gq.spec import OPTIONS

#: sbatch options with a gq equivalent (the `slurm` names of gq/spec.py's OPTIONS) -> gq's long
#: option; sbatch's --requeue is gq's default, so it becomes nothing.
_SLURM_NAMES: dict[str, str | None] = {name: o.flags[-1] for o in OPTIONS for name in o.slurm}
_SLURM_NAMES["--requeue"] = None
#: Those of them that take no value.
_SLURM_FLAGS = frozenset({name for o in OPTIONS if o.kind is bool for name in o.slurm}
                         | {"--requeue"})
#: Slurm options gq does not use, whose value is a separate word when not given with `=`.
_SLURM_IGNORED_WITH_VALUE = {"-p", "--partition", "--mail-type", "--mail-user",
                             "-n", "--ntasks", "--ntasks-per-node", "-w", "--nodelist", "-x",
                             "--exclude", "-C", "--constraint", "--mem-per-cpu",
                             "--mem-per-gpu", "--comment", "--reservation", "--licenses",
                             "--distribution", "-m", "--open-mode", "--gpu-bind",
                             "--cpus-per-gpu", "--tasks-per-node", "--nice", "--priority"}
_GRES_RE = re.compile(r"^gpu(?::([A-Za-z0-9_.-]+))?(?::(\d+))?$")


def directive_lines(script: str) -> tuple[list[str], list[str]]:
    """The argument words of the leading `#GQ` and `#SBATCH` lines (Slurm stops at the first
    command, so do we)."""
    gq_words: list[str] = []
    slurm_words: list[str] = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        for prefix, target in (("#GQ", gq_words), ("#SBATCH", slurm_words)):
            if stripped.startswith(prefix + " ") or stripped.startswith(prefix + "\t"):
                text = stripped[len(prefix):].split(" #", 1)[0]
                try:
                    target.extend(shlex.split(text))
                except ValueError as exc:
                    raise UsageError(f"bad directive line {line!r}: {exc}") from None
    return gq_words, slurm_words


def translate_slurm(words: list[str], warn: list[str]) -> list[str]:
    """Slurm option words to gq option words; unknown ones are dropped with a warning."""
    out: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        name, eq, value = word.partition("=")
        if not eq and len(word) > 2 and word[:2] in _SLURM_NAMES and not word.startswith("--"):
            name, value, eq = word[:2], word[2:], "="  # -t10, -JName
        takes_value = name not in _SLURM_FLAGS
        if not eq and takes_value and (name in _SLURM_NAMES or name in _SLURM_IGNORED_WITH_VALUE
                                        or name in ("--gres", "--kill-on-invalid-dep")):
            i += 1
            if i >= len(words):
                raise UsageError(f"#SBATCH {name} needs a value")
            value = words[i]
        i += 1
        if name == "--gres":
            out.extend(_gres(value))
        elif name == "--kill-on-invalid-dep":  # yes or no, as sbatch takes it
            out.extend(["--kill-on-invalid-dep"] if value.lower() in ("yes", "y") else [])
        elif name in _SLURM_NAMES:
            target = _SLURM_NAMES[name]
            if target:
                out.extend([target, value] if takes_value else [target])
        else:
            warn.append(f"#SBATCH {word}: not used by gq, ignored")
    return out


def _gres(value: str) -> list[str]:
    for item in value.split(","):
        m = _GRES_RE.match(item.strip())
        if m:
            words = ["--gpus", m[2] or "1"]
            if m[1] and not m[1].isdigit():
                words += ["--gpu-type", m[1]]
            elif m[1] and not m[2]:  # gpu:2
                words = ["--gpus", m[1]]
            return words
    raise UsageError(f"#SBATCH --gres={value}: only gpu[:TYPE][:COUNT] is understood")
