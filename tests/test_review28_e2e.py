"""Issue #28 tried as a careful user would (review28): what `gpuops run` says before anything bills must reach its
--json document and name only what `run` takes."""
from __future__ import annotations

import json
from pathlib import Path

from test_cloud_e2e import TYPE, cloud, cloud_emu  # noqa: F401  (fixtures)


def test_run_json_carries_the_prelaunch_warnings_and_their_hints_name_what_run_takes(cloud, gpuops):
    root = Path.cwd()
    (root / "train.py").write_text("import os\nprint(os.path.exists('checkpoints/pretrained.pt'))\n")
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "pretrained.pt").write_text("weights")
    (root / "link").symlink_to("/etc/hostname")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    warnings = doc["warnings"]  # every warning said on stderr is in the document a script reads
    left_out = [w for w in warnings if "train.py names checkpoints/pretrained.pt, which sync leaves out" in w]
    links = [w for w in warnings if "1 symlink(s) point outside the project" in w]
    assert len(left_out) == 1 and len(links) == 1, warnings
    # run has no --copy-links nor sync settings of its own: its profile takes them from --from
    assert "--copy-links" not in links[0] and "--from" in links[0]
    assert "--from" in left_out[0]
    # the project was synced a moment before setup: no "sync the project first"
    assert not [w for w in warnings if "sync the project first" in w], warnings  # a no-dependency project is a real one
    assert sorted(set(warnings)) == sorted(warnings)  # each said once
