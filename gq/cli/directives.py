"""`#GQ` and `#SBATCH` lines at the top of a batch script, turned into `gq submit` arguments.

Both kinds of line take `gq submit`'s options, which are sbatch's too (gq/spec.py declares one
set: `--gres=gpu:a100:2`, `--gpus-per-node`, `-n`, `-c`, `-p`, `--mail-type`, ...); the sbatch
options gq has no use for are accepted there with a warning. An `#SBATCH` option gq does not
know at all is dropped with a warning (sbatch would refuse it), so a site's script still runs;
on the command line and in `#GQ` lines it is an error.
"""

from __future__ import annotations

from gq.errors import UsageError
from gq.spec import OPTIONS

#: Every flag `gq submit` takes -> whether it takes a value.
_TAKES_VALUE: dict[str, bool] = {flag: o.kind is not bool for o in OPTIONS for flag in o.flags}
#: Every long flag -> the option it names (its destination).
_LONG: dict[str, str] = {flag: o.dest for o in OPTIONS for flag in o.flags
                         if flag.startswith("--")}


def long_flag(name: str) -> str:
    """The long option a word's name stands for: itself, or the one option it is a prefix of.
    sbatch reads its options with getopt_long, which takes any unique prefix, and real scripts
    write `#SBATCH --err=err --out=out`; an option's aliases count once."""
    if name in _TAKES_VALUE or not name.startswith("--") or len(name) < 3:
        return name
    found = {flag: dest for flag, dest in _LONG.items() if flag.startswith(name)}
    return min(found) if len(set(found.values())) == 1 else name


def expand_prefixes(argv: list[str]) -> list[str]:
    """`argv` (sbatch's options, then its script and the script's arguments) with each
    abbreviated long option written out; the script's own arguments are left alone."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word == "--" or not word.startswith("-") or word == "-":
            return out + argv[i - 1:]
        name, eq, value = word.partition("=")
        name = long_flag(name) if word.startswith("--") else name
        out.append(name + eq + value)
        if not eq and i < len(argv) and _TAKES_VALUE.get(name if word.startswith("--")
                                                         else word) and len(word) > 1:
            out.append(argv[i])  # its value, whatever it looks like
            i += 1
    return out


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
                import shlex  # here: a script without directives (--wrap) needs none
                try:
                    target.extend(shlex.split(text))
                except ValueError as exc:
                    raise UsageError(f"bad directive line {line!r}: {exc}") from None
    return gq_words, slurm_words


def translate_slurm(words: list[str], warn: list[str]) -> list[str]:
    """`#SBATCH` words as `gq submit` words: the same, less the options gq does not know
    (each dropped with its value, and a warning)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        name, eq, value = words[i].partition("=")
        name = long_flag(name)
        word = name + eq + value
        i += 1
        if name in _TAKES_VALUE or not word.startswith("-") or (
                not word.startswith("--") and word[:2] in _TAKES_VALUE):
            out.append(word)
            continue
        dropped = [word]
        if "=" not in word and i < len(words) and not words[i].startswith("-"):
            dropped.append(words[i])  # its value
            i += 1
        warn.append(f"#SBATCH {' '.join(dropped)}: not an option gq knows, ignored")
    return out
