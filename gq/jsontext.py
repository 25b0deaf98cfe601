"""JSON text exactly as `json.dumps(value, indent=2)` writes it, made faster: the CLI's
`--json` documents (gq/cli/render.py) and the texts gqd keeps of each job for them
(gq/head/records.py), which a listing joins as they are. Only json's C string encoder is
imported here: the json package (its decoder, re) costs `gq show` more."""

from __future__ import annotations

try:
    from _json import encode_basestring_ascii as json_str
except ImportError:  # pragma: no cover (a Python built without the accelerator)
    from json.encoder import encode_basestring_ascii as json_str

TYPE_CHECKING = False  # typing is not imported for `gq submit` and `gq show`
if TYPE_CHECKING:
    from typing import Any


def pretty(value: Any, pad: str = "") -> str:
    """json.dumps(value, indent=2), byte for byte, at `pad`'s depth: scalars and containers
    of the usual types here, anything else by json itself."""
    kind = type(value)
    if kind is str:
        return json_str(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is dict and all(type(k) is str for k in value):
        if not value:
            return "{}"
        inner = pad + "  "
        return "{\n" + ",\n".join([f"{inner}{json_str(k)}: {pretty(v, inner)}"
                                   for k, v in value.items()]) + f"\n{pad}}}"
    if kind is list or kind is tuple:
        if not value:
            return "[]"
        return "[\n" + ",\n".join(items(value, pad + "  ")) + f"\n{pad}]"
    # Floats (NaN, Infinity), other keys: json's own text. It has no raw newline but those
    # between its lines, so indenting those puts it at this depth.
    import json  # here: the usual types above need none of it
    return json.dumps(value, indent=2).replace("\n", "\n" + pad)


def items(values: list[Any] | tuple[Any, ...], pad: str) -> list[str]:
    """A list's items at `pad`. A listing's jobs are dicts with the same keys in the same order:
    their keys' text is made once for the lot, and string values (most of them) go straight
    to json's encoder; a third of `gq queue --json`'s time was spent on the rest of `_pretty`."""
    out = []
    keys: tuple[Any, ...] = ()
    heads: list[str] | None = None
    inner = pad + "  "
    close = f"\n{pad}}}"
    for v in values:
        if type(v) is dict and v:
            if (now := tuple(v)) != keys:
                keys = now
                heads = [f"{inner}{json_str(k)}: " for k in keys] \
                    if all(type(k) is str for k in keys) else None
            if heads is not None:
                out.append(pad + "{\n" + ",\n".join([
                    head + (json_str(x) if type(x) is str else "null" if x is None
                            else int.__repr__(x) if type(x) is int else pretty(x, inner))
                    for head, x in zip(heads, v.values())])
                    + close)
                continue
        out.append(pad + pretty(v, pad))
    return out
