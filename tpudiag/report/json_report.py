"""Renders any tpudiag result as JSON: one `json.dumps` of its document, keys sorted, so output is
diffable. Reads a model (its `to_dict()`) or a document; returns the text `report.json` holds.
It is every result's JSON renderer (`registry.renderer(result, "json")`); it does not validate."""

from __future__ import annotations

import json


def render_json(result, **_) -> str:
    doc = result.to_dict() if hasattr(result, "to_dict") else result
    return json.dumps(doc, sort_keys=True, indent=2) + "\n"
