"""Issue #36: a fleet run refused by the launch gate says "not launched" once: it read "not launched: not
launching: host #0 ...; not launching". Through the Lambda emulator, two instances."""
from __future__ import annotations

from pathlib import Path

from support.cloud import TYPE


def test_a_fleet_refused_by_the_gate_says_not_launched_once(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    (Path.cwd() / "train.py").write_text("import nosuchmod_fleet36\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--nodes", "2", "--launcher", "none",
               "--script", "train.py")
    assert r.code == 1, r.all
    line = next(ln for ln in r.err.splitlines() if ln.startswith("error:") and "nosuchmod_fleet36" in ln)
    assert line.count("not launch") == 1, line
    assert "host #0" in line, line
    assert not [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]
