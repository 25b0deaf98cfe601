"""The one error hierarchy of gq, and the one mapping of errors to exit statuses (`exit_status`),
which every entry point uses: `gq` (gq/cli/main.py, for the fast path and typer alike) and the
Slurm commands (gq/slurm/common.py), both through `end`; gqd, gqnode, gq relay and gq api
(their `main`s, and gq.service.parser for their command lines) with the statuses below."""

from __future__ import annotations

import enum
import errno
import os
import sys


class ExitStatus(enum.IntEnum):
    """Exit statuses of `gq` (the DESIGN's contract, gq(1) EXIT STATUS), gqd and gqnode; gqd
    has one status a class when it refuses its database (StoreRefused), so a unit or a script
    can tell them apart."""

    OK = 0
    #: The head refused the request; the reason is on stderr.
    REFUSED = 1
    #: Any error of a Slurm command (sbatch, squeue ...: gq/slurm/), bad options too: Slurm's
    #: commands exit 1 for all of them, and scripts written for Slurm test for that.
    SLURM_ERROR = 1
    #: `gq wait` and `--wait`: the job ended without an exit status of its own (cancelled, its
    #: node failed); otherwise those end with the job's own status.
    JOB_NO_STATUS = 1
    #: gqd, gqnode, gq relay or gq api could not start; the reason is logged (gqd(8) ...).
    START_FAILED = 1
    #: gqd stopped at once on a second stop signal, not waiting for submits in the works.
    STOPPED_AT_ONCE = 1
    #: Bad flags or values on the command line, or a bad configuration file.
    USAGE = 2
    #: The head cannot be reached.
    UNREACHABLE = 3
    #: Interrupted (Ctrl-C): 128 + SIGINT, as a shell reports it.
    INTERRUPTED = 130
    #: Standard output was closed before all of it was written (`gq queue | head -1`): the
    #: command stops there, silently, with 128 + SIGPIPE, the status a shell reports for a
    #: tool that SIGPIPE ends (cat, ls, Slurm's squeue: Python ignores SIGPIPE, so gq exits
    #: with it), from every command: gq's fast path and typer's, and the Slurm commands. Not 1,
    #: so that a script can tell "my reader stopped reading" from "the head said no".
    BROKEN_PIPE = 141
    #: gqd's database is missing, though its mark says a cluster ran here.
    STORE_MISSING = 10
    #: gqd's database is an empty (0-byte) file.
    STORE_EMPTY = 11
    #: gqd's database is shorter than its own header says.
    STORE_TRUNCATED = 12
    #: gqd's database fails SQLite's integrity check, or is not a gq database at all.
    STORE_CORRUPT = 13
    #: gqd's database holds less than gqd acknowledged (a lost WAL, an old copy put back).
    STORE_BEHIND = 14
    #: gqd's database has a newer schema than this gq knows.
    STORE_NEWER = 15


class GqError(Exception):
    """Base of every error gq raises on purpose."""

    exit_status = ExitStatus.REFUSED
    #: Short machine-readable code carried in error replies.
    code = "error"


class UsageError(GqError):
    """A value given by the user cannot be parsed or is out of range."""

    exit_status = ExitStatus.USAGE
    code = "usage"


class TooLarge(UsageError):
    """A request body, or a list in it, over gq api's limits (HTTP 413)."""

    code = "too_large"


class RefusedError(GqError):
    """The head understood the request and said no."""

    code = "refused"


class NotFoundError(RefusedError):
    code = "not_found"


class PermissionDenied(RefusedError):
    code = "permission_denied"


class Unauthenticated(PermissionDenied):
    """No valid credential: a missing, unknown, revoked or expired API token (HTTP 401)."""

    code = "unauthenticated"


class GoneError(RefusedError):
    """What was asked for is no longer kept: events pruned past their retention (HTTP 410)."""

    code = "gone"


class RateLimited(RefusedError):
    """Too many requests for a token's rate limit in gq api; try again later (HTTP 429)."""

    code = "rate_limited"


class StoreError(RefusedError):
    """The store could not commit (disk full, I/O error); nothing was accepted."""

    code = "store"


class StoreRefused(GqError):
    """gqd will not open its database (see the subclasses); it wrote nothing to it."""

    code = "store_refused"


class StoreMissing(StoreRefused):
    exit_status = ExitStatus.STORE_MISSING


class StoreEmpty(StoreRefused):
    exit_status = ExitStatus.STORE_EMPTY


class StoreTruncated(StoreRefused):
    exit_status = ExitStatus.STORE_TRUNCATED


class StoreCorrupt(StoreRefused):
    exit_status = ExitStatus.STORE_CORRUPT


class StoreBehind(StoreRefused):
    exit_status = ExitStatus.STORE_BEHIND


class StoreNewer(StoreRefused):
    exit_status = ExitStatus.STORE_NEWER


class ProtocolError(GqError):
    """A message that is not valid gq protocol."""

    code = "protocol"


class UnreachableError(GqError):
    """No head answered in time."""

    exit_status = ExitStatus.UNREACHABLE
    code = "unreachable"


class ConfigError(GqError):
    """The configuration file is wrong; the message names the key and the file."""

    exit_status = ExitStatus.USAGE
    code = "config"


#: Error replies carry `code`; the client turns them back into these classes.
ERRORS_BY_CODE = {cls.code: cls for cls in (GqError, UsageError, RefusedError, NotFoundError,
                                             PermissionDenied, StoreError, ProtocolError,
                                             UnreachableError, Unauthenticated, GoneError,
                                             RateLimited, TooLarge)}


def exit_status(exc: BaseException, *, slurm: bool = False) -> ExitStatus | None:
    """The exit status a command ends with when `exc` stops it (`slurm`: a Slurm command, for
    which every error of gq's is SLURM_ERROR); None for an exception that is no error of gq's
    to report (a bug: its traceback is shown)."""
    if isinstance(exc, GqError):
        return ExitStatus.SLURM_ERROR if slurm else exc.exit_status
    if isinstance(exc, KeyboardInterrupt):
        return ExitStatus.INTERRUPTED
    if isinstance(exc, BrokenPipeError) or (isinstance(exc, OSError) and exc.errno == errno.EPIPE):
        return ExitStatus.BROKEN_PIPE
    return None


def start_status(exc: BaseException) -> int:
    """The exit status of a daemon (gqd, gqnode, gq relay, gq api) that `exc` kept from
    starting: a refused database's own (StoreRefused: a restart would find it the same, so the
    unit does not restart on these), else START_FAILED."""
    return int(exc.exit_status if isinstance(exc, StoreRefused) else ExitStatus.START_FAILED)


def end(exc: BaseException, prefix: str, *, slurm: bool = False) -> int:
    """The exit status of a command that `exc` stopped (a Slurm command's with `slurm`), gq's
    error shown as one line on stderr after `prefix`, a closed pipe silently. What is no
    error of gq's (a bug) is raised again for its traceback; gq's own too with GQ_TRACEBACK
    set. Called while `exc` is being handled."""
    status = exit_status(exc, slurm=slurm)
    if status is None or (isinstance(exc, GqError) and os.environ.get("GQ_TRACEBACK")):
        raise exc
    if isinstance(exc, GqError):
        print(f"{prefix}{exc}", file=sys.stderr)
    elif status is ExitStatus.BROKEN_PIPE:  # `gq queue | head`: stop, silently
        _drop_stdout()
    return int(status)


def _drop_stdout() -> None:
    """Send what is left of standard output to /dev/null, so the interpreter's last flush of
    the closed pipe cannot complain either."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no file (a test's capture): nothing to redirect
        pass
    finally:
        os.close(devnull)
