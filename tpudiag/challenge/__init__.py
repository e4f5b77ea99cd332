"""`tpudiag challenge`: kernel-port tasks graded for correctness, determinism and integrity (speed is
static, and not scored, without a TPU).

`task` reads a task directory (task.json, reference.py, ground_truth.py); `integrity` reads a
solution's source; `child` runs a solution in its own process; `grade` drives it and scores;
`scaffold` writes a new task directory. Bundled tasks live under `tasks/`. docs/challenges.md.
"""
