"""The verifier itself: it passes a correct kernel, catches a wrong or crashing one, and its tolerance
rule is numpy's allclose. Uses the real RMSNorm kernel (the fastest to interpret)."""

from __future__ import annotations

import dataclasses
import xml.etree.ElementTree as ET

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tpudiag.kernels import rmsnorm
from tpudiag.kernels.spec import Tolerance
from tpudiag.analyze.numerics import tolerance_check
from tpudiag.results.kernels import VERIFY_SCHEMA
from tpudiag.parity.kernel_cases import verify_spec
from tpudiag.report.kernels_render import render_junit

FIRST = dataclasses.replace(rmsnorm.SPEC, cases=lambda: rmsnorm.SPEC.cases()[:1])


def test_a_correct_kernel_passes_every_check():
    res = verify_spec(FIRST)
    assert res.ok, res.summary()
    (case,) = res.cases
    whats = [c.what for c in case.checks]
    # RMSNorm returns (normed, new residual): the three comparisons of each output, then the gradients'.
    assert whats[:6] == [f"[{n}] {w}" for n in (0, 1) for w in ("kernel vs reference", "kernel vs float64",
                                                                "reference vs float64")]
    assert any(w.startswith("grad[") for w in whats) == FIRST.cases()[0].grad
    doc = res.to_dict()
    assert doc["schema"] == VERIFY_SCHEMA and doc["passed"] == 1 and doc["failed"] == 0


def _perturbed(scale):
    def kernel(*args, **kw):
        out = rmsnorm.SPEC.kernel(*args, **kw)
        leaves, tree = jax.tree_util.tree_flatten(out)
        leaves[0] = leaves[0] * jnp.asarray(scale, leaves[0].dtype)
        return jax.tree_util.tree_unflatten(tree, leaves)
    return dataclasses.replace(FIRST, kernel=kernel)


def test_a_kernel_off_by_one_percent_fails_with_the_worst_element():
    res = verify_spec(_perturbed(1.01), seed=3)
    assert not res.ok
    (case,) = res.failures
    bad = [c for c in case.checks if not c.ok]
    assert {c.what for c in bad} >= {"[0] kernel vs reference", "[0] kernel vs float64"}
    assert all(c.worst_ratio > 1 and "worst at" in c.detail for c in bad)
    assert "FAIL rmsnorm" in res.summary() and "seed 3" in res.summary()


def test_a_kernel_that_raises_is_a_failed_case_not_a_crash():
    def kernel(*args, **kw):
        raise RuntimeError("Mosaic said no")
    res = verify_spec(dataclasses.replace(FIRST, kernel=kernel))
    (case,) = res.failures
    assert case.error.startswith("RuntimeError: Mosaic said no") and not case.ok


def test_the_same_seed_gives_the_same_inputs():
    a, b = verify_spec(FIRST, seed=11), verify_spec(FIRST, seed=11)
    assert [c.max_abs_err for c in a.cases[0].checks] == [c.max_abs_err for c in b.cases[0].checks]


@pytest.mark.parametrize("seed", range(5))
def test_the_tolerance_rule_is_numpys_allclose(seed):
    rng = np.random.default_rng(seed)
    want = rng.normal(size=(64,)) * 10
    got = want + rng.normal(size=(64,)) * 10 ** rng.uniform(-4, -1)
    tol = Tolerance(atol=1e-3, rtol=1e-3, reason="test")
    assert tolerance_check("x", got, want, tol.atol, tol.rtol).ok == np.allclose(got, want, rtol=1e-3, atol=1e-3)


def test_mismatches_of_shape_finiteness_and_integers_are_named():
    def check(got, want, exact=False):
        return tolerance_check("x", np.asarray(got), np.asarray(want), 1e-3, 1e-3, exact=exact)

    assert "shape (2,)" in check(np.ones(2), np.ones(3)).detail
    assert "non-finite" in check([1.0, np.nan], [1.0, 2.0]).detail
    bad = check([1, 2, 3], [1, 2, 4], exact=True)
    assert not bad.ok and "1 of 3 differ" in bad.detail and bad.worst_ratio is None


def test_a_kernel_returning_another_number_of_outputs_fails_by_name():
    def kernel(*args, **kw):
        return rmsnorm.SPEC.kernel(*args, **kw)[0]  # drops the residual output
    res = verify_spec(dataclasses.replace(FIRST, kernel=kernel))
    (case,) = res.failures
    assert "1 outputs, expected 2" in case.why


def test_junit_has_one_testcase_per_case_and_the_failure_text():
    good, bad = verify_spec(FIRST, seed=5), verify_spec(_perturbed(1.05), seed=5)
    both = dataclasses.replace(bad, cases=good.cases + bad.cases)
    assert (both.passed, len(both.failures)) == (1, 1)
    root = ET.fromstring(render_junit(both))
    cases = root.findall(".//testcase")
    assert len(cases) == 2 and root.get("failures") == "1"
    assert cases[0].find("failure") is None and "kernel vs reference" in cases[1].find("failure").get("message")
