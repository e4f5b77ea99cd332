"""`tpudiag challenge`: kernel-port tasks graded for correctness, determinism, integrity and speed
(on the chip when a TPU is attached, else by the static profile of an AOT compile for v5e).

`task` reads a task directory (task.json, reference.py, ground_truth.py) and holds the rubric;
`integrity` reads a solution's source; `child` runs a solution in its own process for correctness,
determinism and the dynamic integrity checks; `speed` measures it (and the ground truth and the
reference) in another; `grade` drives both and scores; `scaffold` writes a new task directory.
Bundled tasks live under `tasks/`. docs/challenges.md.
"""
