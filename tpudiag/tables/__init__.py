"""Tables tpudiag ships: measured per-chip calibrations (calibration_CHIP.json)."""
