"""Capture: runs the target program (or, later, the TPU compiler) and writes a run directory. Nothing else."""
