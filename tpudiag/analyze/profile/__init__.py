"""The analyses of a profile run: timeline, time breakdown, compiles, executed work, the report, and
the `profile --target` estimate."""
