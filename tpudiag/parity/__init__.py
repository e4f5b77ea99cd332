"""The parity harness behind `tpudiag validate` and `tpudiag kernels verify` (harness.py)."""
