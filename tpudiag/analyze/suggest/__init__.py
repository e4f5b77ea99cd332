"""The analyses of `tpudiag suggest`: the pattern detectors (detectors/), the suggestions built from
a compile report, and static layout findings."""
