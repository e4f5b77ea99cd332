"""Whether a module is a program's setup (random-number setup, eager initializers, staging, a
reduction of a result) rather than its work, read from the module's text: StableHLO (a JAX IR dump,
a compile's `input.mlir`) or HLO (XLA's dumps, before or after optimizations).

One rule for every command: `compile SCRIPT` leaves setup modules out of the compile
(`capture/tpu_compile.py`), and the compile and profile reports give them one line instead of a
section (`api/pipeline.py`, `api/profiling.py`). Reads bytes; returns a bool; builds no model.
"""

from __future__ import annotations

import re
from pathlib import Path

# What makes a module work for a TPU: matmuls, sorts, top-k, scatters, collectives (StableHLO and
# HLO spellings), and kernels (custom calls, below). Not loops: jax's threefry is a 5-trip while loop.
_WORK = re.compile(rb"stablehlo\.(?:dot_general|dot|convolution|sort|all_reduce|all_gather|"
                   rb"reduce_scatter|all_to_all|collective_permute|scatter)\b|chlo\.top_k|"
                   rb"\s(?:dot|convolution|sort|topk|all-reduce|all-reduce-start|all-gather|"
                   rb"all-gather-start|reduce-scatter|all-to-all|collective-permute|collective-permute-start|"
                   rb"scatter)\(")
# A custom call's target: `stablehlo.custom_call @tpu_custom_call(` or HLO's `custom_call_target="..."`.
_CUSTOM_CALL = re.compile(rb'stablehlo\.custom_call @"?([\w.$-]+)|custom_call_target="([^"]+)"')
# Custom calls that are annotations for XLA's partitioner, not kernels: XLA's HLO of an eager
# `jax.random.normal` holds a `Sharding` call on its key.
_ANNOTATIONS = frozenset({b"Sharding", b"SPMDFullToShardShape", b"SPMDShardToFullShape"})
# The entry's arguments: `func.func public @main(%arg0: tensor<4x8xf32> ...) -> ...` or HLO's
# `ENTRY %main (p0: f32[4,8]{1,0}, ...) -> ...`.
_MLIR_MAIN = re.compile(rb"func\.func public @main\((.*?)\)\s*->", re.S)
_HLO_ENTRY = re.compile(rb"^ENTRY [^(]*\((.*?)\)\s*->", re.S | re.M)
_MLIR_TENSOR = re.compile(rb"tensor<((?:[0-9?]+x)*)([a-zA-Z][a-zA-Z0-9]*)")
_HLO_ARRAY = re.compile(rb"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
# A setup module takes at most this much in (a key, a shape, one activation), however much it
# writes out: an eager op on the model's weights (a 7B model's 256 MiB embedding) is not setup.
SETUP_ARGUMENT_BYTES = 16 << 20
# The rule in words, for the reports' setup line.
SETUP_RULE = f"no matmul, kernel, sort, scatter or collective; at most {SETUP_ARGUMENT_BYTES >> 20} MiB of arguments"
_MLIR_BYTECODE = b"ML\xefR"


def _bits(dtype: str) -> int:
    m = re.search(r"(\d+)", dtype)
    return 1 if dtype in ("i1", "pred") else int(m.group(1)) if m else 32


def argument_bytes(data: bytes) -> int | None:
    """The bytes of the entry computation's arguments (a dynamic dimension counts 1); None where
    the text has no entry this can read."""
    m = _MLIR_MAIN.search(data)
    if m:
        arrays = [([d for d in dims.decode().split("x") if d], t.decode()) for dims, t in _MLIR_TENSOR.findall(m.group(1))]
    else:
        m = _HLO_ENTRY.search(data)
        if not m:
            return None
        arrays = [([d for d in dims.decode().split(",") if d], t.decode()) for t, dims in _HLO_ARRAY.findall(m.group(1))]
    total = 0
    for dims, dtype in arrays:
        n = 1
        for d in dims:
            n *= int(d) if d.isdigit() else 1
        total += n * _bits(dtype) // 8
    return total


def is_setup_text(data: bytes) -> bool:
    """A module with nothing for a TPU to be slow at (`SETUP_RULE`). MLIR bytecode is never one:
    its ops cannot be read here."""
    if data[:4] == _MLIR_BYTECODE or _WORK.search(data):
        return False
    if any((a or b) not in _ANNOTATIONS for a, b in _CUSTOM_CALL.findall(data)):
        return False
    nbytes = argument_bytes(data)
    return nbytes is not None and nbytes <= SETUP_ARGUMENT_BYTES


def is_setup_module(path: Path) -> bool:
    """`is_setup_text` of the module file at `path`."""
    return is_setup_text(Path(path).read_bytes())
