"""The one error hierarchy of gq; the CLI maps each class to an exit status in one place."""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Exit codes of the `gq` CLI (the DESIGN's contract), and of gqd when it refuses its
    database (StoreRefused: one status a class, so a unit or a script can tell them apart)."""

    OK = 0
    #: The head refused the request; the reason is on stderr.
    REFUSED = 1
    #: Bad flags or values on the command line.
    USAGE = 2
    #: The head cannot be reached.
    UNREACHABLE = 3
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


class RefusedError(GqError):
    """The head understood the request and said no."""

    code = "refused"


class NotFoundError(RefusedError):
    code = "not_found"


class PermissionDenied(RefusedError):
    code = "permission_denied"


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
                                             PermissionDenied, StoreError, ProtocolError)}
