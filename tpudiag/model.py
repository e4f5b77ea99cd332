"""The base of tpudiag's result models: frozen dataclasses whose fields are the JSON document's keys.

`Model.to_dict()` turns a tree of models into the JSON-safe document (nested models, tuples,
dicts, numbers, strings, None); `Model.from_dict(doc, source)` validates a document once against
the field annotations and builds the tree, raising `ParseError` naming the file and the field
(`report.json: steps.rows[2].duration_s: expected a number, got 'x'`). Fields with
`metadata={"json": False}` (DataFrames kept for renderers) are not part of the document; fields
with `metadata={"omit_none": True}` are left out of it when None (sections only some runs have),
and fields with `metadata={"present_if": "other"}` only when field `other` is not None (a group of
keys that exists together).

It does no I/O and knows no particular document.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, ClassVar, get_args, get_origin

from tpudiag.errors import ParseError

_NUMBER = (int, float)


def _plain(value: Any) -> Any:
    if isinstance(value, Model):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@cache
def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class Model:
    """Mixin for frozen dataclasses that are (parts of) a JSON document."""

    SCHEMA: ClassVar[str | None] = None  # "tpudiag.<kind>/<version>" for a whole document

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            if not f.metadata.get("json", True):
                continue
            value = getattr(self, f.name)
            if value is None and f.metadata.get("omit_none"):
                continue
            if (cond := f.metadata.get("present_if")) and getattr(self, cond) is None:
                continue
            out[f.name] = _plain(value)
        return out

    @classmethod
    def from_dict(cls, doc: Any, source: str = "<document>", where: str = ""):
        if not isinstance(doc, dict):
            raise ParseError(source, f"{where or 'document'}: expected an object, got {type(doc).__name__}")
        if cls.SCHEMA is not None and not where and doc.get("schema") != cls.SCHEMA:
            raise ParseError(source, f"schema {doc.get('schema')!r}: expected {cls.SCHEMA!r}")
        hints, values = _hints(cls), {}
        for f in dataclasses.fields(cls):
            if not f.metadata.get("json", True):
                continue
            name = f"{where}.{f.name}" if where else f.name
            if f.name not in doc:
                optional = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
                if optional:
                    continue
                raise ParseError(source, f"{name}: missing")
            values[f.name] = _convert(doc[f.name], hints[f.name], source, name)
        return cls(**values)


def _convert(value: Any, hint: Any, source: str, where: str) -> Any:
    """`value` checked against the annotation `hint` (models built, lists made tuples)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, source, where)
            except ParseError:
                continue
        raise ParseError(source, f"{where}: expected {_name(hint)}, got {_shown(value)}")
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Model):
        return hint.from_dict(value, source, where)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise ParseError(source, f"{where}: expected a list, got {_shown(value)}")
        item = args[0] if args else Any
        return tuple(_convert(v, item, source, f"{where}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise ParseError(source, f"{where}: expected an object, got {_shown(value)}")
        item = args[1] if len(args) == 2 else Any
        return {k: _convert(v, item, source, f"{where}.{k}") for k, v in value.items()}
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            raise ParseError(source, f"{where}: expected a number, got {_shown(value)}")
        return value  # an int stays an int, so the document round-trips byte for byte
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParseError(source, f"{where}: expected an integer, got {_shown(value)}")
        return value
    if hint in (str, bool):
        if not isinstance(value, hint):
            raise ParseError(source, f"{where}: expected {_name(hint)}, got {_shown(value)}")
        return value
    if hint is type(None):
        if value is not None:
            raise ParseError(source, f"{where}: expected null, got {_shown(value)}")
        return None
    raise TypeError(f"{where}: annotation {hint!r} is not one a document model may use")


def _name(hint: Any) -> str:
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false", type(None): "null"}
    if get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_name(a) for a in get_args(hint))
    return names.get(hint, getattr(hint, "__name__", str(hint)))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
