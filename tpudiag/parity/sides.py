"""The two sides of `tpudiag validate`: loading `FILE.py:FUNC` or `package.module:FUNC`, and
calling it as the kind of function it is.

- JAX (its module imports jax): called with JAX arrays of the inputs' dtypes; in float64 under
  `jax.enable_x64()` with floating inputs upcast; gradients by `jax.vjp`. A function that takes
  `interpret` (a Pallas wrapper) gets `interpret=True`: Pallas TPU kernels run on the CPU that way.
- NumPy (its module imports numpy, not jax or torch): a reference, called with float64 inputs; in
  its float64 run they are `Float64Array`s, whose `.astype(np.float32)` stays float64; it has no
  gradient.
- PyTorch (its module imports torch): tensors through NumPy; in float64 with the inputs `.double()`
  and every float32/bfloat16/float16 the function asks for (`.to`, `.float()`, `dtype=`) made
  float64 (parity/torch64.py); gradients by `torch.autograd`. tpudiag does not depend on torch;
  this kind needs it installed.

Every run gets its own copies of the inputs. The candidate, when it is JAX, runs under `jax.jit`
(as its user runs it; `--eager` for the other); the reference runs as written.

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
    jit: bool = False  # a JAX side run under jax.jit (the candidate: as its user runs it)
    rename: tuple[tuple[str, str], ...] = ()  # (input name, this side's parameter): `--bind`


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
    """What the function is written in: the modules its own module, its globals and its closure
    (a lambda that captured `torch`) hold."""
    target = inspect.unwrap(getattr(fn, "__wrapped__", fn))
    code, env = getattr(target, "__code__", None), getattr(target, "__globals__", {})
    # what the function itself uses first (a lambda in a test file that captured torch), then its module
    used = [env[n] for n in (code.co_names if code else ()) if n in env]
    used += [c.cell_contents for c in (getattr(target, "__closure__", None) or ()) if _filled(c)]
    names = _frameworks(used)
    if not names & {"jax", "torch"}:  # its module's names (its globals where the module is not registered)
        mod = sys.modules.get(getattr(target, "__module__", "") or "")
        names = _frameworks(list(vars(mod).values()) if mod else list(env.values()))
    # jax.jit objects have .lower; a jax.custom_vjp or custom_jvp object is JAX whatever it wraps
    if "jax" in names or hasattr(fn, "lower") or type(fn).__module__.split(".")[0] == "jax":
        return "jax"
    if "torch" in names:
        return "torch"
    return "numpy"


def _frameworks(values, depth: int = 1) -> set[str]:
    """The top-level packages of the modules and callables in `values`. A callable from a library
    built on one (a kernel from tpudiag.kernels, a Flax model's function) counts as what its own
    module holds, one level down: jax or torch, not the library's name."""
    values = list(values)
    names = ({getattr(v, "__name__", "").split(".")[0] for v in values if inspect.ismodule(v)}
             | {(getattr(v, "__module__", None) or "").split(".")[0] for v in values
                if callable(v) and not inspect.ismodule(v)})
    if depth and not names & {"jax", "torch"}:
        for v in values:
            mod = sys.modules.get(getattr(v, "__module__", None) or "") if callable(v) and not inspect.ismodule(v) \
                else None
            if mod is not None and mod.__name__.split(".")[0] not in ("builtins", "numpy"):
                names |= _frameworks(vars(mod).values(), depth - 1) & {"jax", "torch"}
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:  # an empty cell
        return False


def _params(fn: Callable) -> tuple[tuple[str, ...], bool, int]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return (), False, 0
    pos = [p for p in sig.parameters.values()
           if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "interpret"]
    return tuple(p.name for p in pos), "interpret" in sig.parameters, sum(p.default is p.empty for p in pos)


def side(fn_or_text, what: str, *, jit: bool = False) -> Side:
    """A side from `FILE.py:FUNC`, `package.module:FUNC`, or a Python callable; `jit`: a JAX side runs
    jitted (an already jitted function is not jitted again)."""
    if callable(fn_or_text):
        fn = fn_or_text
        label = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', getattr(fn, '__name__', 'fn'))}"
    else:
        fn, label = load_function(str(fn_or_text), what), str(fn_or_text)
    params, interp, required = _params(fn)
    kind = _kind(fn)
    return Side(label, fn, kind, params, interp, required, jit=jit and kind == "jax" and not hasattr(fn, "lower"))


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


def param_names(s: Side, names: tuple[str, ...]) -> tuple[str, ...]:
    """The parameter each named input binds to on this side: its own name, or the one `--bind` gave."""
    rename = dict(s.rename)
    return tuple(rename.get(n, n) for n in names)


def by_name(s: Side, names: tuple[str, ...]) -> bool:
    """Whether the inputs go in by keyword (the function names every one of them) or in order (a
    function whose parameters cannot be read, or inputs a generator returned as a tuple)."""
    return bool(s.params) and all(n in s.params for n in param_names(s, names))


def _invoke(s: Side, named: list[tuple[str, Any]], kw: dict):
    names = tuple(n for n, _ in named)
    if by_name(s, names):
        return s.fn(**dict(zip(param_names(s, names), (a for _, a in named))), **kw)
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
    """One run of the side: at the inputs' dtypes, or in float64 (`f64`; a NumPy side always). Each
    run gets its own copies of the inputs: a side that writes into them (`logits.div_(t)`) changes
    nothing the other sees. A JAX side with `jit` runs jitted, as its user runs it."""
    kw = _kw(s, static)
    if s.kind == "numpy":
        wrap = (lambda a: a.astype(np.float64).view(Float64Array)) if f64 else (lambda a: a.astype(np.float64))
        out = _invoke(s, [(n, wrap(a) if is_float(a) else a.copy()) for n, a in named], kw)
        return [np.asarray(x).view(np.ndarray) for x in leaves(out)]
    if s.kind == "torch":
        return torch_call(s, named, static, f64=f64)[0]
    import jax

    if f64:
        return float64_call(s, named, static)[0]
    args = [(n, _jax(a, False)) for n, a in named]
    if s.jit:
        out = _jitted(_key(s, named, static, "run"), lambda: _positional(s, named, kw))(*[a for _, a in args])
    else:
        out = _invoke(s, args, kw)
    return [np.asarray(x) for x in leaves(jax.block_until_ready(out))]


_LOW_NP = (np.float32, np.float16)


class Float64Array(np.ndarray):
    """A NumPy reference's inputs in its float64 run: `.astype(np.float32)` (or float16, or
    bfloat16) on them and on every array computed from them stays float64, so a reference that
    casts explicitly is measured against a true float64 run. Arrays it makes from nothing
    (`np.zeros(..., dtype=np.float32)`) are not seen."""

    def astype(self, dtype, *args, **kwargs):
        d = np.dtype(dtype)
        if d in _LOW_NP or d.name == "bfloat16":
            d = np.dtype(np.float64)
        return super().astype(d, *args, **kwargs)


def torch_call(s: Side, named: list[tuple[str, np.ndarray]], static: dict, *,
               f64: bool = False, shift: tuple = ()) -> tuple[list[np.ndarray], str | None]:
    """A PyTorch side's run; in float64 (`f64`) with every float32, bfloat16 and float16 the function
    asks for made float64 too (parity/torch64.py), and a note where that left something lower;
    `shift`: every sum moved by its rounding bound times these signed eps, in turn (validate's ties)."""
    import torch

    kw = _kw(s, static)
    with torch.no_grad():
        if not f64:
            return leaves(_invoke(s, [(n, _to_torch(a, False)) for n, a in named], kw)), None
        from tpudiag.parity.torch64 import Float64Mode

        with Float64Mode(shift) as mode:
            out = _flat(_invoke(s, [(n, _to_torch(a, True)) for n, a in named], kw))
        return leaves(out), mode.note(out)


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


def float64_call(s: Side, named: list[tuple[str, np.ndarray]], static: dict,
                 shift: tuple = ()) -> tuple[list[np.ndarray], str | None]:
    """A JAX side evaluated in float64 throughout (parity/upcast.py), or, where that cannot be done,
    under x64 as written; the second item says which when it is the latter. `shift`: every sum
    moved by its rounding bound times these signed eps, in turn (validate's ties; as written,
    nothing moves)."""
    import jax

    from tpudiag.parity.upcast import Unsupported, in_float64

    kw = _kw(s, static)
    with jax.enable_x64():
        args = [_jax(a, True) for _, a in named]
        try:
            out = _jitted(_key(s, named, static, "float64", shift),
                          lambda: in_float64(_positional(s, named, kw), {}, shift))(*args)
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
          *, f64: bool = False, twin: str | None = None, wide_sums: bool = False) -> list[np.ndarray]:
    """d/d named[wrt] of sum(output * cotangent) over the floating outputs. `twin` (a dtype name):
    the side's working-precision twin instead, every floating input and value it computes in that
    dtype (torch: `PrecisionMode`; JAX: `upcast.in_dtype`, which raises `Unsupported` where it
    cannot). `wide_sums` (a JAX side): the gradient with its 16-bit sums added in float32
    (parity/wide_sums.py)."""
    kw = _kw(s, static)
    if s.kind == "numpy":
        raise InputError(f"{s.label}: a NumPy function has no gradient; --grad needs a JAX or PyTorch reference")
    if s.kind == "torch":
        import contextlib

        import torch

        def arg(a):
            if twin is not None and is_float(a):
                return _to_torch(a, True).to(getattr(torch, twin))
            return _to_torch(a, f64)

        leaf = {i: arg(named[i][1]).requires_grad_(True) for i in wrt}
        # the function gets a copy of each leaf: one that writes into its input (`x.div_(t)`) works
        ts = [(n, leaf[i].clone() if i in leaf else arg(a)) for i, (n, a) in enumerate(named)]
        if f64 or twin is not None:
            from tpudiag.parity.torch64 import PrecisionMode
            mode = PrecisionMode(getattr(torch, twin) if twin is not None else torch.float64)
        else:
            mode = contextlib.nullcontext()
        with mode:
            outs = _flat(_invoke(s, ts, kw))
        loss = sum((o.double() * torch.from_numpy(np.asarray(c, np.float64))).sum()
                   for o, c in zip(outs, cotangents) if c is not None)
        loss.backward()
        return [leaf[i].grad.double().numpy() for i in wrt]
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
        if twin is not None:
            full = [jnp.asarray(a.astype(_np_float(twin)) if is_float(a) else a) for _, a in named]
        else:
            full = [_jax(a, f64) for _, a in named]
        dt = jnp.float64 if f64 else jnp.float32
        cts = [None if c is None else jnp.asarray(c, dt) for c in cotangents]
        if wide_sums:
            from tpudiag.parity.wide_sums import widened

            g = _jitted(_key(s, named, static, "grad wide", tag, wrt), lambda: widened(make(fn, dt)))(full, cts)
        else:
            g = _jitted(_key(s, named, static, "grad", tag, wrt), lambda: make(fn, dt))(full, cts)
        return [np.asarray(x) for x in g]

    plain = _positional(s, named, kw)
    if twin is not None:
        from tpudiag.parity.upcast import in_dtype

        return run(in_dtype(plain, {}, twin), f"twin {twin}")
    if f64:
        from tpudiag.parity.upcast import Unsupported, in_float64

        with jax.enable_x64():
            try:
                return run(in_float64(plain, {}), "float64")
            except Unsupported:
                return run(plain, "x64")
    return run(plain, "plain")


def _np_float(name: str):
    """A NumPy dtype for a float dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)
