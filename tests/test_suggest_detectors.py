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

