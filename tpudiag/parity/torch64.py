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
"""

from __future__ import annotations

_LOW_NAMES = ("float32", "bfloat16", "float16")
_METHODS = {"float": "float32", "half": "float16", "bfloat16": "bfloat16"}


def _mode_base():
    from torch.overrides import TorchFunctionMode

    return TorchFunctionMode


class Float64Mode(_mode_base()):
    def __init__(self):
        super().__init__()
        import torch

        self._torch = torch
        self._low = {getattr(torch, n) for n in _LOW_NAMES}
        self.rewritten: dict[str, int] = {}
        self._default = None

    def __enter__(self):
        self._default = self._torch.get_default_dtype()
        self._torch.set_default_dtype(self._torch.float64)
        return super().__enter__()

    def __exit__(self, *exc):
        self._torch.set_default_dtype(self._default)
        return super().__exit__(*exc)

    def _count(self, what: str) -> None:
        self.rewritten[what] = self.rewritten.get(what, 0) + 1

    def _up(self, v, what: str):
        if isinstance(v, self._torch.dtype) and v in self._low:
            self._count(f"{what} {str(v).replace('torch.', '')}")
            return self._torch.float64
        return v

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in _METHODS and args and isinstance(args[0], self._torch.Tensor) and not kwargs:
            self._count(f".{name}()")
            return args[0].to(self._torch.float64)
        if "dtype" in kwargs:
            kwargs["dtype"] = self._up(kwargs["dtype"], f"dtype= of {name}")
        if name in ("to", "type"):
            args = tuple(self._up(a, f".{name}") for a in args)
        return func(*args, **kwargs)

    def note(self, outputs) -> str | None:
        """What the run says about itself: the casts it promoted, and any floating output that still
        came back below float64."""
        torch = self._torch
        low = [n for n, o in enumerate(outputs) if isinstance(o, torch.Tensor) and o.is_floating_point()
               and o.dtype != torch.float64]
        parts = []
        if self.rewritten:
            parts.append("the float64 run promoted " + ", ".join(f"{k} (x{v})" if v > 1 else k
                                                                   for k, v in sorted(self.rewritten.items())))
        if low:
            parts.append(f"output(s) {', '.join(map(str, low))} still came back in "
                         f"{outputs[low[0]].dtype}: something made outside torch's functions was not promoted, "
                         "so the reference's own error is understated there")
        return "; ".join(parts) or None
