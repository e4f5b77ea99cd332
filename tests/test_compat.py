"""The jax/jaxlib/libtpu version check: the decision on real metadata of jax 0.10.2 and 0.12.0.1,
the environment it reads, and the command line refusing a known-bad combination before anything runs.

jax's `Requires-Dist` lines below are copied from the metadata of the two released wheels (the
check reads them from the installed jax at run time); the CLI tests put a real `.dist-info` of a
different libtpu first on the path of a child process, which is how pip's own metadata looks.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from tests.conftest import PROGRAMS, ROOT
from tpudiag.cli import cli
from tpudiag.compat import OVERRIDE_ENV, assess, check_installed

JAX_0_10_2 = ['jaxlib<=0.10.2,>=0.10.1', 'jaxlib==0.10.1; extra == "minimum-jaxlib"',
              'jaxlib<=0.10.2,>=0.10.2; extra == "tpu"', 'libtpu==0.0.42.*; extra == "tpu"',
              'requests; extra == "tpu"', 'jaxlib<=0.10.2,>=0.10.2; extra == "cuda"']
JAX_0_12_0_1 = ['jaxlib<=0.12.0.1,>=0.11.2', 'ml_dtypes>=0.5.0', 'jaxlib==0.11.2; extra == "minimum-jaxlib"',
                'jaxlib<=0.12.0.1,>=0.12.0.1; extra == "tpu"', 'libtpu==0.0.50.*; extra == "tpu"',
                'requests; extra == "tpu"', 'xprof; extra == "xprof"']


def test_the_tested_ends_pass():
    for jax, libtpu, requires in (("0.10.2", "0.0.42.1", JAX_0_10_2), ("0.12.0.1", "0.0.50.1", JAX_0_12_0_1)):
        check = assess(jax, jax, libtpu, requires)
        assert check.ok and not check.warnings, check
    # No libtpu (a CPU-only or GPU environment): nothing to say.
    check = assess("0.12.0.1", "0.12.0.1", None, JAX_0_12_0_1)
    assert check.ok and not check.warnings


def test_newer_libtpu_with_jax_0_10_is_refused_with_the_fix():
    check = assess("0.10.2", "0.10.2", "0.0.51", JAX_0_10_2)
    (line,) = check.refusals
    assert "jax 0.10.2, jaxlib 0.10.2 and libtpu 0.0.51" in line and "PluginTracer::Start" in line
    assert line.endswith("pip install 'jax[tpu]==0.10.2'") and "\n" not in line


def test_untested_combinations_warn_instead():
    # An older libtpu with jax 0.10.2, and any libtpu mismatch from jax 0.11 on: untested, not known bad.
    for jax, libtpu, requires in (("0.10.2", "0.0.40", JAX_0_10_2), ("0.12.0.1", "0.0.51", JAX_0_12_0_1)):
        check = assess(jax, jax, libtpu, requires)
        assert check.ok and len(check.warnings) == 1 and f"pip install 'jax[tpu]=={jax}'" in check.warnings[0]
    # A jax past the newest tested series installs and runs, with a warning.
    check = assess("0.13.0", "0.13.0", None, ['jaxlib<=0.13.0,>=0.13.0'])
    assert check.ok and "newer than tpudiag is tested with (0.10.2 to 0.12.x)" in check.warnings[0]


def test_what_jax_cannot_import_is_refused():
    (line,) = assess("0.9.2", "0.9.2", None, []).refusals
    assert "jax 0.9.2 is older than tpudiag supports" in line
    (line,) = assess("0.12.0.1", "0.10.2", None, JAX_0_12_0_1).refusals
    assert "jaxlib 0.10.2 does not match jax 0.12.0.1" in line and line.endswith("pip install 'jaxlib==0.12.0.1'")
    assert "jax is not installed" in assess(None, None, None, []).refusals[0]


def test_check_reads_this_environment():
    check = check_installed()
    assert (check.jax, check.jaxlib) == (md.version("jax"), md.version("jaxlib"))
    assert check.ok and not check.warnings, "CI runs each leg on a tested combination"


def _fake_dist(tmp_path, name: str, version: str):
    """A `.dist-info` as pip writes it, for a package version this environment does not have."""
    dist = tmp_path / "site" / f"{name}-{version}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return tmp_path / "site"


def _tpudiag(args, site, tmp_path, **env):
    environ = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]), **env)
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=300)


def test_known_bad_combination_stops_profile_before_the_program_runs(tmp_path):
    jax = md.version("jax")
    bad = "0.0.99" if md.version("jax").startswith("0.10.") else None
    if bad is None:
        pytest.skip(f"the known-bad combination is a newer libtpu with jax 0.10.x; this is jax {jax}")
    site = _fake_dist(tmp_path, "libtpu", bad)
    p = _tpudiag(["profile", "--out", "run", str(PROGRAMS / "mlp.py"), "--", "--steps", "1"], site, tmp_path)
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("tpudiag: error: jax 0.10.2, jaxlib 0.10.2 and libtpu 0.0.99")
    assert "Traceback" not in p.stderr and not (tmp_path / "run").exists(), "nothing ran, nothing was written"
    for args in (["compile", "--target", "v5e", "x.hlo"], ["kernels", "list"]):
        p = _tpudiag(args, site, tmp_path)
        assert p.returncode == 2 and "libtpu 0.0.99" in p.stderr, p.stderr
    # --version says what is wrong instead of refusing; the override lets a user go on at their own risk.
    v = _tpudiag(["--version"], site, tmp_path)
    assert v.returncode == 0 and "libtpu 0.0.99" in v.stdout and "unsupported: " in v.stdout
    o = _tpudiag(["kernels", "list", "--json"], site, tmp_path, **{OVERRIDE_ENV: "1"})
    assert o.returncode == 0 and "tpudiag: warning: " in o.stderr and "going on anyway" in o.stderr


def test_untested_libtpu_warns_and_runs(tmp_path):
    site = _fake_dist(tmp_path, "libtpu", "0.0.1")  # older than what any supported jax pins
    p = _tpudiag(["kernels", "list", "--json"], site, tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("{")
    assert p.stderr.startswith("tpudiag: warning: libtpu 0.0.1 is not the one jax") and "pip install" in p.stderr


def test_version_lists_every_tool():
    out = CliRunner().invoke(cli, ["--version"]).output.splitlines()
    names = [ln.split()[0] for ln in out]
    assert names == ["tpudiag", "python", "jax", "jaxlib", "libtpu", "xprof"]
    assert f"jax {md.version('jax')}" in out and f"jaxlib {md.version('jaxlib')}" in out
