"""The comparison of two runs (`tpudiag compare`)."""
