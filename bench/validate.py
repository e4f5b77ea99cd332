"""`tpudiag validate` against the plain script a user writes for the same checks, in one run.

The pair: fixtures/programs/parity/refs.py:attention (f32 softmax, causal) and ports.py:attention
(two query blocks with their own max and sum) at B2 H8 S1024 D128 bf16, `--grad --regimes all`
(the nine regimes that apply to three float inputs).

- tpudiag: `tpudiag validate REF CAND --inputs ... --grad --regimes all --no-shrink --json` in a fresh process;
- the peer: a fresh `python -c` script that does the same work by hand for the same nine regimes
  (inputs drawn the same way, the candidate, the reference and the reference under x64, the
  gradients of all three, the candidate again for determinism) and checks with
  `np.testing.assert_allclose` (atol/rtol 2e-2; every check runs and failures are counted), and bit
  equality for determinism. It does the same work as tpudiag, not the same judgement: no ULP
  statistics, no shrinking, and its float64 is the reference under x64 as written.

Each is run `--repeat` times (default 2), alternating; the best of each is compared.
Goal: tpudiag <= 1.5x the plain script. Prints the table; never asserts.

    python bench/validate.py [--repeat N] [--seq 1024]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARITY = REPO / "fixtures" / "programs" / "parity"
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
GOAL = 1.5

PLAIN = r'''
import sys, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, "{parity}")
import refs, ports
from tpudiag.parity import inputs as inp
specs = inp.parse_spec("{spec}")
regimes = inp.regimes_for(specs, "all")
failed = []
for n, regime in enumerate(regimes):
    q, k, v = (jnp.asarray(a) for a in inp.make_args(specs, regime, 1000 + n))
    out = ports.attention(q, k, v)
    ref = refs.attention(q, k, v)
    with jax.enable_x64():
        ref64 = refs.attention(*(a.astype(jnp.float64) for a in (q, k, v)))
    ct = jnp.asarray(np.random.default_rng(n).standard_normal(out.shape))
    def grads(fn, args, dt):
        return jax.grad(lambda *a: jnp.sum(fn(*a).astype(dt) * ct.astype(dt)), argnums=(0, 1, 2))(*args)
    g_c, g_r = grads(ports.attention, (q, k, v), jnp.float32), grads(refs.attention, (q, k, v), jnp.float32)
    with jax.enable_x64():
        g_64 = grads(refs.attention, tuple(a.astype(jnp.float64) for a in (q, k, v)), jnp.float64)
    again = ports.attention(q, k, v)
    f = lambda x: np.asarray(x, np.float64)
    pairs = [(out, ref64), (ref, ref64)] + [(a, c) for a, c in zip(g_c, g_64)] + [(b, c) for b, c in zip(g_r, g_64)]
    for got, want in pairs:  # every check runs; a failure is counted, as a test suite would
        try:
            np.testing.assert_allclose(f(got), f(want), atol=2e-2, rtol=2e-2)
        except AssertionError:
            failed.append(regime)
    if np.asarray(out).tobytes() != np.asarray(again).tobytes():
        failed.append(regime + " determinism")
print(len(regimes), "regimes;", len(failed), "failed checks")
'''


def _time(cmd, cwd) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True)
    return time.perf_counter() - t0, p.returncode, (p.stdout + p.stderr).strip().splitlines()[-1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1024)
    a = ap.parse_args()
    spec = f"q=bf16[2,8,{a.seq},128] k=bf16[2,8,{a.seq},128] v=bf16[2,8,{a.seq},128]"
    tool = [sys.executable, "-m", "tpudiag", "validate", "refs.py:attention", "ports.py:attention", "--inputs", spec,
            "--grad", "--regimes", "all", "--no-shrink", "--seed", "1", "--json"]
    plain = [sys.executable, "-c", PLAIN.format(parity=PARITY, spec=spec)]
    best = {"tpudiag validate": float("inf"), "plain script": float("inf")}
    for r in range(a.repeat):
        for name, cmd in (("tpudiag validate", tool), ("plain script", plain)):
            s, rc, tail = _time(cmd, PARITY)
            print(f"run {r + 1}: {name:16s} {s:7.1f} s  exit {rc}  {tail[0][:100] if tail else ''}", flush=True)
            best[name] = min(best[name], s)
    ratio = best["tpudiag validate"] / best["plain script"]
    print(f"\n{spec}, --grad --regimes all (9 regimes)")
    print(f"| | best of {a.repeat} |\n|---|---:|")
    for name, s in best.items():
        print(f"| {name} | {s:.1f} s |")
    print(f"\nratio {ratio:.2f}x (goal <= {GOAL}x): {'met' if ratio <= GOAL else 'NOT met'}")


if __name__ == "__main__":
    main()
