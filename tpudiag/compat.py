"""Which jax, jaxlib and libtpu combinations tpudiag runs on, decided from package metadata.

Reads the installed versions and jax's own requirements (`importlib.metadata`, no jax import, so
the check costs milliseconds and runs before a program or a compiler is started). Returns a
`VersionCheck`: `refusals` are combinations known to crash or not to import, `warnings` are
combinations nobody has tested. It does not install or change anything; each message carries the
`pip install` line that fixes it.

The rule for libtpu comes from jax itself: `jax[tpu]` pins the libtpu built for that jax
(`libtpu==0.0.42.*` for jax 0.10.2, `libtpu==0.0.50.*` for 0.12.0.1), so the installed libtpu is
held to the specifier in jax's metadata rather than to a table kept here.
"""

from __future__ import annotations

import importlib.metadata as md
import os
from dataclasses import dataclass, field

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

# The oldest jax tpudiag supports, and the newest release series it is tested on (README).
OLDEST_JAX = Version("0.10.2")
NEWEST_TESTED_SERIES = (0, 12)
TESTED_RANGE = "0.10.2 to 0.12.x"
# Below this jax, a libtpu newer than the one jax[tpu] pins crashes the profiler at start
# (segfault in PluginTracer::Start; seen with jax 0.10.2 and libtpu 0.0.51).
PROFILER_ABI_FIXED_IN = Version("0.11")
# Set to 1 to turn a refusal into a warning (at your own risk: the refusals are known crashes).
OVERRIDE_ENV = "TPUDIAG_IGNORE_VERSION_CHECK"


@dataclass(frozen=True)
class VersionCheck:
    jax: str | None
    jaxlib: str | None
    libtpu: str | None
    refusals: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.refusals


def _version(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _requirement(requires: list[str], name: str, extra: str | None) -> Requirement | None:
    """The requirement on `name` in jax's metadata: the plain one (extra None) or the one under `extra`."""
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.name.lower() != name:
            continue
        marker = str(req.marker) if req.marker else ""
        if (extra is None and not marker) or (extra is not None and f'extra == "{extra}"' in marker):
            return req
    return None


def assess(jax: str | None, jaxlib: str | None, libtpu: str | None, jax_requires: list[str]) -> VersionCheck:
    """Decide on one combination. `jax_requires` is jax's `Requires-Dist` list (its metadata)."""
    refusals: list[str] = []
    warnings: list[str] = []
    jv = _version(jax)
    if jv is None:
        refusals.append("jax is not installed in this environment: pip install 'tpudiag[tpu]' "
                        "(or pip install jax on a machine without a TPU)")
        return VersionCheck(jax, jaxlib, libtpu, tuple(refusals), ())
    if jv < OLDEST_JAX:
        refusals.append(f"jax {jax} is older than tpudiag supports ({TESTED_RANGE}): "
                        f"pip install 'jax[tpu]>={OLDEST_JAX}'")
    elif jv.release[:2] > NEWEST_TESTED_SERIES:
        warnings.append(f"jax {jax} is newer than tpudiag is tested with ({TESTED_RANGE}); "
                        "reports may miss what its XLA writes differently")
    needs_jaxlib = _requirement(jax_requires, "jaxlib", None)
    if jaxlib is None:
        refusals.append(f"jaxlib is not installed; jax {jax} needs it: pip install 'jaxlib=={jax}'")
    elif needs_jaxlib is not None and _version(jaxlib) not in needs_jaxlib.specifier:
        refusals.append(f"jaxlib {jaxlib} does not match jax {jax} (jax needs jaxlib{needs_jaxlib.specifier}) "
                        f"and will not import: pip install 'jaxlib=={jax}'")
    needs_libtpu = _requirement(jax_requires, "libtpu", "tpu")
    lv = _version(libtpu)
    if lv is not None and needs_libtpu is not None and lv not in needs_libtpu.specifier:
        fix = f"pip install 'jax[tpu]=={jax}'"
        built_for = f"jax {jax} is built for libtpu{needs_libtpu.specifier}"
        if jv < PROFILER_ABI_FIXED_IN and all(lv > Version(s.version.rstrip(".*")) for s in needs_libtpu.specifier):
            refusals.append(f"jax {jax}, jaxlib {jaxlib} and libtpu {libtpu} do not work together: this libtpu "
                            f"crashes jax {jax}'s profiler (segfault in PluginTracer::Start); {built_for}: {fix}")
        else:
            warnings.append(f"libtpu {libtpu} is not the one jax {jax} is tested with ({built_for}); "
                            f"if the profiler or a TPU compile crashes: {fix}")
    return VersionCheck(jax, jaxlib, libtpu, tuple(refusals), tuple(warnings))


def installed_versions() -> dict[str, str | None]:
    """jax, jaxlib, libtpu and xprof as installed (None: not installed)."""
    from tpudiag.capture.versions import tool_versions

    found = tool_versions()
    return {name: found[name] for name in ("jax", "jaxlib", "libtpu", "xprof")}


def check_installed() -> VersionCheck:
    """`assess` on what this Python environment holds."""
    v = installed_versions()
    try:
        requires = md.requires("jax") or []
    except md.PackageNotFoundError:
        requires = []
    check = assess(v["jax"], v["jaxlib"], v["libtpu"], requires)
    if check.refusals and os.environ.get(OVERRIDE_ENV) == "1":
        return VersionCheck(check.jax, check.jaxlib, check.libtpu, (),
                            check.warnings + tuple(f"{r} ({OVERRIDE_ENV}=1: going on anyway)" for r in check.refusals))
    return check
