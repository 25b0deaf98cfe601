"""How a typed message comes from its declaration (gq/messages.py declares them): a frozen
dataclass's annotations give each field's wire types (int, float: an int too, str, bool;
tuple[X, ...] a list, dict a map, a declared record a map; `X | None` also None), a field
without a default is required, and `declare` adds the rules for what container fields hold.
From that come the schema gq.protocol checks a map against (SCHEMA, RULES), the wire form
(`wire`) and the reading of a checked map (`from_wire`), and for each message type a reader
that checks and reads a map in one pass (READERS).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar, TypeVar, Union

from gq import schema as s

_M = TypeVar("_M", bound="Message")
_R = TypeVar("_R")
#: A value to its wire form, or back; None: it is its own.
_Convert = Union[Callable[[Any], Any], None]
#: A declared type's fields: (name, required, to the wire, from it), in declaration order.
_Table = tuple[tuple[str, bool, _Convert, _Convert], ...]
_TABLES: dict[type, _Table] = {}
_READERS: dict[type, Callable[[dict[str, Any]], Any]] = {}
#: Message type name -> its reader of an unchecked map (the envelope aside): checks and reads
#: in one pass, raising ProtocolError as gq.schema.check would (`checking_reader`).
READERS: dict[str, Callable[[dict[str, Any]], Any]] = {}
_SCALARS: dict[Any, tuple[type, ...]] = {int: s.INT, float: s.NUM, str: s.STR, bool: s.BOOL}


class Message:
    """A message type; its fields are its dataclass's."""

    __slots__ = ()
    TYPE: ClassVar[str]
    SCHEMA: ClassVar[s.Schema]
    RULES: ClassVar[s.Rules]

    def wire(self) -> dict[str, Any]:
        """The fields as they go on the wire; an optional field holding None is left out
        (absent reads as None)."""
        return _to_wire(self)

    @classmethod
    def from_wire(cls: type[_M], msg: dict[str, Any]) -> _M:
        """The message of a map that passed SCHEMA and RULES (fields it does not declare, a
        newer peer's, are not read)."""
        return _from_wire(cls, msg)


def _to_wire(obj: Any) -> dict[str, Any]:
    out = {}
    for name, required, to_wire, _ in _TABLES[type(obj)]:
        value = getattr(obj, name)
        if value is None and not required:
            continue
        out[name] = value if to_wire is None else to_wire(value)
    return out


def _from_wire(cls: type[_R], msg: dict[str, Any]) -> _R:
    return _READERS[cls](msg)


def _reader(cls: type, table: _Table) -> Callable[[dict[str, Any]], Any]:
    """A function making a `cls` of its checked wire form (from_wire), generated: it sets each
    slot directly, where the frozen dataclass's __init__ sets each field through
    object.__setattr__, at twice the cost (a class without slots, gq.model's, gets its fields
    as keyword arguments). A required field is there (the schema said so), an absent one
    takes its default."""
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    slots = all(isinstance(getattr(cls, name, None), types.MemberDescriptorType)
                for name, *_ in table)
    lines = ["def read(msg):", "    obj = _new(_cls)" if slots else "    kw = {}"]
    defaults = {f.name: f for f in dataclasses.fields(cls)}
    for i, (name, required, _, from_wire) in enumerate(table):
        f = defaults[name]
        if required:
            value = f"msg[{name!r}]"
        else:
            lines.append(f"    v = msg[{name!r}] if {name!r} in msg else {_absent(f, i, env)}")
            value = "v"
        if from_wire is not None:
            env[f"_conv{i}"] = from_wire
            value = f"(None if {value} is None else _conv{i}({value}))" if not required \
                else f"_conv{i}({value})"
        if slots:
            env[f"_set{i}"] = getattr(cls, name).__set__  # the slot's own setter
            lines.append(f"    _set{i}(obj, {value})")
        else:
            lines.append(f"    kw[{name!r}] = {value}")
    lines.append("    return obj" if slots else "    return _cls(**kw)")
    exec("\n".join(lines), env)  # noqa: S102 (our own declarations only)
    return env["read"]


def _absent(f: dataclasses.Field[Any], i: int, env: dict[str, Any]) -> str:
    """The expression of field `f`'s default, for generated code (of field number `i`)."""
    if f.default_factory is not dataclasses.MISSING:
        env[f"_factory{i}"] = f.default_factory
        return f"_factory{i}()"
    env[f"_default{i}"] = f.default
    return f"_default{i}"


def _form(hint: Any) -> tuple[tuple[type, ...], _Convert, _Convert]:
    """A field's wire types, and its conversions to and from the wire, from its annotation:
    int, float (an int too), str, bool; tuple[X, ...] a list (of declared records, of pairs);
    dict[...] a map; a declared record a map; `X | None` also None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    none: tuple[type, ...] = ()
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == len(args) - 1:
            none = (type(None),)
        if all(a in _SCALARS for a in rest) and len(rest) > 1:  # a job reference: int | str
            return tuple(t for a in rest for t in _SCALARS[a]) + none, None, None
        if len(rest) != 1:
            raise TypeError(f"no wire form for {hint!r}")
        hint = rest[0]
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint in _SCALARS:
        return _SCALARS[hint] + none, None, None
    if origin is dict:
        return s.DICT + none, None, None
    if isinstance(hint, type) and hint in _TABLES:
        return s.DICT + none, _to_wire, partial(_from_wire, hint)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = args[0]
        if isinstance(item, type) and item in _TABLES:
            return (s.LIST + none, lambda v: [_to_wire(i) for i in v],
                    lambda v: tuple(_from_wire(item, i) for i in v))
        if typing.get_origin(item) is tuple:  # pairs: lists on the wire
            return s.LIST + none, None, lambda v: tuple(map(tuple, v))
        return s.LIST + none, None, tuple
    raise TypeError(f"no wire form for {hint!r}")


def declare(cls: type[_R], **rules: s.Rule) -> type[_R]:
    """Derive a dataclass's wire table (and, for a Message, its SCHEMA and RULES)."""
    hints = typing.get_type_hints(cls)
    table, schema = [], {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        types_, to_wire, from_wire = _form(hints[f.name])
        if f.metadata.get(_UNSET):  # None only when absent: not on the wire
            types_ = tuple(t for t in types_ if t is not type(None))
        required = f.default is dataclasses.MISSING and \
            f.default_factory is dataclasses.MISSING
        table.append((f.name, required, to_wire, from_wire))
        schema[f.name] = (types_, required)
    unknown = set(rules) - set(schema)
    if unknown:
        raise TypeError(f"{cls.__name__}: rules for fields it does not have: {unknown}")
    _TABLES[cls] = tuple(table)
    _READERS[cls] = _reader(cls, _TABLES[cls])
    if issubclass(cls, Message):
        cls.SCHEMA, cls.RULES = schema, rules
        READERS[cls.TYPE] = checking_reader(cls)
    return cls


def schema_of(cls: type) -> s.Schema:
    """The schema of a declared record (a message's: its SCHEMA)."""
    unset = {f.name for f in dataclasses.fields(cls) if f.metadata.get(_UNSET)}
    out = {}
    for name, required, _, _ in _TABLES[cls]:
        types_ = _form(typing.get_type_hints(cls)[name])[0]
        if name in unset:
            types_ = tuple(t for t in types_ if t is not type(None))
        out[name] = (types_, required)
    return out


_UNSET = "gq.declare.unset"


def unset() -> Any:
    """The default of an optional field (`X | None = unset()`) that is None when the peer left
    it out but may not be None on the wire: the field of a request that, given, changes
    something (`gq update --qos`), where None is no value."""
    return dataclasses.field(default=None, metadata={_UNSET: True})



class _Slow(Exception):
    """A field the fast test does not pass: gq.schema.check says what is wrong, if anything."""


def _test(name: str, types_: tuple[type, ...], i: int, env: dict[str, Any]) -> str | None:
    """A Python expression true of a value `v` of field `name` only if gq.schema.check would
    take it (its type, range, length, NUL, item count; the field's rule comes after); None
    where there is no such quick test (then the type is checked the slow way)."""
    if name == "script" and str in types_:
        return None  # the one string that may hold a NUL: left to check
    parts = []
    if str in types_:
        env[f"_len{i}"] = s.LENGTHS.get(name, s.MAX_STR)
        parts.append(f'(type(v) is str and len(v) <= _len{i} and "\\0" not in v)')
    if int in types_:
        env[f"_lo{i}"], env[f"_hi{i}"] = s.RANGES.get(name, s.ANY_INT)
        parts.append(f"(type(v) is int and _lo{i} <= v <= _hi{i})")
    if float in types_:
        env[f"_flo{i}"], env[f"_fhi{i}"] = s.RANGES.get(name, s.ANY_FLOAT)
        parts.append(f"(type(v) is float and _flo{i} <= v <= _fhi{i} and _isfinite(v))")
    if bool in types_:
        parts.append("type(v) is bool")
    if list in types_:
        env[f"_count{i}"] = s.COUNTS.get(name, s.MAX_LIST)
        parts.append(f"(type(v) is list and len(v) <= _count{i})")
    if dict in types_:
        parts.append("type(v) is dict")
    if type(None) in types_:
        parts.append("v is None")
    if not parts or set(types_) - {str, int, float, bool, list, dict, type(None)}:
        return None
    return " or ".join(parts)


def checking_reader(cls: type[Message]) -> Callable[[dict[str, Any]], Any]:
    """A function checking a map against the message type's SCHEMA and RULES and making the
    message of it, in one pass: gqd reads every report and heartbeat this way, and checking
    first (gq.schema.check) and then reading (from_wire) cost a report's decoding a quarter
    more than the maps did. The quick tests take only what check takes; a field failing one
    sends the map to check itself (the same words for what is wrong) and then to from_wire.
    A rule (what a list or map holds) raises as it would in check: the fields before it were
    good."""
    kind, schema, rules = cls.TYPE, cls.SCHEMA, cls.RULES
    plain = _READERS[cls]

    def slow(msg: dict[str, Any]) -> Any:
        s.check(msg, schema, kind, rules or None)
        return plain(msg)

    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_Slow": _Slow, "_slow": slow,
                           "_isfinite": math.isfinite}
    defaults = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    lines = ["def read(msg):", "  try:", "    obj = _new(_cls)"]
    for i, (name, required, _, from_wire) in enumerate(_TABLES[cls]):
        types_, _ = schema[name]
        test = _test(name, types_, i, env)
        rule = rules.get(name)
        if test is None or (rule is not None and not set(types_) <= {list, dict, type(None)}):
            return slow  # a field with no quick test: no quick reader either
        env[f"_set{i}"] = getattr(cls, name).__set__
        lines += [f"    if {name!r} in msg:", f"      v = msg[{name!r}]",
                  f"      if not ({test}): raise _Slow"]
        if rule is not None:
            env[f"_rule{i}"] = rule
            lines.append(f"      if v is not None: _rule{i}({name!r}, v, {kind!r})")
        if from_wire is not None:
            env[f"_conv{i}"] = from_wire
            lines.append(f"      if v is not None: v = _conv{i}(v)")
        f = defaults[name]
        # missing: check says so
        lines.append("    else: raise _Slow" if required else f"    else: v = {_absent(f, i, env)}")
        lines.append(f"    _set{i}(obj, v)")
    lines += ["    return obj", "  except _Slow:", "    return _slow(msg)"]
    exec("\n".join(lines), env)  # noqa: S102 (our own declarations only)
    return env["read"]
