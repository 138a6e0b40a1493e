"""A `--json` document checked against its command's schema (src/gpuops/schemas/<name>.schema.json)."""
from __future__ import annotations

import json

from support import ROOT


def valid(name: str, doc) -> None:
    from jsonschema import Draft202012Validator

    schema = json.loads((ROOT / "src" / "gpuops" / "schemas" / f"{name}.schema.json").read_text())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in Draft202012Validator(schema).iter_errors(doc)]
    assert not errors, f"{name}: " + "; ".join(errors[:3])
