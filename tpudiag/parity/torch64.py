"""A PyTorch function run in float64 throughout: the yardstick of `validate` for a torch reference.

`.double()` on the inputs is not enough: reference code asks for its precision explicitly
(`torch.arange(..., dtype=torch.float)`, `x.to(torch.float32)`, `.float()`, a bf16 cast before a
matmul), so a reference run that way still rounds where it was written to and its own error
against "float64" reads as zero. Inside `Float64Mode` (a `TorchFunctionMode`) every request for
float32, bfloat16 or float16 is rewritten to float64: the `dtype=` of any call (factories,
`softmax`, `sum`, `to`), a dtype passed to `.to`/`.type` positionally, and `.float()`, `.half()`,
`.bfloat16()`; the default dtype is float64 for the run. What it rewrote is counted, and
`note()` says where an output still came back in a lower precision (a value made outside torch's
functions: a NumPy float32 array turned into a tensor, a C++ extension).

`PrecisionMode(torch.bfloat16)` is the same rewrite toward the working precision: the reference's
twin, with its float32 (and float64, float16) requests made bfloat16 (validate's gradient
allowance: what the reference itself loses computed in the candidate's dtype).

With `shift` (signed multiples of eps, taken in turn), every `sum` and `cumsum` result is moved by
its rounding bound as parity/upcast.py does for JAX (a `sum` by eps x n x sum|terms|, a `cumsum` by
eps x n x its whole axis' sum|terms|): the tie analysis of validate's decisions. Sums inside fused
kernels (softmax's) are not seen.
"""

from __future__ import annotations

_FLOAT_NAMES = ("float64", "float32", "bfloat16", "float16")
_SUMS = ("sum", "cumsum")
_METHODS = {"double": "float64", "float": "float32", "half": "float16", "bfloat16": "bfloat16"}


def _mode_base():
    from torch.overrides import TorchFunctionMode

    return TorchFunctionMode


class PrecisionMode(_mode_base()):
    """Every floating dtype a function asks for made `target` (a torch dtype)."""

    def __init__(self, target, shift: tuple = ()):
        super().__init__()
        import torch

        self._torch = torch
        self.target = target
        self.shift, self._sums = shift, 0
        self._low = {getattr(torch, n) for n in _FLOAT_NAMES} - {target}
        self.rewritten: dict[str, int] = {}
        self._default = None

    def __enter__(self):
        self._default = self._torch.get_default_dtype()
        self._torch.set_default_dtype(self.target)
        return super().__enter__()

    def __exit__(self, *exc):
        self._torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def _count(self, what: str) -> None:
        self.rewritten[what] = self.rewritten.get(what, 0) + 1

    def _up(self, v, what: str):
        if isinstance(v, self._torch.dtype) and v in self._low:
            self._count(f"{what} {str(v).replace('torch.', '')}")
            return self.target
        return v

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in _METHODS and args and isinstance(args[0], self._torch.Tensor) and not kwargs \
                and getattr(self._torch, _METHODS[name]) in self._low:
            self._count(f".{name}()")
            return args[0].to(self.target)
        if "dtype" in kwargs:
            kwargs["dtype"] = self._up(kwargs["dtype"], f"dtype= of {name}")
        if name in ("to", "type"):
            args = tuple(self._up(a, f".{name}") for a in args)
        out = func(*args, **kwargs)
        if self.shift and name in _SUMS and isinstance(out, self._torch.Tensor) and out.is_floating_point() \
                and args and isinstance(args[0], self._torch.Tensor):
            out = out + self._next_shift() * self._bound(func, name, args, kwargs)
        return out

    def _next_shift(self) -> float:
        self._sums += 1
        return self.shift[(self._sums - 1) % len(self.shift)]

    def _bound(self, func, name: str, args, kwargs):
        """The sum's rounding bound (the handler runs with this mode off: these calls are plain)."""
        x = args[0]
        if name == "cumsum":
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            return x.shape[dim] * x.abs().sum(dim, keepdim=True)
        return func(self._torch.ones_like(x), *args[1:], **kwargs) * func(x.abs(), *args[1:], **kwargs)

    def note(self, outputs) -> str | None:
        """What the run says about itself: the casts it promoted, and any floating output that still
        came back below float64."""
        torch = self._torch
        low = [n for n, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.is_floating_point()
               and o.dtype != self.target]
        parts = []
        if self.rewritten:
            parts.append("the float64 run promoted " + ", ".join(f"{k} (x{v})" if v > 1 else k
                                                                   for k, v in sorted(self.rewritten.items())))
        if low:
            parts.append(f"output(s) {', '.join(map(str, low))} still came back in "
                         f"{outputs[low[0]].dtype}: something made outside torch's functions was not promoted, "
                         "so the reference's own error is understated there")
        return "; ".join(parts) or None


class Float64Mode(PrecisionMode):
    """The float64 run: every float32, bfloat16 and float16 request made float64."""

    def __init__(self, shift: tuple = ()):
        import torch

        super().__init__(torch.float64, shift)
