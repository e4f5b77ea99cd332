"""Which modules a command works on: `--function NAME` and `--module NAME|INDEX`, for the modules a
script compiles (before they are compiled) and for those of a run directory (before they are read).

Modules are numbered as the run directory names them (`modules/03-jit_forward`): the order jax
compiled them. An INDEX picks one module, so that several modules of one name (five eager
`jit__normal` initializers) can be told apart; a NAME picks every module of that name, or, when
none has it exactly, every module whose name contains it; a function `f` is the module jax named
`jit_f` (or `pjit_f`, or `f` itself). Nothing here reads a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.errors import InputError


@dataclass(frozen=True)
class Selection:
    """`--function` and `--module` values; empty: every module."""

    functions: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.functions or self.modules)

    def describe(self) -> str:
        parts = [f"--function {f}" for f in self.functions] + [f"--module {m}" for m in self.modules]
        return " ".join(parts)


def listing(names: list[str], numbers: list[int] | None = None, limit: int = 12) -> str:
    """`00 jit_stage, 01 jit__normal, ...`: the numbered names, for an error message."""
    numbers = numbers if numbers is not None else list(range(len(names)))
    shown = [f"{k:02d} {n}" for k, n in zip(numbers, names)][:limit]
    more = f", ... ({len(names)} in all)" if len(names) > limit else ""
    return ", ".join(shown) + more


def pick(names: list[str], sel: Selection, where: str, numbers: list[int] | None = None) -> list[int]:
    """The positions in `names` that `sel` picks, in order (all of them for an empty selection).
    `numbers`: each module's number (default: its position), which an INDEX names. A value that
    picks nothing is an `InputError` naming `where` and listing the modules."""
    if not sel:
        return list(range(len(names)))
    numbers = numbers if numbers is not None else list(range(len(names)))
    chosen: set[int] = set()
    for fn in sel.functions:
        hit = [i for i, n in enumerate(names) if n in (f"jit_{fn}", f"pjit_{fn}", fn)]
        if not hit:
            raise InputError(f"{where}: no module for function {fn!r} (jax names a jitted function's module "
                             f"jit_<name>; modules: {listing(names, numbers)})")
        chosen |= set(hit)
    for spec in sel.modules:
        if spec.isdigit():
            hit = [i for i, k in enumerate(numbers) if k == int(spec)]
            if not hit:
                raise InputError(f"{where}: no module numbered {spec} (modules: {listing(names, numbers)})")
        else:
            hit = [i for i, n in enumerate(names) if n == spec] or [i for i, n in enumerate(names) if spec in n]
            if not hit:
                raise InputError(f"{where}: no module named like {spec!r} (modules: {listing(names, numbers)})")
        chosen |= set(hit)
    return sorted(chosen)
