"""The suggest detectors as a registry (analyze/suggest/detectors/): one list of patterns, each with
its label, its typed shapes in document order, its bound and its kernel."""

from __future__ import annotations



from tests.conftest import ARTIFACT_SETS
from tpudiag.analyze.suggest.detectors import DETECTORS, find_patterns
from tpudiag.kernels.at_shapes import BUILDERS, setup_for
from tpudiag.kernels.registry import all_specs
from tpudiag.parse.hlo import find_optimized_modules, read_hlo_file
from tpudiag.results.suggest import PATTERN_LABELS


def test_the_registry_is_the_one_list_of_patterns():
    names = [d.name for d in DETECTORS]
    assert len(names) == len(set(names)) and set(names) == set(PATTERN_LABELS)
    assert all(d.label == PATTERN_LABELS[d.name] for d in DETECTORS)
    kernels = {s.name for s in all_specs()}
    for d in DETECTORS:  # a kernel the bundle has and at_shapes builds, or a reason there is none
        assert (d.kernel in BUILDERS and d.kernel in kernels) if d.kernel else d.no_kernel, d
        if not d.kernel:
            assert setup_for(d, None) == d.no_kernel


def test_shapes_serialize_in_the_order_the_detectors_always_wrote_them():
    """A fresh report renders `shapes` in this order; `--json` sorts the keys."""
    (path,) = [p for p in find_optimized_modules(ARTIFACT_SETS["jax-0.10"] / "decoder" / "hlo").values()
               if "train_step" in p.name]
    first = {}
    for m in find_patterns(read_hlo_file(path)):
        first.setdefault(m.pattern, m.shapes.to_dict())
    assert {k: list(v) for k, v in first.items()} == {
        "attention": ["batch_heads", "q_len", "kv_len", "head_dim", "kv_batch_heads", "dtype", "softmax_dtype", "mask",
                      "mask_offset", "mask_window", "page_size", "batch", "kv_written"],
        "rmsnorm": ["rows", "hidden", "dtype", "eps"],
    }



def test_a_contiguous_caches_batch_is_the_dim_before_its_kv_heads():
    """The dims of a cache read or written whole, once its positions (S) and head_dim (D) are set
    aside: the KV heads last, the batch before them, whatever else leads; B != KVH here so the two
    cannot be confused. The HLO of each layout is the compiled fixtures' (decode_step [B, KVH, S, D],
    transformers' cached decode [B, S, KVH, D], in tests/test_suggest.py and tests/test_corpus.py)."""
    from tpudiag.analyze.suggest.detectors.attention import _cache_batch

    b, kvh, s, d = 6, 4, 1024, 128
    assert _cache_batch([b, s, kvh, d], s, d, b * kvh) == b  # transformers' Flax cache
    assert _cache_batch([b, kvh, s, d], s, d, b * kvh) == b
    assert _cache_batch([1, b, s, kvh, d], s, d, b * kvh) == b  # one layer of a stacked cache
    assert _cache_batch([s, kvh, d], s, d, kvh) == 1  # one sequence
    assert _cache_batch([b, s, kvh, d], s, d, 3 * kvh) == 0  # the K/V rows say otherwise: unknown
    assert _cache_batch([b, kvh, 2 * s, d], s, d, b * kvh) == 0  # not this attention's positions


def test_block_scaled_fp8_weights_are_not_priced_as_per_channel():
    from tpudiag.analyze.suggest.detectors.dequant import DequantShapes

    (deq,) = [d for d in DETECTORS if d.name == "dequant_matmul"]
    per_channel = DequantShapes(weight=(512, 256), weight_dtype="f8e4m3fn", out=(16, 256), dtype="bf16", group=512)
    assert setup_for(deq, per_channel).kernel == "fp8_matmul"
    blocked = DequantShapes(weight=(512, 256), weight_dtype="f8e4m3fn", out=(16, 256), dtype="bf16", group=128)
    assert setup_for(deq, blocked) == ("fp8_matmul takes one scale per output channel; these e4m3 weights have a "
                                       "scale per 128 rows of K")
