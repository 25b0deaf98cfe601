"""Durations, points in time, sizes and `--signal`: parsing (each rule here and only here) and
formatting. gq.model re-exports them beside the types that use them.

Light on purpose: `gq submit`, `queue` and `show` import this and not gq.model, whose
dataclasses and enums cost a call more than its parsing does (`python -X importtime`).
Patterns are strings that `re` compiles (and caches) on first use, not at import.
"""

from __future__ import annotations

import re

from gq.defaults import MAX_SIGNAL_LEAD_S, SIGNAL_LEAD_S
from gq.errors import UsageError

# ---------------------------------------------------------------- durations

_DURATION_FORMS = ("MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, "
                   "or a number with a unit: 90s, 30m, 2h, 1d")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNIT_RE = r"^(\d+(?:\.\d+)?)([smhd])$"
_DAYS_RE = r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$"
_CLOCK_RE = r"^(\d+)(?::(\d+))?(?::(\d+))?$"


def parse_duration(text: str | int | float) -> int:
    """Seconds in a Slurm-style time limit. A bare number means minutes, as in Slurm."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return _positive_duration(int(text * 60), str(text))
    raw = str(text).strip().lower()
    if raw in ("unlimited", "infinite"):
        return 0
    if m := re.match(_UNIT_RE, raw):
        return _positive_duration(int(float(m[1]) * _UNIT_S[m[2]]), raw)
    if m := re.match(_DAYS_RE, raw):
        days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
        return _positive_duration(((days * 24 + hours) * 60 + minutes) * 60 + seconds, raw)
    if m := re.match(_CLOCK_RE, raw):
        parts = [int(g) for g in m.groups() if g is not None]
        if len(parts) == 1:
            return _positive_duration(parts[0] * 60, raw)
        if len(parts) == 2:
            return _positive_duration(parts[0] * 60 + parts[1], raw)
        return _positive_duration(parts[0] * 3600 + parts[1] * 60 + parts[2], raw)
    raise UsageError(f"bad duration {text!r}: expected {_DURATION_FORMS}")


def _positive_duration(seconds: int, raw: str) -> int:
    if seconds <= 0:
        raise UsageError(f"bad duration {raw!r}: must be more than zero; expected {_DURATION_FORMS}")
    return seconds


def format_duration(seconds: float | None) -> str:
    """Slurm's D-HH:MM:SS form (HH:MM:SS under a day); 'UNLIMITED' for no limit."""
    if not seconds:
        return "UNLIMITED" if seconds == 0 else ""
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


# ---------------------------------------------------------------- points in time

_TIME_FORMS = ("now, now+N or now-N (N seconds, or with a unit: 30s, 10m, 1h, 2d, 1w), today, "
               "tomorrow, HH:MM[:SS], YYYY-MM-DD, or YYYY-MM-DDTHH:MM[:SS] (local time; a "
               "trailing Z means UTC)")
_RELATIVE_RE = r"^now(?:([+-])(\d+)\s*([a-z]*))?$"
_RELATIVE_UNITS = {"": 1, "s": 1, "sec": 1, "seconds": 1, "m": 60, "min": 60, "minutes": 60,
                   "h": 3600, "hours": 3600, "d": 86400, "days": 86400, "w": 604800,
                   "weeks": 604800}
_HOUR_RE = r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$"


def parse_time(text: str, now: float, future: bool = False) -> float:
    """Epoch seconds of a Slurm-style time (`--begin`, `--since`). `HH:MM` is today at that time,
    or, with `future` (for --begin), the next such time, tomorrow's when today's has passed."""
    import datetime as _dt
    raw = str(text).strip().lower()
    local_now = _dt.datetime.fromtimestamp(now).astimezone()
    midnight = local_now.replace(hour=0, minute=0, second=0, microsecond=0)
    if m := re.match(_RELATIVE_RE, raw):
        if not m[1]:
            return now
        if m[3] not in _RELATIVE_UNITS:
            raise UsageError(f"bad time {text!r}: unknown unit {m[3]!r}; expected {_TIME_FORMS}")
        delta = int(m[2]) * _RELATIVE_UNITS[m[3]]
        return now + delta if m[1] == "+" else now - delta
    if raw in ("today", "midnight", "tomorrow"):
        days = 0 if raw == "today" else 1
        return (midnight + _dt.timedelta(days=days)).timestamp()
    if m := re.match(_HOUR_RE, raw):
        hour, minute, second = int(m[1]), int(m[2]), int(m[3] or 0)
        if hour > 23 or minute > 59 or second > 59:
            raise UsageError(f"bad time {text!r}: expected {_TIME_FORMS}")
        at = midnight.replace(hour=hour, minute=minute, second=second)
        if future and at.timestamp() <= now:
            at += _dt.timedelta(days=1)
        return at.timestamp()
    try:
        parsed = _dt.datetime.fromisoformat(raw.upper().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"bad time {text!r}: expected {_TIME_FORMS}") from None
    return (parsed if parsed.tzinfo else parsed.astimezone()).timestamp()


def parse_iso_time(text: str | None) -> float | None:
    """Inverse of gq.model.iso_time."""
    if not text:
        return None
    import datetime as _dt
    return _dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=_dt.timezone.utc).timestamp()


# ---------------------------------------------------------------- sizes

_SIZE_RE = r"^(\d+(?:\.\d+)?)\s*(?:([kmgtp])(?:i?b)?|(b))?$"
_SIZE_MULT = {"b": 1, "": 1024**2, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def parse_size(text: str | int) -> int:
    """Bytes in a size like `40G`, `512M`, `1.5T`. A bare number means MiB, as in Slurm's --mem."""
    raw = str(text).strip().lower()
    m = re.match(_SIZE_RE, raw)
    if not m:
        raise UsageError(f"bad size {text!r}: expected a number with an optional unit "
                         "K, M, G, T (powers of 1024), e.g. 40G or 512M; a bare number is MiB")
    unit = "b" if m[3] else (m[2] or "")
    return int(float(m[1]) * _SIZE_MULT[unit])


def format_size(nbytes: int | None) -> str:
    if not nbytes:
        return "-"
    for unit, mult in (("T", 1024**4), ("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if nbytes >= mult:
            value = nbytes / mult
            return f"{value:.0f}{unit}" if value == int(value) or value >= 100 else f"{value:.1f}{unit}"
    return f"{nbytes}B"


# ---------------------------------------------------------------- signals

#: Signals `--signal` may name: Slurm's list, less KILL and STOP, which no job can catch or act on.
_SIGNAL_NAMES = ("HUP", "INT", "QUIT", "ABRT", "ALRM", "TERM", "USR1", "USR2", "URG", "CONT",
                 "TSTP", "TTIN", "TTOU", "XCPU")
_SIGNAL_FORMS = (f"[B:]SIG[@SECONDS], SIG a name ({', '.join(_SIGNAL_NAMES)}; with or without "
                 f"SIG, any case) or its number, SECONDS 0 to {MAX_SIGNAL_LEAD_S} (default "
                 f"{SIGNAL_LEAD_S}), e.g. USR1@120 or B:USR2")
_SIGNAL_RE = r"^(?:(b):)?([a-z0-9]+)(?:@([0-9]+))?$"


def signal_parts(text: str) -> tuple[str, int, bool]:
    """`[B:]SIG[@SECONDS]` as sbatch --signal takes it: (name without SIG, upper case; seconds
    before the time limit; whether only the batch script gets it). gq.model.JobSignal holds
    them."""
    m = re.match(_SIGNAL_RE, str(text).strip(), re.IGNORECASE | re.ASCII)
    if not m:
        raise UsageError(f"bad --signal {text!r}: expected {_SIGNAL_FORMS}")
    lead = int(m[3]) if m[3] is not None else SIGNAL_LEAD_S
    if lead > MAX_SIGNAL_LEAD_S:
        raise UsageError(f"bad --signal {text!r}: at most {MAX_SIGNAL_LEAD_S} seconds before the "
                         f"time limit; expected {_SIGNAL_FORMS}")
    return _signal_name(m[2], text), lead, bool(m[1])


def signal_text(name: str, lead_s: int, batch_only: bool) -> str:
    """The canonical form of a `--signal`, which the spec stores and `gq show` prints:
    `B:USR1@60`."""
    return f"{'B:' if batch_only else ''}{name}@{lead_s}"


def _signal_name(word: str, text: str) -> str:
    name = word.upper().removeprefix("SIG")
    if word.isdigit():
        import signal as _signal
        try:
            name = _signal.Signals(int(word)).name.removeprefix("SIG")
        except ValueError:
            name = ""
    if name in ("KILL", "STOP"):
        raise UsageError(f"bad --signal {text!r}: SIG{name} cannot be caught, so the job could "
                         f"not act on it (gq sends SIGKILL itself after the grace time); "
                         f"expected {_SIGNAL_FORMS}")
    if name not in _SIGNAL_NAMES:
        raise UsageError(f"bad --signal {text!r}: {word!r} is not a signal a job may ask for; "
                         f"expected {_SIGNAL_FORMS}")
    return name
