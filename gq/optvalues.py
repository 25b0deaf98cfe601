"""How the values of `gq submit`'s (and sbatch's) options become job spec fields, and the
checks of the fields they set (gq/spec.py declares which option uses which).

Each `to_*` function takes an option's text and returns the fields it sets (a dict: some
options set several, as `--gres=gpu:a100:2` sets gpus and gpu_type); each `canon_*` function
checks a field's value and returns its canonical form. Loaded by every `gq submit`: plain
functions, patterns compiled on first use.
"""

from __future__ import annotations

import re

from gq.errors import UsageError
from gq.units import parse_size

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_COUNT_RE = r"^(?:([A-Za-z][A-Za-z0-9_.-]*):)?(\d+)$"
_GRES_RE = r"^gpu(?::([A-Za-z0-9_.-]+))?(?::(\d+))?$"

#: --mail-type's values (Slurm's): gq mails on BEGIN, END, FAIL and REQUEUE (ALL is those);
#: the others are accepted and send nothing.
MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "INVALID_DEPEND", "STAGE_OUT",
              "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80", "TIME_LIMIT_50", "ARRAY_TASKS")
OPEN_MODES = ("append", "truncate")


def gpu_count(field: str, option: str) -> Callable[[str], dict[str, Any]]:
    """`[TYPE:]N` (--gpus-per-node, --gpus, --gpus-per-task) -> {field: N, gpu_type: TYPE}."""
    def convert(text: str) -> dict[str, Any]:
        m = re.match(_COUNT_RE, str(text).strip())
        if not m:
            raise UsageError(f"bad {option} {text!r}: expected [TYPE:]COUNT, e.g. 4 or a100:4")
        return {field: int(m[2]), **({"gpu_type": m[1]} if m[1] else {})}
    return convert


def to_gres(text: str) -> dict[str, Any]:
    """`gpu[:TYPE][:N]` (the first gpu item of a --gres list) -> gpus per node, gpu_type."""
    for item in str(text).split(","):
        m = re.match(_GRES_RE, item.strip())
        if m:
            if m[1] and m[1].isdigit() and not m[2]:  # gpu:2
                return {"gpus": int(m[1])}
            return {"gpus": int(m[2] or 1), **({"gpu_type": m[1]} if m[1] else {})}
    raise UsageError(f"bad --gres {text!r}: only gpu[:TYPE][:COUNT] is understood")


def size_or_none(text: str | None) -> int | None:
    return parse_size(text) if text else None


def yes_no(option: str) -> Callable[[str], bool]:
    """sbatch's `yes` or `no` (--kill-on-invalid-dep)."""
    def convert(text: str) -> bool:
        word = str(text).strip().lower()
        if word not in ("yes", "y", "no", "n"):
            raise UsageError(f"bad {option} {text!r}: expected yes or no")
        return word.startswith("y")
    return convert


def canon_mail_type(text: str) -> str | None:
    """Upper case, comma-separated, each one of MAIL_TYPES."""
    types = [t.strip().upper() for t in text.split(",") if t.strip()]
    bad = [t for t in types if t not in MAIL_TYPES]
    if bad or not types:
        raise UsageError(f"bad --mail-type {text!r}: expected a comma list of "
                         f"{', '.join(MAIL_TYPES)}")
    return ",".join(dict.fromkeys(types))


def canon_open_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in OPEN_MODES:
        raise UsageError(f"bad --open-mode {text!r}: expected append or truncate")
    return mode


def canon_partition(text: str) -> str:
    """A partition name, or Slurm's comma list of them (the job runs in whichever has room)."""
    names = [n.strip() for n in text.split(",")]
    if not all(names) or any(c.isspace() for n in names for c in n):
        raise UsageError(f"bad --partition {text!r}: expected NAME or NAME,NAME,...")
    return ",".join(dict.fromkeys(names))


def canon_hostlist(text: str) -> str:
    """Node names, as a list or in hostlist form (node[1-4]); checked, kept as given."""
    from gq.hostlist import expand  # only a job that names nodes needs it
    if not expand(text):
        raise UsageError(f"bad node list {text!r}: it names no node")
    return text.strip()


def canon_constraint(text: str) -> str:
    from gq.features import parse_constraint  # only a job with a constraint needs it
    parse_constraint(text)
    return text.strip()
