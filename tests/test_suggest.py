"""`tpudiag suggest`: the pattern detectors on real optimized HLO (TPU compiles of the fixture
programs, and the CPU dumps of the stored runs), the gain from two real compiles, the snippet run
in interpret mode, and the bad inputs."""

from __future__ import annotations

import json
import math
import re

import pytest

from tests.conftest import ARTIFACT_SETS, PROGRAMS, _only_on_leg
from tpudiag.capture import rundir
from tpudiag.analyze.suggest.detectors import BY_NAME, find_patterns
from tpudiag.analyze.suggest.detectors.cross_entropy import CrossEntropyShapes
from tpudiag.analyze.suggest.detectors.act_quant import W8A8Shapes
from tpudiag.analyze.suggest.detectors.dequant import DequantShapes
from tpudiag.analyze.suggest.detectors.moe import DenseDispatchShapes
from tpudiag.analyze.suggest.detectors.norms import NormShapes
from tpudiag.analyze.suggest.detectors.sampling import SamplingShapes
from tpudiag.errors import InputError
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file

# What each fixture program is written to contain, and nothing else.
EXPECTED = {
    "qwen_block": {"attention", "rmsnorm", "rope"},
    "qwen_layers": {"attention", "rmsnorm", "rope"},  # the block's forward, four layers under lax.scan
    "decode_step": {"attention_decode"},
    "serving_decode": {"attention_decode", "w8a8_matmul"},  # keys through a page table, a w8a8 projection
    # a serving loop's step: the new keys written into their pages, then read; w8a8; a routed MoE
    "serving_step": {"attention_decode", "w8a8_matmul", "moe"},
    "mla_naive_decode": {"latent_attention"},  # DeepSeek's MLA, its keys and values up-projected every step
    "lm_head": {"cross_entropy"},
    "sampler": {"sampling"},
    "int8_layer": {"dequant_matmul"},
    "int4_layer": {"dequant_matmul"},  # its 4-bit form: int4_matmul, at the groups it reads
    "w8a8_layer": {"w8a8_matmul"},
    "fp8_layer": {"dequant_matmul", "w8a8_matmul"},  # e4m3 weights: weight-only, and activations quantized too
    "moe_layer": {"moe"},
    "moe_train": {"moe"},  # its training step: the gradient's matmuls are the pattern's ops too
    "bf16_attention": {"attention"},  # found, and XLA's own kernel already replaced it
    "mlp": set(),
    "layout_waste": set(),
}
# Their compile runs (fixtures/artifacts/regenerate.py's SUGGEST).
SUGGEST_RUNS = ARTIFACT_SETS["jax-0.10"] / "suggest"


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """Each fixture program compiled for v5e (no static profile: the detectors read the HLO), as
    fixtures/artifacts/regenerate.py stores it (`suggest/NAME`: jax 0.10.2 and its libtpu), copied so
    that `suggest` may write its outputs into the run. Read on the oldest jax leg only: the tests that
    price a match compile its kernel at the matched shapes, minutes of CI time (the newest leg was
    checked with them by hand: jax 0.12.0.1, libtpu 0.0.50.1, the same matches)."""
    _only_on_leg(newest=False, why="the compiled fixture programs are read on the oldest jax leg only (CI time)")
    import shutil

    root = tmp_path_factory.mktemp("suggest")
    runs = {}
    for name in EXPECTED:
        runs[name] = root / name
        shutil.copytree(SUGGEST_RUNS / name, runs[name])
    return runs


def test_the_stored_compiles_are_of_the_programs_as_regenerate_runs_them():
    """Each stored run is the compile of its program with the arguments regenerate.py gives it, and
    every program EXPECTED names has one. An edited program is not detected here: rerun regenerate.py for it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("regenerate", ARTIFACT_SETS["jax-0.10"] / "regenerate.py")
    regenerate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(regenerate)
    assert sorted(regenerate.SUGGEST) == sorted(f"suggest/{name}" for name in EXPECTED)
    for name, (program, args) in regenerate.SUGGEST.items():
        manifest = json.loads((ARTIFACT_SETS["jax-0.10"] / name / "manifest.json").read_text())
        assert (manifest["kind"], manifest["status"], manifest["argv"]) == ("compile", "ok", [program, *args])


def _hlo_files(run):
    """The optimized HLO of each module of a compile run, in module order."""
    return [mdir / rundir.MODULE_HLO for mdir in sorted((run / "modules").iterdir())
            if (mdir / rundir.MODULE_HLO).is_file()]


def _found(run) -> set[str]:
    out = set()
    for path in _hlo_files(run):
        out |= {m.pattern for m in find_patterns(read_hlo_file(path))}
    return out


def test_each_detector_finds_its_pattern_and_nothing_else(compiled):
    found = {name: _found(run) for name, run in compiled.items()}
    true_pos = sum(len(found[n] & EXPECTED[n]) for n in EXPECTED)
    false_pos = sum(len(found[n] - EXPECTED[n]) for n in EXPECTED)
    missed = sum(len(EXPECTED[n] - found[n]) for n in EXPECTED)
    assert found == EXPECTED, found
    assert (true_pos, false_pos, missed) == (sum(map(len, EXPECTED.values())), 0, 0)


@pytest.mark.parametrize("version", sorted(ARTIFACT_SETS))
def test_the_cpu_dump_of_the_decoder_has_its_attention_and_norms(version):
    (path,) = [p for p in find_optimized_modules(ARTIFACT_SETS[version] / "decoder" / "hlo").values()
               if "train_step" in p.name]
    matches = find_patterns(read_hlo_file(path))
    att = [m for m in matches if m.pattern == "attention"]
    assert {m.pattern for m in matches} == {"attention", "rmsnorm"}
    # decoder.py: B=2, 4 heads of 64, S=128, causal, f32.
    s = att[0].shapes
    assert (s.batch_heads, s.q_len, s.kv_len, s.head_dim) == (8, 128, 128, 64)
    assert s.mask == "causal" and "causal mask" in att[0].notes
    assert all(s.split(":")[0].endswith("decoder.py") for m in matches for s in m.source)
    rms = [m for m in matches if m.pattern == "rmsnorm"]
    assert all(m.shapes.rows == 256 and m.shapes.hidden == 256 for m in rms)
    assert any("residual" in " ".join(m.notes) for m in rms)


def test_the_gain_comes_from_the_two_compiles(compiled):
    from tpudiag.api.pipeline import analyze_compile_run
    from tpudiag.api.suggest import suggest_run

    run = compiled["qwen_block"]
    rep = suggest_run(run, static_profile=False, include_all=True)
    att = next(s for s in rep.suggestions if s.pattern == "attention")
    assert att.shown and att.kernel == "flash_attention" and att.kernel_basis == "compiled" and att.backward
    report = analyze_compile_run(run)
    mod = next(m for m in report.modules if m.name == att.module)
    times = {o.name: o.total_s for o in mod.ops}
    assert att.xla_s == pytest.approx(sum(times[o] for o in att.ops), rel=1e-9)
    assert att.share == pytest.approx(att.xla_s / mod.totals.estimated_s, rel=1e-5)
    assert att.expected_speedup == pytest.approx(att.xla_s / att.kernel_s, rel=1e-3)
    assert att.saved_s == pytest.approx(att.xla_s - att.kernel_s, rel=1e-9)
    assert att.confidence == "medium" and "no TPU measurement" in att.reason
    # The RMSNorm's own ops take under half of what its data needs at HBM bandwidth: the TPU
    # compiler fused the rest into the matmuls around it. Listed as XLA's, not priced.
    assert not any(s.pattern == "rmsnorm" for s in rep.suggestions)
    (rms,) = [r for r in rep.replaced if r.pattern == "rmsnorm"]
    assert rms.by == "fusion into its matmuls" and "at HBM bandwidth" in rms.notes[0]


def test_a_pattern_in_a_scanned_layer_counts_every_layer(compiled):
    """Four layers under lax.scan: the TPU HLO records no trip count; the loop is read as 4 trips, the
    module's total counts the body four times, and the suggestion's times and saving count every layer."""
    from tpudiag.api.pipeline import analyze_compile_run
    from tpudiag.api.suggest import suggest_run

    run = compiled["qwen_layers"]
    report = analyze_compile_run(run)
    mod = next(m for m in report.modules if m.name == "jit_forward_layers")
    assert {o.runs for o in mod.ops} >= {1, 4}
    assert mod.totals.estimated_s == pytest.approx(sum(o.estimated_s * o.runs for o in mod.ops), rel=1e-9)
    assert any("4 times per execution" in f for f in mod.findings)
    rep = suggest_run(run, static_profile=False, include_all=True, calibration=False)
    att = next(s for s in rep.suggestions if s.pattern == "attention")
    times = {o.name: o.estimated_s for o in mod.ops}
    assert att.runs == 4 and att.kernel_basis == "compiled"
    assert att.xla_s == pytest.approx(4 * sum(times[o] for o in att.ops), rel=1e-9)
    assert att.share == pytest.approx(att.xla_s / mod.totals.estimated_s, rel=1e-5)
    assert att.saved_s == pytest.approx(att.xla_s - att.kernel_s, rel=1e-9)
    assert any("runs 4 times per execution" in n for n in att.notes)


def test_attention_xla_already_replaced_is_named_not_suggested(compiled):
    """All-bf16 attention: libtpu (0.0.42 and 0.0.50) fuses its softmax and PV into its own
    `online-softmax` kernel. The match is reported as replaced, with its source and what the kernel
    leaves outside; no kernel is suggested for it, even with --all."""
    from tpudiag.api.suggest import suggest_run

    rep = suggest_run(compiled["bf16_attention"], static_profile=False, include_all=True)
    assert not [s for s in rep.suggestions if s.pattern == "attention"]
    (x,) = rep.replaced
    assert (x.pattern, x.by, x.module) == ("attention", "online-softmax", "jit_prefill_attention")
    assert x.source and x.source[0].split(":")[0].endswith("bf16_attention.py")
    assert any("2048x2048 score matrix (64 MiB)" in n for n in x.notes)


def test_a_dense_moe_dispatch_is_priced_with_the_fused_moe_kernel(compiled):
    """moe_layer.py: tokens 512, 8 experts, top-2, SwiGLU 1024 -> 2048 -> 1024, one-hot dispatch.
    fused_moe is compiled at those shapes; its estimate is at least the routed roofline bound (top-2
    routing's FLOPs, counted by hand: 3 matmuls of 2*t*d*f per routed expert, against the weights)."""
    from tpudiag.api.suggest import suggest_run
    from tpudiag.targets import resolve_target

    rep = suggest_run(compiled["moe_layer"], static_profile=False, include_all=True, calibration=False)
    (moe,) = [s for s in rep.suggestions if s.pattern == "moe"]
    assert moe.kernel == "fused_moe" and moe.kernel_basis == "compiled"
    t, e, d, f = 512, 8, 1024, 2048
    assert moe.shapes["dense_flops"] == 3 * 2 * t * e * d * f  # every token through every expert
    assert moe.shapes["weight_bytes"] == 3 * e * d * f * 2
    assert (moe.shapes["top_k"], moe.shapes["hidden"], moe.shapes["ffn"]) == (2, d, f)
    assert "kernel compiled at T512 D1024 F2048 E8 top-2 bf16" in moe.notes
    chip = resolve_target("v5e").chip
    bound = max(moe.shapes["weight_bytes"] / chip.hbm_bytes_per_s, 2 * 3 * 2 * t * d * f / chip.peak_bf16_flops_per_s)
    assert moe.kernel_s >= bound * (1 - 1e-6)
    assert moe.xla_s > moe.kernel_s and "top_k=2" in moe.snippet


def test_a_dense_moe_training_step_counts_its_flops_once(compiled):
    """moe_layer.py --train: the one-hot reaches the forward's and the gradient's matmuls. The dense
    FLOPs are the forward's alone (by hand: 3 matmuls of 2*t*e*d*f); the backward factor (3x) adds
    the gradient once, not on top of the gradient's own matmuls."""
    from tpudiag.api.suggest import suggest_run
    from tpudiag.targets import resolve_target

    rep = suggest_run(compiled["moe_train"], static_profile=False, include_all=True)
    (moe,) = [s for s in rep.suggestions if s.pattern == "moe"]
    t, e, d, f = 512, 8, 1024, 2048
    assert moe.backward and moe.shapes["top_k"] == 2
    assert moe.shapes["dense_flops"] == 3 * 2 * t * e * d * f
    chip = resolve_target("v5e").chip
    routed = moe.shapes["dense_flops"] * 2 / e
    # fused_moe is forward only: the training step is priced at the routed bound, and says why
    assert moe.kernel_basis == "roofline_bound"
    assert "fused_moe has no backward kernel" in moe.reason
    assert moe.kernel_s == pytest.approx(3 * max(moe.shapes["weight_bytes"] / chip.hbm_bytes_per_s,
                                                 routed / chip.peak_bf16_flops_per_s), rel=1e-6)
    assert moe.shown and moe.expected_speedup > 1.25


def test_a_profile_run_gives_the_saving_per_step(tmp_path):
    """`tpudiag suggest SCRIPT` profiles with --target first; the profile says how often each module
    runs per step: the full-sort sampler three times (--repeat 3), the top-k one once."""
    _only_on_leg(newest=False, why="the compiled fixture programs run on the oldest jax leg only (CI time)")
    from tpudiag.api.suggest import suggest

    rep, run = suggest(PROGRAMS / "sampler.py", ["--steps", "2", "--repeat", "3"], out=tmp_path / "run",
                       static_profile=False, include_all=True)
    rows = {s.module: s for s in rep.suggestions if s.pattern == "sampling"}
    full, topk = rows["jit_full_sort_sample"], rows["jit_sample"]
    assert (full.executions_per_step, topk.executions_per_step) == (3.0, 1.0)
    assert full.saved_per_step_s == pytest.approx(3 * full.saved_s, rel=1e-9)
    assert topk.saved_per_step_s == pytest.approx(topk.saved_s, rel=1e-9)
    assert full.measured_share is not None and full.measured_share > 0
    # each sampler's own parameters, read from its HLO: the full sort is pure top-p at temperature 0.8
    assert (full.shapes["top_k"], full.shapes["top_p"], full.shapes["temperature"]) == (None, 0.9, 0.8)
    assert "sample(logits, u, k=None, p=0.9, temperature=0.8)" in full.snippet
    assert (topk.shapes["top_k"], topk.shapes["top_p"], topk.shapes["temperature"]) == (64, 0.9, 0.8)


def test_a_well_shaped_mlp_gets_no_suggestion(compiled):
    from tpudiag.api.suggest import suggest_run

    rep = suggest_run(compiled["mlp"], static_profile=False)
    assert rep.suggestions == () and "no op clears the minimums" in rep.notes[-1]


def test_int4_weights_in_groups_map_to_the_int4_kernel_at_their_groups(compiled):
    from tpudiag.kernels.at_shapes import setup_for

    (m,) = _matches(compiled["int4_layer"])
    assert (m.shapes.weight_dtype, m.shapes.group, m.shapes.weight) == ("s4", 128, (4096, 14336))
    # oracle: the optimized HLO's own top-level ops: the scales' broadcast to the weights' shape
    # (XLA writes it to HBM whole) is part of the pattern, with the matmul's fusion
    layer = next(d for d in (compiled["int4_layer"] / "modules").iterdir() if "layer" in d.name)
    hlo = (layer / rundir.MODULE_HLO).read_text()
    broadcast = re.search(r"%(\S+) = bf16\[32,128,14336\][^ ]* broadcast\(", hlo).group(1)
    assert broadcast in m.ops
    setup = setup_for(m.detector, m.shapes)
    assert setup.kernel == "int4_matmul"
    assert [a.shape for a in setup.args] == [(64, 4096), (4096, 14336), (32, 14336)]
    assert "groups of 128" in setup.snippet


def _matches(run):
    return [m for path in _hlo_files(run) for m in find_patterns(read_hlo_file(path))]


def test_decode_attention_through_a_page_table_is_priced_with_paged_attention(compiled):
    from tpudiag.kernels.at_shapes import setup_for

    (m,) = [m for m in _matches(compiled["serving_decode"]) if m.pattern == "attention_decode"]
    s = m.shapes
    # the program: batch 32, 32 heads over 8 KV heads, pages of 16 tokens, 128 a sequence
    assert (s.batch, s.batch_heads, s.kv_batch_heads, s.page_size, s.kv_len, s.head_dim) == (32, 1024, 256, 16, 2048, 128)
    # oracle: the optimized HLO's entry fusions that hold a gather (the page copies) are the pattern's ops
    layer = next(d for d in (compiled["serving_decode"] / "modules").iterdir() if "decode_layer" in d.name)
    hlo = (layer / rundir.MODULE_HLO).read_text()
    with_gather = {c for c, body in re.findall(r"\n%(\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S) if " gather(" in body}
    callers = set(re.findall(r"%(\S+) = [^\n]* fusion\([^\n]*calls=%(\S+?)[,\s]", hlo))
    gather_ops = {op for op, callee in callers if callee in with_gather}
    assert len(gather_ops) == 2 and gather_ops <= set(m.ops)
    setup = setup_for(m.detector, s)
    assert setup.kernel == "paged_attention"
    assert [a.shape for a in setup.args] == [(32, 32, 128), (8, 4096, 16, 128), (8, 4096, 16, 128), (32,), (32, 128)]
    assert not s.kv_written  # the program reads the cache as it comes
    # a contiguous cache (decode_step slices [8, 8, 2048, 128] of it, read only): ragged paged
    # attention over pages in order, its batch read from the slice, no page write
    (c,) = [m for m in _matches(compiled["decode_step"]) if m.pattern == "attention_decode"]
    assert (c.shapes.page_size, c.shapes.batch, c.shapes.kv_written) == (0, 8, False)
    setup = setup_for(c.detector, c.shapes)
    assert setup.kernel == "ragged_paged_attention" and not setup.donate and "write_kv_pages" not in setup.snippet
    assert [a.shape for a in setup.args] == [(8, 32, 128), (8, 128, 128, 128), (8, 128, 128, 128), (8,), (8, 16),
                                             (9,), (1,)]


def test_a_serving_step_that_writes_its_pages_maps_to_ragged_paged_attention(compiled):
    """serving_step.py writes each sequence's new key and value into its page (two scatters), then
    reads the pages through the page table: the write is the pattern's too, and the kernel that
    writes and reads the pages prices it."""
    from tpudiag.kernels.at_shapes import setup_for

    (m,) = [m for m in _matches(compiled["serving_step"]) if m.pattern == "attention_decode"]
    s = m.shapes
    # the program: batch 8, 16 heads over 4 KV heads, pages of 16 tokens, 64 a sequence
    assert (s.batch, s.batch_heads, s.kv_batch_heads, s.page_size, s.kv_len, s.head_dim) == (8, 128, 32, 16, 1024, 128)
    assert s.kv_written
    # oracle: the optimized HLO's entry ops that hold a scatter (the page writes) are the pattern's
    layer = next(d for d in (compiled["serving_step"] / "modules").iterdir() if "decode_step" in d.name)
    hlo = (layer / rundir.MODULE_HLO).read_text()
    with_scatter = {c for c, body in re.findall(r"\n%(\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S) if " scatter(" in body}
    callers = set(re.findall(r"%(\S+) = [^\n]* fusion\([^\n]*calls=%(\S+?)[,\s]", hlo))
    scatter_ops = {op for op, callee in callers if callee in with_scatter}
    scatter_ops |= set(re.findall(r"\n\s*%(\S+) = [^\n]* scatter\(", hlo.split("\nENTRY")[1]))
    assert scatter_ops and scatter_ops <= set(m.ops)
    setup = setup_for(m.detector, s)
    assert setup.kernel == "ragged_paged_attention" and "write_kv_pages" in setup.snippet
    assert [a.shape for a in setup.args] == [(8, 16, 128), (8, 4, 128), (8, 4, 128), (4, 512, 16, 128),
                                             (4, 512, 16, 128), (8,), (8, 64), (9,), (1,)]


def test_the_serving_steps_routed_moe_maps_to_fused_moe_with_its_gain(compiled):
    """serving_step.py: 8 tokens, top-4 of 64 SwiGLU experts (1024 -> 512 -> 1024) dispatched densely.
    At a batch of 8 at most 32 of the 64 experts are routed to, so the kernel reads at most half the
    expert weights the dense dispatch reads: suggest names it with a gain."""
    from tpudiag.api.suggest import suggest_run

    rep = suggest_run(compiled["serving_step"], static_profile=False, include_all=True, calibration=False)
    rows = {s.pattern: s for s in rep.suggestions}
    moe = rows["moe"]
    assert (moe.shapes["tokens"], moe.shapes["experts"], moe.shapes["top_k"]) == (8, 64, 4)
    assert (moe.shapes["hidden"], moe.shapes["ffn"]) == (1024, 512)
    assert moe.kernel == "fused_moe" and moe.kernel_basis == "compiled"
    assert moe.shown and moe.expected_speedup > 1.25
    assert rows["attention_decode"].kernel == "ragged_paged_attention"
    assert rows["w8a8_matmul"].kernel == "w8a8_matmul"
    assert all(rows[p].expected_speedup and rows[p].expected_speedup > 1 for p in rows)


def test_fp8_layers_map_to_fp8_matmul_in_their_own_mode(compiled):
    """fp8_layer.py: e4m3 weights upcast before a bf16 dot (weight-only) and the same weights with
    the activations quantized to e4m3 in the program (the quantize's fusion among the pattern's
    ops): both priced with fp8_matmul, each in its mode."""
    from tpudiag.kernels.at_shapes import setup_for

    by = {m.pattern: m for m in _matches(compiled["fp8_layer"])}
    deq, act = by["dequant_matmul"], by["w8a8_matmul"]
    assert (deq.shapes.weight, deq.shapes.weight_dtype, deq.shapes.out) == ((4096, 14336), "f8e4m3fn", (64, 14336))
    assert (act.shapes.activations, act.shapes.quant_dtype) == ((64, 4096), "f8e4m3fn")
    # oracle: the optimized HLO's fusion that converts to f8e4m3fn from f32 (the quantize) is the pattern's
    layer = next(d for d in (compiled["fp8_layer"] / "modules").iterdir() if d.name.endswith("jit_w8a8"))
    hlo = (layer / rundir.MODULE_HLO).read_text()
    quant = {c for c, body in re.findall(r"\n%(\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S)
             if re.search(r"f8e4m3fn\[[0-9,]+\][^\n]* convert\(%clamp", body)}
    callers = {op for op, callee in re.findall(r"%(\S+) = [^\n]* fusion\([^\n]*calls=%(\S+?)[,\s]", hlo)
               if callee in quant}
    assert callers and callers <= set(act.ops)
    for m, mode in ((deq, "'bf16'"), (act, "'fp8'")):
        setup = setup_for(m.detector, m.shapes)
        assert setup.kernel == "fp8_matmul" and f"activations={mode}" in setup.snippet
        assert [a.shape for a in setup.args] == [(64, 4096), (4096, 14336), (14336,)]


def test_latent_attention_not_absorbed_is_priced_with_mla_decode(compiled):
    from tpudiag.kernels.at_shapes import setup_for

    (m,) = _matches(compiled["mla_naive_decode"])
    s = m.shapes
    # the program: batch 4, 16 heads, context 1024, kv_lora_rank 512, RoPE 64, nope 128, v 128
    assert (s.batch, s.heads, s.kv_len, s.latent, s.rope, s.qk_head_dim, s.v_head_dim) == (4, 16, 1024, 512, 64, 192, 128)
    # oracle: the optimized HLO's up-projections (convolutions or dots labelled by the program's
    # einsum "btl,lhd->bthd") are in the pattern's ops, through the fusions that hold them
    layer = next(d for d in (compiled["mla_naive_decode"] / "modules").iterdir() if "attend" in d.name)
    hlo = (layer / rundir.MODULE_HLO).read_text()
    ups = re.findall(r"%(\S+) = [^\n]*(?:convolution|dot)\([^\n]*btl,lhd->bthd", hlo)
    assert len(ups) == 2
    fused = {c for c, body in re.findall(r"\n%(\S+) [^\n]*\{\n(.*?)\n\}", hlo, re.S)
             if any(f"%{u} = " in body for u in ups)}
    holders = {op for op, callee in re.findall(r"%(\S+) = [^\n]* fusion\([^\n]*calls=%(\S+?)[,\s]", hlo)
               if callee in fused}
    assert holders and holders <= set(m.ops)
    setup = setup_for(m.detector, s)
    assert setup.kernel == "mla_decode"
    # the cache as one page of 1024 rows a sequence (tpu-inference's MLA page size)
    assert [a.shape for a in setup.args] == [(4, 16, 640), (4, 1024, 640), (4,), (4, 1)]
    # the bound, by hand: the bf16 latent and RoPE key of 4 x 1024 tokens read once (q and out are
    # 4 x 16 rows of 576, counted both ways), against 2 x 4 x 16 x 1024 x (512 + 64 + 512) FLOPs
    from tpudiag.targets import resolve_target

    chip = resolve_target("v5e").chip
    nbytes = 2 * 4 * 1024 * 576 + 2 * 2 * 4 * 16 * 576
    flops = 2 * 4 * 16 * 1024 * (512 + 64 + 512)
    assert m.detector.bound(s, chip) == pytest.approx(max(nbytes / chip.hbm_bytes_per_s,
                                                          flops / chip.peak_bf16_flops_per_s))


def test_the_attention_snippet_runs_in_interpret_mode_against_the_reference(compiled):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpudiag.api.suggest import suggest_run
    from tpudiag.kernels.flash_attention import reference

    rep = suggest_run(compiled["qwen_block"], static_profile=False)
    snippet = next(s for s in rep.suggestions if s.pattern == "attention").snippet
    call = [ln for ln in snippet.splitlines() if ln.startswith("out = ")][0].split("  #")[0]
    ns = {}
    exec("\n".join(ln for ln in snippet.splitlines() if ln.startswith("from ")), ns)
    kq, kk, kv = jax.random.split(jax.random.PRNGKey(1), 3)
    shape = (1, 2, 256, 64)  # small, with the snippet's head dim
    ns.update(q=jax.random.normal(kq, shape, jnp.bfloat16), k=jax.random.normal(kk, shape, jnp.bfloat16),
              v=jax.random.normal(kv, shape, jnp.bfloat16))
    exec(call.replace(")", ", interpret=True)", 1) if call.endswith(")") else call, ns)
    want = reference(ns["q"].astype(jnp.float32), ns["k"].astype(jnp.float32), ns["v"].astype(jnp.float32),
                     causal=True)
    np.testing.assert_allclose(np.asarray(ns["out"], np.float32), np.asarray(want), atol=3e-2, rtol=3e-2)
    assert math.isfinite(float(jnp.abs(ns["out"].astype(jnp.float32)).sum()))


def test_bad_inputs_say_what_is_missing_and_the_command(tmp_path):
    from tpudiag.api.suggest import suggest_run

    profile_run = ARTIFACT_SETS["jax-0.10"] / "mlp"
    with pytest.raises(InputError, match=r"a profile run without a TPU compile; suggestions need one: "
                                         r"tpudiag profile --target v5e "):
        suggest_run(profile_run)
    xplane = next((profile_run / "trace").rglob("*.xplane.pb"))
    with pytest.raises(InputError, match="a bare trace has no HLO to read"):
        suggest_run(xplane)
    with pytest.raises(InputError, match=r"compiled for v5e:2x4, not v6e:2x2; compile it for that target first: "
                                         r"tpudiag compile --target v6e "):
        suggest_run(ARTIFACT_SETS["jax-0.10"] / "compile_v5e_collective", "v6e")
    with pytest.raises(InputError, match="no such file or directory"):
        suggest_run(tmp_path / "nope")
    # A multi-process job: `compile` runs its program as the whole job in one process (the
    # compile_v5p_dp_train fixture is that command's run of this program), `suggest SCRIPT` would not.
    with pytest.raises(InputError, match=r"a 2-process job has no TPU compile; suggestions need one: "
                                         r"tpudiag compile --target v5e --out RUN fixtures/programs/dp_train.py "
                                         r"-- --steps 4 --slow-process 1 --slow-ms 20, then tpudiag suggest RUN"):
        suggest_run(ARTIFACT_SETS["jax-0.10"] / "dp_train_2p")
    assert json.loads((ARTIFACT_SETS["jax-0.10"] / "compile_v5p_dp_train" / "manifest.json").read_text())[
        "status"] == "ok"


def test_padding_is_found_where_the_tpu_layout_pads_and_costed(compiled):
    from tpudiag.api.suggest import suggest_run
    from tpudiag.parse.shapes import parse_shape

    rep = suggest_run(compiled["layout_waste"], static_profile=False)
    (pad,) = [f for f in rep.findings if f.kind == "padding"]
    assert pad.module == "jit_step" and pad.source.endswith("layout_waste.py:31")
    # [256, 72, 72] bf16 stored as [256, 72, 128]: 256 * 72 * (128 - 72) elements of 2 bytes.
    assert pad.bytes == 256 * 72 * (128 - 72) * 2
    assert pad.estimated_s == pytest.approx(2 * pad.bytes / 819e9, rel=1e-9)
    # The compiler stored the [4096, 100] result transposed (4096 on the lanes): no padding there to report.
    assert "[4096, 100]" not in " ".join(f.detail for f in rep.findings)
    assert parse_shape("bf16[256,72,72]{2,1,0:T(8,128)(2,1)}").bytes == 256 * 72 * 72 * 2


def test_cli_json_and_md_and_a_bad_input_exit_2(compiled, capsys):
    import json

    from tpudiag.cli import main

    with pytest.raises(SystemExit) as e:
        main(["suggest", "--no-static-profile", "--json", str(compiled["sampler"])])
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert e.value.code == 0 and doc["schema"] == "tpudiag.suggest/1"
    row = next(r for r in doc["suggestions"] if r["shown"])
    assert row["pattern"] == "sampling" and row["kernel"] == "sampling" and row["saved_s"] > 0
    assert set(row) >= {"pattern", "kernel", "ops", "source", "shapes", "share", "xla_s", "kernel_s",
                        "expected_speedup", "saved_s", "confidence", "reason", "snippet"}
    with pytest.raises(SystemExit) as e:
        main(["suggest", "--no-static-profile", "--md", str(compiled["sampler"])])
    out, _ = capsys.readouterr()
    assert e.value.code == 0 and out.startswith("## tpudiag suggest: ") and "suggestion(s) for v5e:2x2" in out
    with pytest.raises(SystemExit) as e:
        main(["suggest", str(ARTIFACT_SETS["jax-0.10"] / "mlp")])
    _, err = capsys.readouterr()
    assert e.value.code == 2 and err.count("\n") == 1 and "tpudiag profile --target v5e" in err


def test_ragged_dot_lowered_for_tpu_is_already_replaced(tmp_path):
    """`lax.ragged_dot` lowered for TPU becomes libtpu's own ragged-dot kernels: listed as replaced, not
    suggested. (A script's CPU run lowers it for CPU, densely; hence the direct TPU lowering here.)"""
    import jax
    import jax.numpy as jnp

    from tpudiag import api
    from tpudiag.capture.lower import lower_for_tpu
    from tpudiag.api.suggest import suggest_run

    def f(x, w, sizes):
        return jax.lax.ragged_dot(x, w, sizes)

    args = (jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16), jax.ShapeDtypeStruct((8, 1024, 2048), jnp.bfloat16),
            jax.ShapeDtypeStruct((8,), jnp.int32))
    lower_for_tpu(f, args, tmp_path / "ragged.mlir")
    run = api.compile_target("v5e", tmp_path / "ragged.mlir", (), tmp_path / "run", static_profile=False).run_dir
    rep = suggest_run(run, static_profile=False)
    assert [(r.pattern, r.by) for r in rep.replaced] == [("moe", "ragged-dot")]
    assert {"ragged-dot-metadata", "ragged-dot-none"} <= set(rep.replaced[0].ops)
    assert not any(s.pattern == "moe" for s in rep.suggestions)


def _random_inputs(names_shapes: dict, key):
    import jax
    import jax.numpy as jnp

    out = {}
    for n, (shape, dtype) in names_shapes.items():
        key, sub = jax.random.split(key)
        if dtype == "int32_labels":
            out[n] = jax.random.randint(sub, shape, 0, names_shapes["logits"][0][1], jnp.int32)
        elif dtype == "int8":
            out[n] = jax.random.randint(sub, shape, -127, 128, jnp.int32).astype(jnp.int8)
        elif dtype == "int4":
            out[n] = jax.random.randint(sub, shape, -8, 8, jnp.int32).astype(jnp.int4)
        elif dtype == "e4m3":  # N(0, 1) weights stored in e4m3 (scales of 1/(sqrt(K)) keep outputs O(1))
            out[n] = jax.random.normal(sub, shape, jnp.float32).astype(jnp.float8_e4m3fn)
        elif dtype == "e4m3_scales":
            out[n] = jax.random.uniform(sub, shape, jnp.float32, 0.5, 1.5) / names_shapes["x"][0][1] ** 0.5
        elif dtype == "group_scales":  # of N(0, 1/K) weights quantized to [-8, 7]: outputs O(1)
            out[n] = jax.random.uniform(sub, shape, jnp.float32, 0.5, 1.5) / (7 * (names_shapes["x"][0][1] ** 0.5))
        elif dtype == "fan_in":  # bf16 weights N(0, 1/fan-in) (the dimension before the last): outputs O(1)
            out[n] = (jax.random.normal(sub, shape, jnp.float32) / shape[-2] ** 0.5).astype(jnp.bfloat16)
        elif dtype == "uniform":
            out[n] = jax.random.uniform(sub, shape, jnp.float32, 0.01, 0.99)
        else:
            out[n] = jax.random.normal(sub, shape, jnp.dtype(dtype))
    return out


# Each kernel's snippet at small shapes: the variables it names, and the reference call it must match.
SNIPPETS = {
    # the program's epsilon (transformers' Llama: 1e-5), not the kernel's default
    "rmsnorm": (NormShapes(rows=64, hidden=256, dtype="bf16", eps=1e-5),
                {"x": ((64, 256), "bfloat16"), "resid": ((64, 256), "bfloat16"), "weight": ((256,), "bfloat16")},
                "normed", lambda ref, v: ref(v["x"], v["resid"], v["weight"], eps=1e-5)[0]),
    "cross_entropy": (CrossEntropyShapes(rows=16, vocab=1024, dtype="f32"),
                      {"logits": ((16, 1024), "bfloat16"), "labels": ((16,), "int32_labels")},
                      "loss", lambda ref, v: ref(v["logits"], v["labels"]).mean()),
    # a pure top-p sampler at temperature 0.8 (sampler.py's full-sort one): no top-k added
    "sampling": (SamplingShapes(rows=8, vocab=1024, dtype="f32", top_k=None, top_p=0.9, temperature=0.8),
                 {"logits": ((8, 1024), "float32"), "u": ((8,), "uniform")},
                 "tokens", lambda ref, v: ref(v["logits"], v["u"], k=None, p=0.9, temperature=0.8)),
    "dequant_matmul": (DequantShapes(weight=(256, 256), weight_dtype="s8", out=(16, 256), dtype="bf16"),
                       {"x": ((16, 256), "bfloat16"), "w_int8": ((256, 256), "int8"),
                        "scales": ((256,), "uniform")},
                       "y", lambda ref, v: ref(v["x"], v["w_int8"], v["scales"])),
    # the 4-bit form of the same pattern (a key after ":" names the form): groups of 64 along K
    "dequant_matmul:s4": (DequantShapes(weight=(256, 256), weight_dtype="s4", out=(16, 256), dtype="bf16", group=64),
                          {"x": ((16, 256), "bfloat16"), "w_int4": ((256, 256), "int4"),
                           "scales": ((4, 256), "group_scales")},
                          "y", lambda ref, v: ref(v["x"], v["w_int4"], v["scales"])),
    # the e4m3 forms: weight-only (a dequantize-then-matmul) and activations quantized in the program
    "dequant_matmul:f8": (DequantShapes(weight=(256, 256), weight_dtype="f8e4m3fn", out=(16, 256), dtype="bf16",
                                        group=256),
                          {"x": ((16, 256), "bfloat16"), "w_e4m3": ((256, 256), "e4m3"),
                           "w_scale": ((256,), "e4m3_scales")},
                          "y", lambda ref, v: ref(v["x"], v["w_e4m3"], v["w_scale"], activations="bf16")),
    "w8a8_matmul:f8": (W8A8Shapes(activations=(16, 256), weight=(256, 256), out=(16, 256), dtype="bf16",
                                  quant_dtype="f8e4m3fn"),
                       {"x": ((16, 256), "bfloat16"), "w_e4m3": ((256, 256), "e4m3"),
                        "w_scale": ((256,), "e4m3_scales")},
                       "y", lambda ref, v: ref(v["x"], v["w_e4m3"], v["w_scale"], activations="fp8")),
    "moe": (DenseDispatchShapes(tokens=16, experts=8, matmuls=3, dtype="bf16", dense_flops=0.0, weight_bytes=0,
                                top_k=2, hidden=128, ffn=256),
            {"x": ((16, 128), "bfloat16"), "router_w": ((128, 8), "bfloat16"), "w_gate": ((8, 128, 256), "fan_in"),
             "w_up": ((8, 128, 256), "fan_in"), "w_down": ((8, 256, 128), "fan_in")},
            "out", lambda ref, v: ref(v["x"], v["router_w"], v["w_gate"], v["w_up"], v["w_down"], top_k=2)),
    "w8a8_matmul": (W8A8Shapes(activations=(16, 256), weight=(256, 256), out=(16, 256), dtype="bf16"),
                    {"x": ((16, 256), "bfloat16"), "w_int8": ((256, 256), "int8"), "w_scale": ((256,), "uniform")},
                    "y", lambda ref, v: ref(v["x"], v["w_int8"], v["w_scale"])),
}


@pytest.mark.parametrize("pattern", sorted(SNIPPETS))
def test_each_snippet_runs_in_interpret_mode_against_its_reference(pattern):
    import ast

    import jax
    import numpy as np

    from tpudiag.kernels.at_shapes import setup_for
    from tpudiag.kernels.registry import get_spec

    shapes, names, result, reference_call = SNIPPETS[pattern]
    setup = setup_for(BY_NAME[pattern.split(":")[0]], shapes)
    tree = ast.parse(setup.snippet)
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                and n.func.id in {"rmsnorm_residual", "cross_entropy", "sample", "int8_matmul", "w8a8_matmul",
                                                 "int4_matmul", "fused_moe", "fp8_matmul"})
    call.keywords.append(ast.keyword(arg="interpret", value=ast.Constant(True)))
    inputs = _random_inputs(names, jax.random.PRNGKey(3))
    ns = dict(inputs)  # the snippet may rebind its inputs (`normed, resid = rmsnorm_residual(x, resid, ...)`)
    exec(compile(ast.fix_missing_locations(tree), "<snippet>", "exec"), ns)
    spec = get_spec(setup.kernel)
    want = reference_call(spec.reference, inputs)
    got = ns[result]
    if pattern == "sampling":
        assert np.array_equal(np.asarray(got), np.asarray(want))
    else:
        tol = spec.tolerances["bfloat16"]
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol.atol,
                                   rtol=tol.rtol)


def test_a_compile_run_whose_modules_all_failed_is_a_one_line_error(tmp_path):
    """The collective step is sharded over 8 devices: compiled for a 4-chip v5e:2x2 it fails, and with
    it every module of the run."""
    from tpudiag import api
    from tpudiag.api.suggest import suggest_run

    step = ARTIFACT_SETS["jax-0.10"] / "collective" / "ir" / "jax_ir0008_jit_step_compile.mlir"
    run = api.compile_target("v5e:2x2", step, (), tmp_path / "run", static_profile=False).run_dir
    with pytest.raises(InputError, match=r"every module failed to compile, so there is no optimized HLO to read "
                                         r"\(tpudiag report .* shows why\)"):
        suggest_run(run, static_profile=False)


def test_a_forward_kernel_is_priced_from_the_chips_measured_table(compiled, capsys):
    """On v5e, a forward kernel's time is its measured share of the roofline floor at the bench
    shape (kernels/measured_v5e.json, from a v5e) applied to its floor at the matched shapes, and
    XLA's ops not measured by the run take the multiple of that floor XLA's version took on the
    chip. --no-calibration keeps the static figures."""
    from tpudiag.api.suggest import suggest_run
    from tpudiag.cli import main
    from tpudiag.kernels.measured import chip_figures

    rep = suggest_run(compiled["sampler"], static_profile=False, include_all=True)
    # The sampler's 8 rows are one grid step of the kernel's 16-row block, a latency-bound step that
    # costs a whole block: the top-k path at the bench's figure (B64, whole blocks) takes 2 floors'
    # worth here; top-p over the whole row (no top-k) at its own path's figure, measured at these 8 rows.
    for key, k, steps in (("sampling", "k=64", 2.0), ("sampling@top_p", "k=None", 1.0)):
        fig = chip_figures("v5e")[key]
        row = next(s for s in rep.suggestions if s.kernel == "sampling" and k in " ".join(s.notes))
        assert row.kernel_basis == "measured_table" and row.xla_basis == "measured_table"
        floor = row.kernel_s * fig.efficiency / steps / row.runs
        assert row.xla_s == pytest.approx(floor * fig.xla_over_floor * row.runs, rel=1e-6)
        assert row.expected_speedup == pytest.approx(fig.xla_us / fig.kernel_us / steps, rel=1e-3)
        assert "TPU v5 lite" in row.reason and fig.command in row.reason
    fig = chip_figures("v5e")["sampling"]
    row = next(s for s in rep.suggestions if s.kernel == "sampling" and "k=64" in " ".join(s.notes))
    static = suggest_run(compiled["sampler"], static_profile=False, include_all=True, calibration=False)
    srow = next(s for s in static.suggestions if s.kernel == "sampling")
    assert srow.kernel_basis == "compiled" and srow.xla_basis is None
    assert srow.kernel_s < row.kernel_s  # the static figure is the floor-bound compile; the chip reached 56% of it
    with pytest.raises(SystemExit) as e:
        main(["suggest", "--no-static-profile", "--no-calibration", "--json", str(compiled["sampler"])])
    out, _ = capsys.readouterr()
    assert e.value.code == 0 and all(r["kernel_basis"] != "measured_table" for r in __import__("json").loads(out)["suggestions"])
    # another chip has no table: static figures
    assert chip_figures("v6e") == {}
