"""Capture: runs the target program or the TPU compiler and writes a run directory. Nothing else."""
