"""`tpudiag suggest --measure` on the stored v5e runs (fixtures/tpu-v5e/sampler, a TPU profile of
transformers' top-p sampler; llama_train_xla_attention, a 12-layer training step whose attention XLA
runs): without a TPU, the one-line refusal through a real `python -m tpudiag` process and a real
chip worker; the request the worker gets for each real suggestion (the matched shapes, built again
from its JSON as the worker builds it); the chip's times beside the estimate in the document and
both renderers. Marked `tpu`: the same command on the chip, its measured rows checked (run there
with `pytest -m tpu tests/test_suggest_measure.py`)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

V5E = ROOT / "fixtures" / "tpu-v5e"
HAS_TPU = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
no_tpu_here = pytest.mark.skipif(HAS_TPU, reason="a TPU is attached: the refusal needs a machine without one")


def _tree(path) -> dict:
    return {str(p.relative_to(path)): p.stat().st_mtime_ns for p in path.rglob("*")}


@no_tpu_here
def test_measure_without_a_tpu_is_one_line_and_exit_2():
    run = V5E / "sampler"
    before = _tree(run)
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "suggest", "--measure", "--json", str(run)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == ""  # no document, not half of one
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tpudiag: error: suggest --measure: no TPU backend here (")
    assert _tree(run) == before  # the run directory is read, never written


@pytest.fixture(scope="module")
def sampler():
    from tpudiag.api.suggest import suggest_run

    requests = {}
    rep = suggest_run(V5E / "sampler", static_profile=False, requests=requests)
    return rep, requests


def test_the_worker_request_has_the_matched_shapes(sampler):
    """Each priced sampling suggestion's request carries its own shapes and parameters, the logits
    [rows, vocab] f32 and one uniform a row, and the worker's own build from the JSON agrees."""
    from tpudiag.kernels.at_shapes import from_request

    rep, requests = sampler
    rows = [r for r in rep.suggestions if r.shown and r.kernel == "sampling"]
    assert len(rows) == 2 and {r.shapes["top_k"] for r in rows} == {None, 64}
    for r in rows:
        req = requests[(r.module, r.pattern, r.ops)]
        assert req["kernel"] == "sampling" and req["shapes"] == r.shapes and req["backward"] is False
        n, v = r.shapes["rows"], r.shapes["vocab"]
        assert req["args"] == [[[n, v], "float32"], [[n], "float32"]]
        assert f"kernel compiled at {req['description']}" in r.notes  # the shapes the estimate compiled
        built = from_request(json.loads(json.dumps(req)))  # as the worker reads it
        assert not isinstance(built, str), built
        assert built.xla is not None and f"k={r.shapes['top_k']}" in built.description


def test_a_training_steps_attention_is_timed_forward_and_backward(newest_leg):
    """The scanned layers' attention (B*H 64, S 2048, D 64, its gradient among the ops): the kernel
    and its XLA twin both forward and backward, at those shapes."""
    from tpudiag.api.suggest import suggest_run
    from tpudiag.kernels.at_shapes import from_request

    requests = {}
    rep = suggest_run(V5E / "llama_train_xla_attention", static_profile=False, requests=requests)
    (r,) = [r for r in rep.suggestions if r.shown and r.kernel == "flash_attention"]
    req = requests[(r.module, r.pattern, r.ops)]
    assert r.backward and req["backward"] is True
    bh, s, d = r.shapes["batch_heads"], r.shapes["q_len"], r.shapes["head_dim"]
    assert req["args"] == [[[1, bh, s, d], "bfloat16"]] * 3 == [[[1, 64, 2048, 64], "bfloat16"]] * 3
    built = from_request(json.loads(json.dumps(req)))
    assert built.description.endswith("forward and backward") and built.xla is not None


@no_tpu_here
def test_the_chip_worker_refuses_without_a_tpu(sampler):
    """A real chip worker on this machine finds no TPU backend: one line naming why, nothing timed."""
    from tpudiag.api.suggest_chip import measure_on_chip
    from tpudiag.errors import InputError
    from tpudiag.targets import resolve_target

    _, requests = sampler
    env = os.environ.pop("JAX_PLATFORMS", None)  # the worker sets its own: tpu
    try:
        with pytest.raises(InputError) as e:
            measure_on_chip(dict(enumerate(requests.values())), resolve_target("v5e"), calls=3)
    finally:
        if env is not None:
            os.environ["JAX_PLATFORMS"] = env
    assert str(e.value).startswith("suggest --measure: no TPU backend here (") and "\n" not in str(e.value)


def test_chip_times_sit_beside_the_estimate(sampler):
    """with_chip_times on the real report: per row, the basis of each side, the gain from the chip's
    figures, a failed kernel as a row with its error; the measured object round-trips and both renderers
    show the chip's line."""
    from rich.console import Console

    from tpudiag.analyze.suggest.chip import ChipTimes, with_chip_times
    from tpudiag.report.suggest_render import render_suggest_markdown, render_suggest_terminal
    from tpudiag.results.suggest import ChipMeasure

    rep, _ = sampler
    # the candidates as the report's rows name them: with_chip_times joins them by (module, pattern, ops)
    cands = [_Cand(r) for r in rep.suggestions]
    ok, bad = [i for i, r in enumerate(rep.suggestions) if r.shown][:2]
    times = {ok: ChipTimes(kernel_us=12.5, xla_us=1500.0, shape="B8 V131072 f32"),
             bad: ChipTimes(kernel_us=None, xla_us=900.0, shape="B8 V131072 f32",
                            error="kernel: the chip worker exited -11: Segmentation fault")}
    out = with_chip_times(rep, cands, times, "TPU v5 lite", calls=10)
    m, f = out.suggestions[ok].measured, out.suggestions[bad].measured
    row = out.suggestions[ok]
    assert m.kernel_basis == "measured_on_chip" and m.xla_basis == "measured_run"  # a TPU run: its own ops
    assert m.xla_s == row.xla_s and m.kernel_s == pytest.approx(12.5e-6) and m.xla_twin_s == pytest.approx(1.5e-3)
    assert m.speedup == round(row.xla_s / 12.5e-6, 3) and m.saved_s == pytest.approx(row.xla_s - 12.5e-6)
    assert row.expected_speedup == rep.suggestions[ok].expected_speedup  # the estimate stays beside it
    assert f.kernel_s is None and f.speedup is None and "Segmentation fault" in f.error
    assert all(r.measured is None for k, r in enumerate(out.suggestions) if k not in (ok, bad))
    assert any(n.startswith("measured on the attached TPU v5 lite") for n in out.notes)
    doc = json.loads(json.dumps(out.to_dict()))
    assert doc["suggestions"][ok]["measured"]["kernel_basis"] == "measured_on_chip"
    assert ChipMeasure.from_dict(doc["suggestions"][bad]["measured"]) == f
    console = Console(width=200, record=True, color_system=None)
    render_suggest_terminal(out, console)
    text = console.export_text()
    assert "measured    on TPU v5 lite at B8 V131072 f32: XLA" in text and "Segmentation fault" in text
    md = render_suggest_markdown(out)
    assert "measured speedup |" in md and f"{m.speedup:.2f}x" in md and "| failed |" in md


class _Cand:
    """A candidate as with_chip_times reads one (build.Candidate's module, match.pattern, ops, runs,
    instances), from a report row: one run of one instance where the row says runs=1."""

    def __init__(self, r):
        from types import SimpleNamespace

        self.module, self.ops, self.runs, self.instances = r.module, r.ops, r.runs, 1
        self.match = SimpleNamespace(pattern=r.pattern)


def _measure(run: str) -> tuple[dict, str]:
    env = dict(os.environ)
    env.pop("JAX_PLATFORMS", None)  # conftest pins the test process to the CPU; the chip worker gets the TPU
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "suggest", "--measure", "--json", "--calls", "5",
                           str(V5E / run)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize("run,kernel", [("sampler", "sampling"), ("llama_train_xla_attention", "flash_attention"),
                                        ("mla_naive_decode", "mla_decode")])
@pytest.mark.tpu
@pytest.mark.skipif(not HAS_TPU, reason="needs a TPU attached to this machine (run on the chip)")
def test_measure_on_the_chip(run, kernel):
    """On a v5e: each shown suggestion's kernel and XLA twin timed at its shapes; XLA's side is the
    run's own ops (these are TPU runs); the gain is the chip's figures'."""
    doc, err = _measure(run)
    rows = [r for r in doc["suggestions"] if r["shown"] and r["kernel"] == kernel]
    assert rows and "tpudiag: chip:" in err
    for r in rows:
        m = r["measured"]
        assert m["device"].startswith("TPU") and m["kernel_basis"] == "measured_on_chip", m
        assert m["xla_basis"] == "measured_run" and m["xla_s"] == r["xla_s"], m
        assert "error" not in m and m["kernel_s"] > 0 and m["xla_twin_s"] > 0, m
        assert m["speedup"] == round(m["xla_s"] / m["kernel_s"], 3) and m["calls"] == 5
        if r["backward"]:
            assert m["shape"].endswith("forward and backward")
    assert any(n.startswith("measured on the attached TPU") for n in doc["notes"])
