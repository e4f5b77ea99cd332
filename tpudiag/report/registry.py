"""The one table of renderers: (schema kind, format) -> the function that renders it.

Reads nothing. A renderer module registers each of its renderers with `@renders(kind, fmt)`, where
`kind` is a document's schema without its version (`tpudiag.compile` for `tpudiag.compile/1`) and
`fmt` one of `FORMATS`; `renderer(result, fmt)` returns the function, and `render(result, fmt)` the
text. A result is a model with `schema` and `to_dict()`, or a plain document with a "schema" key.

Calling conventions: a `terminal` renderer takes (result, console, **options) and prints on the
console; every other format takes (result, **options) and returns the text, which ends in a
newline. `options` are a command's (`top=`, `top_compiles=`, `unchanged=`, `show_all=`,
`timeline_rows=`); a renderer that shares a command with another takes `**_` for the ones not its own.
JSON is every result's: `json_report.render_json`, the document exactly as `report.json` holds it.

The renderer modules are imported at the first lookup of a format other than JSON, not before:
they pull rich, and `tpudiag --help` imports none of this. It does not write files (api/ does) and
does not choose a format (the command line does).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from tpudiag.errors import UsageError

FORMATS = ("terminal", "md", "json", "html", "junit")
# How an error message names a format.
_FORMAT_NAMES = {"terminal": "terminal", "md": "Markdown", "json": "JSON", "html": "HTML", "junit": "JUnit"}

_TABLE: dict[tuple[str, str], Callable] = {}
_loaded = False


def renders(kinds: str | tuple[str, ...], fmt: str):
    """Decorator: register the function as the `fmt` renderer of each schema kind in `kinds`."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")

    def register(fn: Callable) -> Callable:
        for kind in (kinds,) if isinstance(kinds, str) else kinds:
            if (kind, fmt) in _TABLE and _TABLE[kind, fmt] is not fn:
                raise ValueError(f"two {fmt} renderers for {kind}: {_TABLE[kind, fmt].__qualname__} "
                                 f"and {fn.__qualname__}")
            _TABLE[kind, fmt] = fn
        return fn
    return register


def _load() -> None:
    """Import every module of this package once, so each registers its renderers."""
    global _loaded
    if _loaded:
        return
    package = importlib.import_module("tpudiag.report")
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"tpudiag.report.{info.name}")
    _loaded = True


def schema_of(result) -> str:
    """The schema string of a model or a document (a result without a `schema` field has it in
    its `to_dict()`)."""
    if isinstance(result, dict):
        return result["schema"]
    return getattr(result, "schema", None) or result.to_dict()["schema"]


def kind_of(schema: str) -> str:
    """`tpudiag.compile/1` -> `tpudiag.compile`."""
    return schema.split("/", 1)[0]


def renderer(result, fmt: str) -> Callable:
    """The `fmt` renderer of `result` (a model or a document); a UsageError names what is missing."""
    if fmt == "json":
        from tpudiag.report.json_report import render_json

        return render_json
    _load()
    schema = schema_of(result)
    kind = kind_of(schema)
    if not any(k == kind for k, _ in _TABLE):
        raise UsageError(f"no renderer for schema {schema!r}")
    if (kind, fmt) not in _TABLE:
        raise UsageError(f"{schema} has no {_FORMAT_NAMES.get(fmt, fmt)} form")
    return _TABLE[kind, fmt]


def formats(result) -> tuple[str, ...]:
    """The formats `result` can be rendered in, JSON included."""
    _load()
    kind = kind_of(schema_of(result))
    return tuple(f for f in FORMATS if f == "json" or (kind, f) in _TABLE)


def render(result, fmt: str, **options) -> str:
    """`result` as the text of `fmt` (any format but `terminal`, which prints on a console)."""
    if fmt == "terminal":
        raise ValueError("the terminal renderer prints on a console: renderer(result, 'terminal')(result, console)")
    return renderer(result, fmt)(result, **options)
