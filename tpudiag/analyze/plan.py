"""The candidates of `tpudiag plan` and their ranking. No I/O, no jax.

`mesh_shapes(devices, axes)`: every way to split a slice's devices over the named mesh axes (each
axis a divisor, the product the device count), largest first on the first axis. `candidate_argv`:
how a candidate's choice reaches the program: `--NAME VALUE` after a FILE.py:FUNC program's own
arguments, `NAME=VALUE` (and `ici_AXIS_parallelism=N` for the mesh) for MaxText's step.
`candidate_row` reads one candidate's `EstimateReport`; `plan_document` ranks them: candidates that
fit by tokens/s per device (most first; a tie keeps enumeration order), never one that does not fit
above one that does.
"""

from __future__ import annotations

from tpudiag.results.estimate import EstimateReport
from tpudiag.results.plan import PLAN_SCHEMA, Candidate, Plan

# At most this many meshes × choices in one plan: each is a compile of seconds to minutes.
MAX_CANDIDATES = 512


def mesh_shapes(devices: int, axes: list[str]) -> list[dict[str, int]]:
    """Every {axis: size} with sizes multiplying to `devices`, the first axis largest first."""
    def split(n: int, k: int) -> list[tuple[int, ...]]:
        if k == 1:
            return [(n,)]
        return [(d, *rest) for d in sorted((d for d in range(1, n + 1) if n % d == 0), reverse=True)
                for rest in split(n // d, k - 1)]
    return [dict(zip(axes, sizes)) for sizes in split(devices, len(axes))]


def mesh_text(mesh: dict[str, int]) -> str:
    return ",".join(f"{a}={n}" for a, n in mesh.items())


def candidate_argv(argv: list[str], choice: dict, mesh: dict[str, int], maxtext: bool) -> list[str]:
    """The program's arguments for one candidate."""
    if maxtext:
        return [*argv, *(f"ici_{a}_parallelism={n}" for a, n in mesh.items()),
                *(f"{k}={v}" for k, v in choice.items())]
    out = list(argv)
    for k, v in choice.items():
        out += [f"--{k}", str(v)]
    return out


def candidate_row(mesh: dict[str, int], choice: dict, est: EstimateReport | None, run: str,
                  error: str | None = None) -> Candidate:
    """One candidate's row from its estimate (None where the estimate itself failed: `error`)."""
    if est is None:
        return Candidate(mesh=dict(mesh), choice=dict(choice), status="failed", reason=error or "not estimated",
                         step_s=None, tokens_per_s_per_device=None, mfu=None, peak_hbm_bytes=None,
                         hbm_capacity_bytes=None, exposed_collective_s=None, top_op=None, estimate_run=run, rank=None)
    status = "ok" if est.status == "ok" else ("does_not_fit" if est.fits is False else "failed")
    top = est.top_ops[0] if est.top_ops else None
    return Candidate(mesh=dict(mesh), choice=dict(choice), status=status, reason=est.reason if status != "ok" else None,
                     step_s=est.step_s, tokens_per_s_per_device=est.tokens_per_s_per_device, mfu=est.mfu,
                     peak_hbm_bytes=est.peak_hbm_bytes, hbm_capacity_bytes=est.hbm_capacity_bytes,
                     exposed_collective_s=est.breakdown.collective_s if est.breakdown else None,
                     top_op=f"{top.name} ({top.bound_by}, {top.share:.0%})" if top else None, estimate_run=run,
                     rank=None, exposed_host_s=est.breakdown.host_s if est.breakdown else None)


def plan_document(program: str, argv: list[str], target_doc: dict, axes: list[str], space: dict[str, list],
                  rows: list[Candidate], runner: str, reproduce) -> Plan:
    """Rank the candidates; `reproduce(candidate)` is the estimate command of the winner."""
    fit = sorted((i for i, c in enumerate(rows) if c.status == "ok" and c.tokens_per_s_per_device),
                 key=lambda i: (-rows[i].tokens_per_s_per_device, i))
    rank = {i: r + 1 for r, i in enumerate(fit)}
    ranked = tuple(Candidate(**{**c.__dict__, "rank": rank.get(i)}) for i, c in enumerate(rows))
    best = fit[0] if fit else None
    return Plan(schema=PLAN_SCHEMA, program=program, argv=tuple(argv), target=target_doc, mesh_axes=tuple(axes),
                space={k: list(v) for k, v in space.items()}, runner=runner, status="ok" if fit else "failed",
                best=best, reproduce=reproduce(ranked[best]) if best is not None else None, candidates=ranked)
