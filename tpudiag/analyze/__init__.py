"""Analyze: pure functions over parsed artifacts (no I/O, no click, no rich), by workflow: `hlo/`
(shared by all), `profile/`, `compile/`, `suggest/`, `distributed/`, `diff/`, `compare/`, and the
numerical checks (`numerics`). A workflow imports `hlo/` and itself; they meet in `api/`."""
