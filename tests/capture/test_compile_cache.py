"""The compile cache, with real TPU compiles (libtpu's compile-only client): a module compiled for a
target once is copied, not compiled, the next time; the report is the same; only complete compiles
are kept; `--no-cache` and a changed target compile afresh."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ARTIFACTS, ROOT
from tpudiag.capture.compile_cache import CompileCache
from tpudiag.capture.tpu_compile import Limits, ModuleInput, compile_modules

IR = ARTIFACTS / "mlp" / "ir"


def _inputs():
    return [ModuleInput(name=p.stem, path=p, kind="mlir") for p in sorted(IR.glob("*.mlir"))[:2]]


def test_the_second_compile_comes_from_the_cache(tmp_path):
    cache = CompileCache(tmp_path / "cache")
    first = compile_modules(_inputs(), tmp_path / "a", "v5e:2x2", static_profile=False, cache=cache,
                            group_setup=False)
    assert all(m.status == "ok" and m.cached is None for m in first)
    assert len(list((tmp_path / "cache").iterdir())) == len(first)
    second = compile_modules(_inputs(), tmp_path / "b", "v5e:2x2", static_profile=False, cache=cache,
                             group_setup=False)
    assert all(m.cached for m in second) and [m.result for m in second] == [m.result for m in first]
    for a, b in zip(first, second):
        assert (b.dir / "hlo").is_dir() and sorted(p.name for p in (a.dir / "hlo").iterdir()) == \
            sorted(p.name for p in (b.dir / "hlo").iterdir())
        assert json.loads((b.dir / "module.json").read_text())["cached"] == b.cached
    # Another target is another compile.
    other = compile_modules(_inputs()[:1], tmp_path / "c", "v6e:2x2", static_profile=False, cache=cache)
    assert other[0].cached is None and other[0].status == "ok"


def test_a_dropped_static_profile_is_reused_only_under_the_same_limits(tmp_path):
    """Dropped on a 0.01 s limit: the same limit gets the same answer from the cache; a longer one
    compiles again, and its complete result replaces the entry."""
    cache = CompileCache(tmp_path / "cache")
    one = _inputs()[-1:]
    (first,) = compile_modules(one, tmp_path / "a", "v5e:2x2", static_profile=True,
                               limits=Limits(static_timeout_s=0.01), cache=cache)
    assert first.status == "ok" and first.static_profile.startswith("dropped") and first.cached is None
    (entry,) = list((tmp_path / "cache").iterdir())
    assert json.loads((entry / "limits.json").read_text())["static_timeout_s"] == 0.01
    (again,) = compile_modules(one, tmp_path / "b", "v5e:2x2", static_profile=True,
                               limits=Limits(static_timeout_s=0.01), cache=cache)
    assert again.cached == entry.name and again.static_profile == first.static_profile
    (longer,) = compile_modules(one, tmp_path / "c", "v5e:2x2", static_profile=True,
                                limits=Limits(static_timeout_s=300), cache=cache)
    assert longer.cached is None and longer.static_profile == "ok"
    assert (entry / "module.json").is_file() and not (entry / "limits.json").exists(), "the complete one replaced it"
    (last,) = compile_modules(one, tmp_path / "d", "v5e:2x2", static_profile=True,
                              limits=Limits(static_timeout_s=0.01), cache=cache)
    assert last.cached == entry.name and last.static_profile == "ok"


def test_the_cli_uses_the_cache_dir_it_is_given_and_no_cache_skips_it(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    env.pop("TPUDIAG_NO_CACHE", None)

    def compile_(out, *flags, libtpu=""):
        p = subprocess.run([sys.executable, "-m", "tpudiag", "compile", "--json", "--no-static-profile", "--target",
                            "v5e", "--out", str(tmp_path / out), *flags, str(IR)],
                           env=dict(env, LIBTPU_INIT_ARGS=libtpu), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    cold = compile_("cold", "--cache-dir", str(tmp_path / "cache"))
    warm = compile_("warm", "--cache-dir", str(tmp_path / "cache"))
    # the user's compiler flags change what is compiled: not the same cache entry
    flagged = compile_("flagged", "--cache-dir", str(tmp_path / "cache"), libtpu="--xla_tpu_scoped_vmem_limit_kib=65536")
    assert not any(json.loads(p.read_text())["cached"] for p in (tmp_path / "flagged" / "modules").glob("*/module.json"))
    assert flagged["modules"]
    fresh = compile_("fresh", "--no-cache")
    cached = [json.loads(p.read_text())["cached"] for p in sorted((tmp_path / "warm" / "modules").glob("*/module.json"))]
    assert cached and all(cached)
    assert not any(json.loads(p.read_text())["cached"] for p in (tmp_path / "fresh" / "modules").glob("*/module.json"))
    strip = lambda d: [(m["name"], m["totals"]["estimated_s"]) for m in d["modules"]]  # noqa: E731
    assert strip(cold) == strip(warm) == strip(fresh)


def test_a_dropped_static_profile_names_the_command_that_reruns_its_module(tmp_path):
    """The module whose static profile timed out says how to rerun it alone, with a longer limit."""
    from tpudiag import api
    from tpudiag.targets import resolve_target

    inputs = _inputs()
    run = tmp_path / "run"
    report = api.compile_inputs(inputs, run, resolve_target("v5e"), static_profile=True,
                                limits=Limits(static_timeout_s=0.01), group_setup=False)
    for m in report.modules:
        assert m.static_profile.startswith("dropped")
        (hint,) = [f for f in m.findings if "Rerun this module alone" in f]
        command = hint.split("with a longer limit: ", 1)[1]
        assert command.startswith("tpudiag compile --target v5e:2x2 --timeout 600 ")
        assert Path(command.rsplit(" ", 1)[1]).is_file() and command.endswith(("input.mlir", "input.hlo.txt"))
