"""The two sides of `tpudiag validate`: loading `FILE.py:FUNC` or `package.module:FUNC`, and
calling it as the kind of function it is.

- JAX (its module imports jax): called with JAX arrays of the inputs' dtypes; in float64 under
  `jax.enable_x64()` with floating inputs upcast; gradients by `jax.vjp`. A function that takes
  `interpret` (a Pallas wrapper) gets `interpret=True`: Pallas TPU kernels run on the CPU that way.
- NumPy (its module imports numpy, not jax or torch): a reference written in float64, called with
  float64 inputs as given; it has no gradient.
- PyTorch (its module imports torch): tensors through NumPy, float64 by `.double()`, gradients by
  `torch.autograd`. tpudiag does not depend on torch; this kind needs it installed.

Outputs come back as a flat list of NumPy arrays (a pytree's leaves, a tuple's items).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tpudiag.errors import InputError, one_line


@dataclass(frozen=True)
class Side:
    label: str  # as the user wrote it
    fn: Callable
    kind: str  # jax | numpy | torch
    params: tuple[str, ...]  # the positional parameter names, in order
    takes_interpret: bool
    required: int = 0  # how many of them have no default


def load_module(text: str, what: str):
    """A module from `FILE.py` (its directory first on sys.path while it imports) or a dotted name."""
    if text.endswith(".py") or "/" in text:
        path = Path(text)
        if not path.is_file():
            raise InputError(f"{text}: no such file")
        name = f"tpudiag_user_{abs(hash(str(path.resolve())))}"
        if name in sys.modules:
            return sys.modules[name]
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise InputError(f"{text}: importing it raised {one_line(e, 300)}") from e
        finally:
            sys.path.remove(str(path.resolve().parent))
        return module
    try:
        return importlib.import_module(text)
    except ImportError as e:
        raise InputError(f"{text}: cannot import the {what} module ({one_line(e, 200)})") from e


def load_function(text: str, what: str) -> Callable:
    if ":" not in text:
        raise InputError(f"{text}: the {what} is FILE.py:FUNCTION or package.module:FUNCTION")
    where, name = text.rsplit(":", 1)
    module = load_module(where, what)
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                         and getattr(v, "__module__", None) == module.__name__)
        raise InputError(f"{where}: no function {name!r} (it defines: {', '.join(defined) or 'none'})")
    return fn


def _kind(fn: Callable) -> str:
    target = inspect.unwrap(getattr(fn, "__wrapped__", fn))
    mod = sys.modules.get(getattr(target, "__module__", "") or "")
    names = {getattr(v, "__name__", "").split(".")[0] for v in vars(mod).values()} if mod else set()
    if "jax" in names or hasattr(fn, "lower"):  # jax.jit objects have .lower
        return "jax"
    if "torch" in names:
        return "torch"
    return "numpy"


def _params(fn: Callable) -> tuple[tuple[str, ...], bool, int]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return (), False, 0
    pos = [p for p in sig.parameters.values()
           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "interpret"]
    return tuple(p.name for p in pos), "interpret" in sig.parameters, sum(p.default is p.empty for p in pos)


def side(fn_or_text, what: str) -> Side:
    """A side from `FILE.py:FUNC`, `package.module:FUNC`, or a Python callable."""
    if callable(fn_or_text):
        fn = fn_or_text
        label = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', getattr(fn, '__name__', 'fn'))}"
    else:
        fn, label = load_function(str(fn_or_text), what), str(fn_or_text)
    params, interp, required = _params(fn)
    return Side(label, fn, _kind(fn), params, interp, required)


def _flat(out: Any) -> list:
    """A pytree's leaves as they are: dicts by sorted key, tuples and lists in order."""
    if isinstance(out, dict):
        return [x for k in sorted(out) for x in _flat(out[k])]
    if isinstance(out, (tuple, list)):
        return [x for o in out for x in _flat(o)]
    return [out]


def _numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        t = x.detach().cpu()
        return t.float().numpy() if str(t.dtype) == "torch.bfloat16" else t.numpy()
    return np.asarray(x)


def leaves(out: Any) -> list[np.ndarray]:
    """The outputs as NumPy arrays: a pytree's leaves (dicts by sorted key), a tuple's items."""
    return [_numpy(x) for x in _flat(out)]


def is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or str(a.dtype) == "bfloat16"


def by_name(s: Side, names: tuple[str, ...]) -> bool:
    """Whether the inputs go in by keyword (the function names every one of them) or in order."""
    return bool(s.params) and all(n in s.params for n in names)


def _invoke(s: Side, named: list[tuple[str, Any]], kw: dict):
    names = tuple(n for n, _ in named)
    if by_name(s, names):
        return s.fn(**{n: a for n, a in named}, **kw)
    return s.fn(*[a for _, a in named], **kw)


def _kw(s: Side, static: dict) -> dict:
    kw = dict(static)
    if s.takes_interpret:
        kw.setdefault("interpret", True)
    return kw


def _jax(a: np.ndarray, f64: bool):
    import jax.numpy as jnp

    return jnp.asarray(a.astype(np.float64) if f64 and is_float(a) else a)


def call(s: Side, named: list[tuple[str, np.ndarray]], static: dict, *, f64: bool = False) -> list[np.ndarray]:
    """One run of the side: at the inputs' dtypes, or in float64 (`f64`; a NumPy side always)."""
    kw = _kw(s, static)
    if s.kind == "numpy":
        return leaves(_invoke(s, [(n, a.astype(np.float64) if is_float(a) else a) for n, a in named], kw))
    if s.kind == "torch":
        import torch

        with torch.no_grad():
            return leaves(_invoke(s, [(n, _to_torch(a, f64)) for n, a in named], kw))
    import jax

    if f64:
        return float64_call(s, named, static)[0]
    out = _invoke(s, [(n, _jax(a, False)) for n, a in named], kw)
    return [np.asarray(x) for x in leaves(jax.block_until_ready(out))]


def _positional(s: Side, named, kw):
    names = [n for n, _ in named]
    return lambda *xs: _invoke(s, list(zip(names, xs)), kw)


_JITTED: dict = {}


def _jitted(key: tuple, make: Callable) -> Callable:
    """One `jax.jit` per (side, inputs' names, static arguments, purpose): each regime of a run
    reuses its compile for the same shapes (eager dispatch would compile every primitive)."""
    import jax

    if key not in _JITTED:
        _JITTED[key] = jax.jit(make())
    return _JITTED[key]


def clear_compiled() -> None:
    """Forget the jitted runs of earlier pairs (a long pytest session validates many)."""
    _JITTED.clear()


def _key(s: Side, named, static: dict, *more) -> tuple:
    return (id(s.fn), s.label, tuple(n for n, _ in named), repr(sorted(static.items())), *more)


def float64_call(s: Side, named: list[tuple[str, np.ndarray]], static: dict) -> tuple[list[np.ndarray], str | None]:
    """A JAX side evaluated in float64 throughout (parity/upcast.py), or, where that cannot be done,
    under x64 as written; the second item says which when it is the latter."""
    import jax

    from tpudiag.parity.upcast import Unsupported, in_float64

    kw = _kw(s, static)
    with jax.enable_x64():
        args = [_jax(a, True) for _, a in named]
        try:
            out = _jitted(_key(s, named, static, "float64"), lambda: in_float64(_positional(s, named, kw), {}))(*args)
            return [np.asarray(x) for x in leaves(jax.block_until_ready(out))], None
        except Unsupported as e:
            out = _invoke(s, list(zip([n for n, _ in named], args)), kw)
            return ([np.asarray(x) for x in leaves(jax.block_until_ready(out))],
                    f"{s.label} ran under x64 as written, not re-evaluated in float64 ({e}): its explicit "
                    "casts still round, so its own error is understated")


def _to_torch(a: np.ndarray, f64: bool):
    import torch

    if is_float(a):
        t = torch.from_numpy(np.asarray(a, np.float64).copy())
        return t if f64 else t.to({"bfloat16": torch.bfloat16, "float16": torch.float16}.get(str(a.dtype),
                                                                                               torch.float32))
    return torch.from_numpy(np.asarray(a).copy())


def grads(s: Side, named: list[tuple[str, np.ndarray]], static: dict, cotangents: list, wrt: tuple[int, ...],
          *, f64: bool = False) -> list[np.ndarray]:
    """d/d named[wrt] of sum(output * cotangent) over the floating outputs."""
    kw = _kw(s, static)
    if s.kind == "numpy":
        raise InputError(f"{s.label}: a NumPy function has no gradient; --grad needs a JAX or PyTorch reference")
    if s.kind == "torch":
        import torch

        ts = [(n, _to_torch(a, f64)) for n, a in named]
        for i in wrt:
            ts[i][1].requires_grad_(True)
        outs = _flat(_invoke(s, ts, kw))
        loss = sum((o.double() * torch.from_numpy(np.asarray(c, np.float64))).sum()
                   for o, c in zip(outs, cotangents) if c is not None)
        loss.backward()
        return [ts[i][1].grad.double().numpy() for i in wrt]
    import jax
    import jax.numpy as jnp

    def make(fn, dt):
        def g(full, cts):
            def loss(*diff):
                xs = list(full)
                for i, d in zip(wrt, diff):
                    xs[i] = d
                outs = jax.tree_util.tree_leaves(fn(*xs))
                return sum(jnp.sum(o.astype(dt) * c.astype(dt)) for o, c in zip(outs, cts) if c is not None)

            return jax.grad(loss, argnums=tuple(range(len(wrt))))(*(full[i] for i in wrt))
        return g

    def run(fn, tag):
        full = [_jax(a, f64) for _, a in named]
        dt = jnp.float64 if f64 else jnp.float32
        cts = [None if c is None else jnp.asarray(c, dt) for c in cotangents]
        g = _jitted(_key(s, named, static, "grad", tag, wrt), lambda: make(fn, dt))(full, cts)
        return [np.asarray(x) for x in g]

    plain = _positional(s, named, kw)
    if f64:
        from tpudiag.parity.upcast import Unsupported, in_float64

        with jax.enable_x64():
            try:
                return run(in_float64(plain, {}), "float64")
            except Unsupported:
                return run(plain, "x64")
    return run(plain, "plain")

