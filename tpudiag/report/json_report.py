"""Renders any tpudiag document as JSON: one `json.dumps`, keys sorted, so output is diffable."""

from __future__ import annotations

import json


def render_json(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"
