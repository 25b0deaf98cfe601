"""Unpacking what a peer sends, at a bounded cost: msgpack's header limits, a budget of lists and
maps, and a large frame a slice at a time.

A 16 MiB frame of empty maps unpacks into 16 million dicts: seconds of gqd's one thread, a
gigabyte of memory, and collections of the cyclic garbage collector walking all of gqd's objects
meanwhile. Here msgpack refuses, as it reads each header, a string, list or map longer than the
caller's limits; a hook counts the lists and maps built and stops the unpacking past
MAX_CONTAINERS; and `Unpacking` feeds a frame in slices, so that gqd can spread a large one over
several loop turns. Nothing here knows gq's message types: gq.protocol checks what comes out.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable

import msgpack

from gq.defaults import MAX_CONTAINERS, MAX_MESSAGE_BYTES
from gq.errors import ProtocolError

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any, TypedDict

    # A TypedDict is the type checker's; at run time Limits are a plain dict.
    class Limits(TypedDict):
        """msgpack's limits, as Unpacker's keyword arguments (typed, so a misspelt or a missing
        limit is the type checker's error, not a silently unlimited message)."""

        max_str_len: int
        max_bin_len: int
        max_array_len: int
        max_map_len: int
        max_ext_len: int


#: How far into a frame rid_of looks (gq's clients put the rid third).
RID_SCAN_BYTES = 64 * 1024
#: The first byte of any map, and a byte that starts no msgpack value at all.
_MAP_HEADERS = frozenset([*range(0x80, 0x90), 0xDE, 0xDF])
_NEVER_USED = 0xC1

_CLIP = reprlib.Repr()
_CLIP.maxstring = _CLIP.maxother = 60
_CLIP.maxlevel, _CLIP.maxlist, _CLIP.maxdict = 2, 4, 4


def clip(value: Any) -> str:
    """A short repr of a hostile value, for an error message (a field may hold 16 MiB, or
    nest a thousand deep)."""
    return _CLIP.repr(value)


class _TooMany(Exception):
    """More lists and maps than MAX_CONTAINERS: the unpacking stops."""


def _budget() -> Callable[[Any], Any]:
    """A msgpack list and object hook counting the containers built (each as it is finished);
    past MAX_CONTAINERS it stops the unpacking."""
    left = MAX_CONTAINERS

    def count(obj: Any) -> Any:
        nonlocal left
        left -= 1
        if left < 0:
            raise _TooMany
        return obj
    return count


def _undecodable(exc: Exception) -> ProtocolError:
    if isinstance(exc, _TooMany):
        return ProtocolError(f"message holds over {MAX_CONTAINERS} lists and maps")
    # msgpack raises several unrelated types for bad input
    return ProtocolError(f"undecodable message: {type(exc).__name__}: {clip(str(exc))}")


def _check_size(frame: bytes | memoryview) -> None:
    if len(frame) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(frame)} bytes is over the {MAX_MESSAGE_BYTES} limit")


def _start(frame: bytes | memoryview) -> None:
    """Refuse, before unpacking any of it, a frame over the size limit or not holding a map
    (every gq message is one)."""
    _check_size(frame)
    first = frame[0] if len(frame) else _NEVER_USED
    if first == _NEVER_USED:
        raise ProtocolError("undecodable message: empty, or starting with 0xc1")
    if first not in _MAP_HEADERS:
        raise ProtocolError("message is not a map")


def unpack(frame: bytes | memoryview, limits: Limits | None) -> Any:
    """The map in `frame`, within `limits` and MAX_CONTAINERS (None: no limits, for what the
    peer is trusted to send); or ProtocolError."""
    kwargs: dict[str, Any] = {}
    if limits is None:
        _check_size(frame)
    else:
        _start(frame)
        kwargs.update(limits)
        if len(frame) > MAX_CONTAINERS:  # a shorter frame cannot hold that many containers
            kwargs["list_hook"] = kwargs["object_hook"] = _budget()
    try:
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, **kwargs)
    except Exception as exc:
        raise _undecodable(exc) from None


class Unpacking:
    """`unpack` a slice at a time: streaming msgpack resumes where the last slice stopped, so
    the requests behind a large frame wait for one slice of it, not for all of it."""

    def __init__(self, frame: bytes | memoryview, limits: Limits) -> None:
        self.frame = frame
        self.fed = 0
        self._value: Any = None
        self._error: ProtocolError | None = None
        self._done = False
        try:
            _start(frame)
        except ProtocolError as exc:
            self._error, self._done = exc, True
        budget = _budget()
        # Its buffer sized for the whole frame at once: grown as fed, it would copy the part
        # fed so far, megabytes, whenever it doubled.
        size = max(len(frame), 1)
        self._unpacker = msgpack.Unpacker(
            raw=False, strict_map_key=True, max_buffer_size=size, read_size=size,
            list_hook=budget, object_hook=budget, **limits)

    def step(self, nbytes: int) -> bool:
        """Unpack up to `nbytes` more of the frame; True once it is whole or refused."""
        if self._done:
            return True
        self._unpacker.feed(memoryview(self.frame)[self.fed:self.fed + nbytes])
        self.fed = min(self.fed + nbytes, len(self.frame))
        try:
            self._value = self._unpacker.unpack()
            if self._unpacker.tell() != len(self.frame):
                self._error = ProtocolError("undecodable message: data after its end")
        except msgpack.OutOfData:
            if self.fed < len(self.frame):
                return False
            self._error = ProtocolError("undecodable message: it ends inside a value")
        except Exception as exc:
            self._error = _undecodable(exc)
        self._done = True
        return True

    def value(self) -> Any:
        """The unpacked map (unpacking what is left of the frame first), or ProtocolError."""
        self.step(len(self.frame))
        if self._error is not None:
            raise self._error
        return self._value


def rid_of(frame: bytes | memoryview, limits: Limits, low: int, high: int) -> int:
    """The request id (an int in [low, high]) of a possibly malformed request, so that even an
    error reply can be matched; 0 when there is none in the frame's first RID_SCAN_BYTES."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True,
                                max_buffer_size=RID_SCAN_BYTES, **limits)
    unpacker.feed(memoryview(frame)[:RID_SCAN_BYTES])
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() == "rid":
                rid = unpacker.unpack()
                return rid if type(rid) is int and low <= rid <= high else 0
            unpacker.skip()
    except Exception:  # not a map, cut short, or not msgpack: no rid to be had
        pass
    return 0
