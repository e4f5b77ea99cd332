"""The inputs of `tpudiag validate`: a shape/dtype spec, the input regimes, and a user's generator.

A spec names each argument, its dtype and shape, integers with an optional inclusive range:

    q=bf16[2,8,1000,128] k=bf16[2,2,1000,128] lengths=s32[2]{1..1000} mask=bool[2,1000]

Each regime draws fresh values (never zeros alone) from a NumPy generator seeded per case, in
float64, then rounds them to the argument's dtype: both sides and the float64 run see the same
values. `REGIMES` says what each one is for. A generator `make_inputs(seed, regime)` replaces the
spec; it returns the positional arguments (a tuple or list) or keyword arguments (a dict), or None
for a regime it does not make.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import numpy as np

from tpudiag.errors import InputError

# dtype spellings -> NumPy/JAX names.
DTYPES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "f16": "float16", "float16": "float16", "f32": "float32",
    "float32": "float32", "f64": "float64", "float64": "float64", "s8": "int8", "int8": "int8", "s16": "int16",
    "int16": "int16", "s32": "int32", "int32": "int32", "s64": "int64", "int64": "int64", "u8": "uint8",
    "uint8": "uint8", "u32": "uint32", "uint32": "uint32", "pred": "bool", "bool": "bool",
}
FLOATS = frozenset({"bfloat16", "float16", "float32", "float64"})

# name -> (what it draws, why). Float regimes apply to floating arguments; the others to the
# argument kinds named in `applies_to`.
REGIMES = {
    "normal": "standard normal values: the baseline",
    "heavy_tails": "Student-t with 2 degrees of freedom: rare values far out, as activations have",
    "outliers": "normal values with 0.5% of them 1000x larger: a max or a scale taken from one element",
    "cancellation": "pairs of nearly equal values of opposite sign along the last axis: a sum that cancels",
    "offset": "a large common offset (1e4 +- 1 in f32, 32 +- 1 in bf16): a one-pass variance or a naive "
              "sum loses every significant digit",
    "large_logits": "values of magnitude 1e3-1e4: a softmax or logsumexp without its max subtraction overflows",
    "tiny": "small magnitudes, 1e-2 to 1e-5 and the dtype's smallest normal numbers (one scale per row of "
            "the last axis), with exact zeros: an eps in the wrong place, a division by a vanishing sum of "
            "squares, underflow",
    "ties": "values from a set of five: top-k, argmax and sort must break ties as the reference does",
    "masked_rows": "boolean masks with whole rows False (a fully masked query or a padded sequence)",
    "bounds": "integer arguments at the ends of their range (lengths 0 and the maximum, the first and "
              "last index)",
    "odd_lengths": "every size above 8 that is a multiple of 8 and some argument's non-last dimension made 3 "
                   "shorter wherever it appears: lengths that are not a multiple of 8 or 128 reach the padding "
                   "and masking code",
}
_FLOAT_REGIMES = ("normal", "heavy_tails", "outliers", "cancellation", "offset", "large_logits", "tiny", "ties")
_OFFSET = {"bfloat16": 32.0, "float16": 256.0, "float32": 1e4, "float64": 1e8}
_TINY = {"bfloat16": 2.0 ** -126, "float16": 2.0 ** -14, "float32": 2.0 ** -126, "float64": 2.0 ** -1022}

_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=([A-Za-z0-9]+)\[([0-9, ]*)\](?:\{(-?\d+)\.\.(-?\d+)\})?$")


# The most the drawn inputs may take (in float64, before rounding): each side, the float64 run and
# the shrinking hold copies, so a spec near the machine's memory is refused before allocation.
MAX_INPUT_BYTES = 4 * 2**30


@dataclass(frozen=True)
class ArgSpec:
    name: str
    dtype: str  # NumPy/JAX name
    shape: tuple[int, ...]
    low: int | None = None  # integers: the inclusive range
    high: int | None = None

    @property
    def kind(self) -> str:
        return "float" if self.dtype in FLOATS else ("bool" if self.dtype == "bool" else "int")

    def text(self) -> str:
        rng = f"{{{self.low}..{self.high}}}" if self.low is not None else ""
        return f"{self.name}={self.dtype}[{','.join(map(str, self.shape))}]{rng}"


def parse_spec(text: str) -> tuple[ArgSpec, ...]:
    """`q=bf16[2,8,128] lengths=s32[2]{1..128}` -> ArgSpecs; an InputError naming the bad item."""
    out = []
    for item in text.replace(";", " ").split():
        m = _ARG.match(item)
        if not m:
            raise InputError(f"--inputs: {item!r} is not NAME=DTYPE[D0,D1,...] (for example q=bf16[2,8,128,64], "
                             "lengths=s32[2]{0..128})")
        name, dt, dims, lo, hi = m.groups()
        if dt.lower() not in DTYPES:
            raise InputError(f"--inputs: {item!r}: unknown dtype {dt!r} (one of bf16, f16, f32, f64, s8, s32, s64, "
                             "u8, u32, bool)")
        shape = tuple(int(d) for d in dims.replace(" ", "").split(",") if d)
        if any(d <= 0 for d in shape):
            raise InputError(f"--inputs: {item!r}: dimensions must be positive")
        dtype = DTYPES[dt.lower()]
        if lo is not None and (dtype in FLOATS or dtype == "bool" or int(lo) > int(hi)):
            raise InputError(f"--inputs: {item!r}: a range {{LOW..HIGH}} (LOW <= HIGH) is for integer arguments")
        if any(a.name == name for a in out):
            raise InputError(f"--inputs: {name!r} is given twice")
        out.append(ArgSpec(name, dtype, shape, None if lo is None else int(lo), None if hi is None else int(hi)))
    if not out:
        raise InputError("--inputs: no arguments given (NAME=DTYPE[D0,...] ...)")
    need = sum(8 * int(np.prod(a.shape)) for a in out)  # each value is drawn in float64 first
    if need > MAX_INPUT_BYTES:
        big = max(out, key=lambda a: int(np.prod(a.shape)))
        raise InputError(f"--inputs: the inputs take {need / 2**30:.3g} GiB to draw ({big.text()} alone is "
                         f"{int(np.prod(big.shape)):,} elements), over the {MAX_INPUT_BYTES / 2**30:.3g} GiB "
                         "validate allows; give smaller shapes (a failure shows at small sizes too)")
    return tuple(out)


def regimes_for(specs: tuple[ArgSpec, ...] | None, asked: str) -> tuple[str, ...]:
    """The regimes to run: `asked` is `all` or a comma list. `all` keeps those that apply to the
    arguments (a generator: every regime, each one it returns None for is skipped)."""
    names = tuple(REGIMES) if asked.strip() == "all" else tuple(r.strip() for r in asked.split(",") if r.strip())
    unknown = [r for r in names if r not in REGIMES]
    if unknown or not names:
        raise InputError(f"--regimes: unknown regime {', '.join(unknown) or '(none)'}; one or more of "
                         f"{', '.join(REGIMES)}, or all")
    if specs is None or asked.strip() != "all":
        return names
    kinds = {s.kind for s in specs}
    return tuple(r for r in names if (r in _FLOAT_REGIMES and "float" in kinds)
                 or (r == "masked_rows" and "bool" in kinds)
                 or (r == "bounds" and "int" in kinds) or (r == "odd_lengths" and shrink_map(specs, odd=True)))


def shrink_map(specs: tuple[ArgSpec, ...], odd: bool = False) -> dict[int, int]:
    """A map of dimension sizes applied alike to every dimension of every argument (so q's and k's
    sequence, or a batch and its lengths vector, stay equal): `odd`: each size above 8 that is a
    multiple of 8 and some argument's non-last dimension -> 3 less, unless it is also some argument's
    last dimension (a feature or head dimension, a weight's: `x=[2,64,4,64]` keeps its 64s, both, as
    one size is one map entry); else each size above 1 -> half of it."""
    if odd:
        inner = {d for s in specs for d in s.shape[:-1]}
        features = {s.shape[-1] for s in specs if s.shape}  # a head or hidden size, a weight's
        return {d: d - 3 for d in inner - features if d > 8 and d % 8 == 0}
    return {d: max(1, d // 2) for s in specs for d in s.shape if d > 1}


def resized(specs: tuple[ArgSpec, ...], sizes: dict[int, int]) -> tuple[ArgSpec, ...]:
    out = []
    for s in specs:
        shape = tuple(sizes.get(d, d) for d in s.shape)
        high = s.high
        if high is not None and s.high in sizes:  # a length bounded by a resized dimension follows it
            high = sizes[s.high]
        out.append(replace(s, shape=shape, high=high))
    return tuple(out)


def _float_values(rng: np.random.Generator, shape, dtype: str, regime: str) -> np.ndarray:
    n = int(np.prod(shape)) if shape else 1
    if regime == "heavy_tails":
        x = rng.standard_t(2, n)
    elif regime == "outliers":
        x = rng.standard_normal(n)
        k = max(1, n // 200)
        x[rng.choice(n, k, replace=False)] *= 1e3
    elif regime == "cancellation":
        x = rng.standard_normal(n)
        x[1::2] = -x[0::2][: len(x[1::2])] * (1 + 64 * np.finfo(np.float32).eps * rng.standard_normal(len(x[1::2])))
    elif regime == "offset":
        x = _OFFSET[dtype] + rng.standard_normal(n)
    elif regime == "large_logits":
        x = rng.choice([-1.0, 1.0], n) * rng.uniform(1e3, 1e4, n)
    elif regime == "tiny":
        # One magnitude per row of the last axis (a 1-D argument: per element), so that a row's
        # statistics are small throughout, as a normalization meets them.
        last = shape[-1] if len(shape) >= 2 else 1
        scales = np.array([1e-2, 1e-3, 1e-4, 1e-5, 4 * _TINY[dtype]])
        row_scale = scales[rng.integers(0, len(scales), n // last)]
        row_scale[0] = 1e-4
        x = rng.standard_normal(n) * np.repeat(row_scale, last)
        x[rng.random(n) < 0.1] = 0.0
        x[0] = 1e-4  # never zeros alone
    elif regime == "ties":
        x = rng.choice([-1.0, -0.5, 0.0, 0.5, 1.0], n)
    else:
        x = rng.standard_normal(n)
    return x.reshape(shape)


def _int_values(rng: np.random.Generator, s: ArgSpec, regime: str) -> np.ndarray:
    info = np.iinfo(np.dtype(s.dtype))
    low = s.low if s.low is not None else 0
    high = s.high if s.high is not None else min(info.max, (s.shape[-1] if s.shape else 100) - 1)
    if regime == "bounds":
        x = rng.choice([low, high], size=s.shape)
        x.flat[0] = low
        if x.size > 1:
            x.flat[-1] = high
        return x.astype(s.dtype)
    return rng.integers(low, high, size=s.shape, endpoint=True).astype(s.dtype)


def _bool_values(rng: np.random.Generator, shape, regime: str) -> np.ndarray:
    x = rng.random(shape) < 0.7
    if regime == "masked_rows" and len(shape) >= 1:
        rows = x.reshape(-1, shape[-1])
        rows[:: max(1, len(rows) // 4)] = False  # a quarter of the rows, the first one included
        x = rows.reshape(shape)
    elif x.size:
        x.flat[0] = True
    return x


def make_args(specs: tuple[ArgSpec, ...], regime: str, seed: int) -> list[np.ndarray]:
    """Each argument's values for `regime`, as NumPy arrays of the argument's dtype (bfloat16 via
    ml_dtypes, which jax brings). `odd_lengths` resizes before drawing normal values."""
    import ml_dtypes  # noqa: F401  (registers bfloat16 with NumPy)

    if regime == "odd_lengths":
        specs = resized(specs, shrink_map(specs, odd=True))
        regime = "normal"
    rng = np.random.default_rng(seed)
    out = []
    for s in specs:
        if s.kind == "float":
            x = _float_values(rng, s.shape, s.dtype, regime)
            out.append(np.asarray(x, dtype=np.dtype(_np_dtype(s.dtype))))
        elif s.kind == "bool":
            out.append(_bool_values(rng, s.shape, regime))
        else:
            out.append(_int_values(rng, s, regime))
    return out


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return name
