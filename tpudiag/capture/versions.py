"""Versions of the tools that produced a run, read from package metadata (no jax import)."""

from __future__ import annotations

import importlib.metadata as md
import platform
import sys

PACKAGES = ("jax", "jaxlib", "libtpu", "xprof", "tensorboard-plugin-profile")


def tool_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    from tpudiag.version import __version__

    out["tpudiag"] = __version__
    out["platform"] = sys.platform
    return out
