"""The attention mask of a real TPU v5e training step, read from the TPU compiler's optimized HLO
(fixtures/tpu-v5e/llama_train_xla_attention: `llama_train.py --attention xla`, a causal mask built
by `jnp.tril`, 12 layers in a scan, profiled on the chip)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpudiag.analyze.suggest.detectors import find_patterns
from tpudiag.parse.hlo import read_hlo_file

RUN = Path(__file__).resolve().parents[2] / "fixtures" / "tpu-v5e" / "llama_train_xla_attention"


@pytest.mark.xfail(strict=True, reason=(
    "known defect: the TPU compiler carries the mask into the scanned loops as a loop-carried pred[2048,2048] "
    "rewritten each iteration from async slices (ConcatBitcast), and selects with it over [4,8,2,2048,2048] "
    "broadcasts the evaluator refuses to expand; the reader takes such a select for no mask"))
def test_the_causal_mask_of_a_scanned_step_compiled_for_tpu_reads_causal():
    module = read_hlo_file(next((RUN / "hlo").glob("*jit_train_step*.after_optimizations.txt")))
    masks = {pm.shapes.mask for pm in find_patterns(module) if pm.pattern == "attention"}
    assert masks == {"causal"}, masks
