"""The one error hierarchy of gq; the CLI maps each class to an exit status in one place."""

from __future__ import annotations

import enum


class ExitStatus(enum.IntEnum):
    """Exit codes of the `gq` CLI (the DESIGN's contract)."""

    OK = 0
    #: The head refused the request; the reason is on stderr.
    REFUSED = 1
    #: Bad flags or values on the command line.
    USAGE = 2
    #: The head cannot be reached.
    UNREACHABLE = 3


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
