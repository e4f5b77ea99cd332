"""Shared test set-up: the repository root, the fixture artifacts, and `--update-goldens`."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Off a TPU, every CPU compile of the tests and the processes they start (interpret-mode kernels,
# profiled programs, scripts' CPU runs) at XLA's lowest backend optimization, as JAX's own test
# suite runs: a kernel's interpret-mode verify took 45% less time (rope: 58 s to 32 s). It changes
# no HLO pass and no result the tests check; tpudiag's TPU compiler processes drop it
# (capture/tpu_compile.tpu_compiler_env), so static profiles are of the program as it compiles to
# run. Set before anything imports jax, which reads it once.
if not (list(Path("/dev").glob("accel*")) or list(Path("/dev/vfio").glob("[0-9]*"))):
    os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def _unpack_fixtures() -> None:
    """Fixture runs are tracked as `.tar.xz` archives (fixtures/packs.py): unpack the missing or stale ones."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tpudiag_fixture_packs", ROOT / "fixtures" / "packs.py")
    packs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(packs)
    packs.unpack_all()


_unpack_fixtures()
# One artifact set per end of the supported jax range, made from the same programs by
# fixtures/artifacts/regenerate.py (--jax 0.12 for the second); each has its VERSIONS.json.
ARTIFACT_SETS = {"jax-0.10": ROOT / "fixtures" / "artifacts", "jax-0.12": ROOT / "fixtures" / "artifacts-jax-0.12"}
ARTIFACTS = ARTIFACT_SETS["jax-0.10"]  # tests that need one set and do not read version-specific text
PROGRAMS = ROOT / "fixtures" / "programs"
GOLDENS = Path(__file__).resolve().parent / "goldens"  # GOLDENS / <set> / <run> / report.*
# Every captured fixture run, and the one captured from a program that raised.
RUNS = ("mlp", "decoder", "collective", "raises")
# (set, run) for tests that run on every artifact set.
SET_RUNS = [pytest.param(s, r, id=f"{s}/{r}") for s in ARTIFACT_SETS for r in RUNS]


def _series(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def set_of(path: Path) -> str:
    """The artifact set a fixture file belongs to."""
    path = Path(path).resolve()
    return next(name for name, root in ARTIFACT_SETS.items() if path.is_relative_to(root))


def set_versions(name: str) -> dict[str, str]:
    return json.loads((ARTIFACT_SETS[name] / "VERSIONS.json").read_text())


def glob_sets(*patterns: str) -> list[Path]:
    """Files matching any pattern in every artifact set, sorted set by set."""
    return [p for root in ARTIFACT_SETS.values() for p in sorted({q for pat in patterns for q in root.glob(pat)})]


def set_id(path: Path) -> str:
    """`jax-0.12/mlp/hlo/module_...`: a test id naming the set and the file."""
    return f"{set_of(path)}/{Path(path).resolve().relative_to(ARTIFACT_SETS[set_of(path)])}"


def skip_if_newer_than_this_xla(path: Path) -> None:
    """XLA's parser reads what its own and older versions print, not newer ones (jaxlib 0.10.2
    does not know jax 0.12's `%t#N` operands): such a file is checked in the newer jax's CI leg."""
    import importlib.metadata as md

    written_by = set_versions(set_of(path))["jaxlib"]
    if _series(written_by) > _series(md.version("jaxlib")):
        pytest.skip(f"written by jaxlib {written_by}; this jaxlib {md.version('jaxlib')} cannot parse it "
                    f"(checked where jax {written_by} is installed)")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Every test compiles afresh unless it asks for a compile cache of its own (tests/capture/test_compile_cache.py):
# a cached static profile would hide the timeouts and aborts other tests provoke.
os.environ.setdefault("TPUDIAG_NO_CACHE", "1")
# Terminal reports take COLUMNS as their width; goldens are made at the natural width of piped output.
os.environ.pop("COLUMNS", None)


@pytest.fixture(autouse=True)
def _no_terminal_size_in_the_environment():
    # GNU readline, once some test imports it, exports COLUMNS and LINES (80 x 24) into the C
    # environment, which os.environ does not show but every subprocess inherits.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)
    yield


def pytest_addoption(parser):
    parser.addoption("--update-goldens", action="store_true", help="rewrite golden outputs instead of comparing")


@pytest.fixture
def update_goldens(request) -> bool:
    return request.config.getoption("--update-goldens")


@pytest.fixture
def in_root(monkeypatch):
    """Run from the repository root, so fixture paths in reports are the same relative paths as in goldens."""
    monkeypatch.chdir(ROOT)
    return ROOT


def xplane_of(run: str, artifact_set: str = "jax-0.10") -> Path:
    return next((ARTIFACT_SETS[artifact_set] / run / "trace").glob("plugins/profile/*/*.xplane.pb"))


def check_golden(path: Path, actual: str, update: bool) -> None:
    if update or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        if not update:
            pytest.fail(f"golden {path} did not exist; written now, review it and rerun")
        return
    expected = path.read_text()
    assert actual == expected, f"output differs from golden {path} (rerun with --update-goldens and review the diff)"


def profile_sized_mlp(run: Path, *args: str) -> dict:
    """`tpudiag profile --json` of sized_mlp.py for 8 steps (ARGS go to the program) in a subprocess:
    the report document of a real run."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    p = subprocess.run([sys.executable, "-m", "tpudiag", "profile", "--json", "--out", str(run),
                        str(PROGRAMS / "sized_mlp.py"), "--", "--steps", "8", *args], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def run_main(args, capsys):
    """`tpudiag ARGS` in this process: (exit code, stdout, stderr)."""
    from tpudiag.cli import main

    with pytest.raises(SystemExit) as e:
        main(args)
    out, err = capsys.readouterr()
    return e.value.code, out, err


def file_tree(path: Path) -> list[str]:
    """Every path under `path`, relative and sorted: what a command left behind."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.fixture
def newest_leg():
    """Real runs and compiles of whole steps (estimate, plan) take minutes on a 2-core runner: they
    run on the newest jax leg only (CI's oldest leg prices the suggest matches, compiling their
    kernels); checked on jax 0.10.2 by hand. TPUDIAG_ALL_LEGS=1 runs them on any leg."""
    _only_on_leg(newest=True, why="whole-step compiles run on the newest jax leg only (CI time)")


@pytest.fixture
def oldest_leg():
    """A few minute-long compiles run on the oldest jax leg instead, so that CI's two legs, run side
    by side on 2 cores, take about as long as each other; checked on the newest by hand.
    TPUDIAG_ALL_LEGS=1 runs them on any leg."""
    _only_on_leg(newest=False, why="this compile runs on the oldest jax leg only (CI time)")


def _only_on_leg(newest: bool, why: str) -> None:
    """Skip, saying `why`, unless this is CI's newest jax leg (jax >= 0.11) or, with newest=False, its
    oldest; TPUDIAG_ALL_LEGS=1 runs the test on any leg."""
    import importlib.metadata as md

    major, minor = (int(x) for x in md.version("jax").split(".")[:2])
    if ((major, minor) >= (0, 11)) != newest and not os.environ.get("TPUDIAG_ALL_LEGS"):
        pytest.skip(f"{why}; TPUDIAG_ALL_LEGS=1 runs it")


# CI runs the suite twice side by side on 2 cores, once per end of the jax range. The slowest tests
# (tests/legs.txt: seconds and test id, measured on one leg by `.ci/split_legs.py`) run on one leg
# each, the slowest first on whichever leg has less so far, so each leg takes about half their time.
# A test not listed runs on both, and so does one already bound to a leg (the `oldest_leg` /
# `newest_leg` fixtures, a `skipif`, or a jax-version check in its body or its fixtures; those bound
# to a known leg count toward its load before the split), which splitting could
# otherwise skip on both. TPUDIAG_ALL_LEGS=1 runs every test on either leg.
LEGS_FILE = Path(__file__).resolve().parent / "legs.txt"
_LEG_CHECKS = ("oldest_leg", "newest_leg", "getfixturevalue", 'version("jax")', "jax.__version__", "_only_on_leg")


def _recorded_seconds() -> dict[str, float]:
    if not LEGS_FILE.is_file():
        return {}
    out = {}
    for line in LEGS_FILE.read_text().splitlines():
        seconds, _, nodeid = line.partition(" ")
        if nodeid and not line.startswith("#"):
            out[nodeid] = float(seconds)
    return out


def _bound_leg(item) -> str | None:
    """The leg a test is bound to: "oldest" or "newest" (the `oldest_leg` / `newest_leg` fixtures,
    `_only_on_leg` in the test or in one of its fixtures), "some" (a `skipif`, a jax-version check,
    `getfixturevalue`: bound, but to which leg is only known when it runs), or None: splittable."""
    import inspect

    names = set(getattr(item, "fixturenames", ()))
    if "oldest_leg" in names or "newest_leg" in names:
        return "oldest" if "oldest_leg" in names else "newest"
    if item.get_closest_marker("skipif"):
        return "some"
    sources = []
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for fn in [getattr(item, "function", None)] + [d[-1].func for d in defs.values() if d]:
        try:
            sources.append(inspect.getsource(fn))
        except (OSError, TypeError):
            return "some"
    text = "\n".join(sources)
    for leg, call in (("newest", "_only_on_leg(newest=True"), ("oldest", "_only_on_leg(newest=False")):
        if call in text:
            return leg
    return "some" if any(check in text for check in _LEG_CHECKS) else None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TPUDIAG_ALL_LEGS"):
        return
    import importlib.metadata as md

    on_newest = _series(md.version("jax")) >= (0, 11)
    seconds = _recorded_seconds()
    load = [0.0, 0.0]  # oldest, newest: the bound tests' seconds first, then the split ones'
    split = []
    for it in items:
        if it.nodeid not in seconds:
            continue
        leg = _bound_leg(it)
        if leg is None:
            split.append(it)
        elif leg != "some":
            load[leg == "newest"] += seconds[it.nodeid]
    for item in sorted(split, key=lambda it: (-seconds[it.nodeid], it.nodeid)):
        newest = load[1] < load[0]
        load[newest] += seconds[item.nodeid]
        if newest != on_newest:
            other = "newest (jax >= 0.11)" if newest else "oldest (jax 0.10)"
            item.add_marker(pytest.mark.skip(reason=f"runs on CI's {other} leg only, to halve CI's time "
                                                    "(tests/legs.txt); TPUDIAG_ALL_LEGS=1 runs it"))


def as_in_a_terminal():
    """A `preexec_fn`: SIGHUP at its default, as in a terminal session. CI and `nohup` start processes
    with it ignored, which a child inherits (and `nohup tpudiag ...` is meant to outlive a hangup)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
