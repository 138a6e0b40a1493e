"""Issue #36: `gpuops matrix -o FILE` writes the Markdown to FILE and not also to stdout (as `sort -o`, `curl -o`):
stdout holds nothing, stderr says where it went; --json still prints its one document."""
from __future__ import annotations

import json

from gpuops.transfer import snapshot as core
from support import DATA


def snap(name: str) -> dict:
    """A snapshot built from a recorded probe output (tests/data/snapshot/)."""
    import json

    return core.build(json.loads((DATA / "snapshot" / name).read_text()), captured_at="2026-01-15T10:00:00Z")


def test_matrix_out_writes_the_file_only(gpuops, isolated):
    core.save(snap("probe_h100_torch29_cu128.json"), isolated / "saved")
    r = gpuops("matrix", "--from", "saved", "-o", "env.md")
    assert r.code == 0, r.all
    text = (isolated / "env.md").read_text()
    assert text.startswith("## Environment matrix") and "| Component |" in text
    assert r.out == "", r.out
    assert "wrote env.md" in r.err
    r = gpuops("matrix", "--from", "saved")  # without -o: stdout, as before
    assert r.code == 0 and r.out.strip() == text.strip()
    r = gpuops("matrix", "--from", "saved", "-o", "env2.md", "--json")
    assert r.code == 0 and json.loads(r.out)["markdown"] == text
