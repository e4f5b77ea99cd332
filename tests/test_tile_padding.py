"""HBM bytes as a TPU lays them out: an array's two most minor dims padded to its layout's tile. Read
on the optimized HLO of a real v5e training step (fixtures/tpu-v5e/llama_train), beside what the chip
measured for the same ops."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT
from tpudiag.parse.shapes import parse_shape

RUN = ROOT / "fixtures" / "tpu-v5e" / "llama_train"


@pytest.mark.parametrize("text,ratio", [
    ("bf16[4,2048,16,32]{3,1,2,0:T(8,128)(2,1)}", 4.0),  # a rotary half: 32 of 128 lanes
    ("bf16[4,16,2048,64]{3,2,1,0:T(8,128)(2,1)}", 2.0),  # a 64-wide head
    ("f32[12,4096,1024]{2,1,0:T(8,128)}", 1.0),
    ("f32[4,16,1,2048]{3,2,1,0:T(1,128)}", 1.0),
    ("f32[4,16,1,2048]{3,2,1,0:T(8,128)}", 8.0),
    ("f32[1000]{0:T(1024)}", 1.024),
    ("f32[8,128]{1,0}", 1.0),  # no tile: logical bytes
])
def test_tiled_bytes(text, ratio):
    shape = parse_shape(text)
    assert shape.tiled_bytes == pytest.approx(shape.bytes * ratio)


def _module():
    from tpudiag.parse.hlo import parse_hlo_text

    (path,) = (RUN / "hlo").glob("*jit_train_step*after_optimizations.txt")
    return parse_hlo_text(path.read_text(), str(path))


def test_padded_ops_took_their_laid_out_bytes_on_the_chip():
    """The chip's own times: an op whose arrays are padded 4x moved its HBM bytes (as the compiler
    counts them, in the trace) at under 30% of HBM bandwidth, one with no padding at over 70%."""
    from tpudiag.analyze.compile.memory_space import hbm_padding
    from tpudiag.api.profiling import analyze_run

    module = _module()
    report = analyze_run(RUN)
    ops = {o.name: o for o in report.ops}
    hbm = report.device.hbm_bytes_per_s
    rates = {}
    for name in ("add_convert_fusion.11", "subtract_convert_fusion.8", "fusion.134", "fusion.130"):
        pad = hbm_padding(module, module.instruction(name, None))
        o = ops[name]
        rates[name] = (pad, o.measured.hbm_bytes_per_s / hbm)  # the trace's HBM bytes over the op's self time
    for name, (pad, used) in rates.items():
        if pad == 4.0:
            assert used < 0.3, (name, used)  # logical bytes at under 30% of HBM bandwidth...
            assert used * pad > 0.6  # ...which the laid-out bytes explain
        else:
            assert pad == 1.0 and used > 0.7, (name, used)
