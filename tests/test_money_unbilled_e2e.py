"""Issue #28's "Money" items through the Lambda emulator: a corrupt ledger never blocks the way out (ls, down NAME,
down INSTANCE-ID find instances by their tags); refused options leave no run record; a failed job's folder that was
never created keeps nothing billing; every run's instance has a TTL it states."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.cloud.ledger import ledger_path
from test_cloud_e2e import TYPE, _live, _up, cloud, cloud_emu  # noqa: F401  (fixtures)

CORRUPT = {"empty": "", "truncated": '{"records": {"abc": {"launch_id": "abc", "prof', "null": "null",
           "records-list": '{"records": []}'}


@pytest.mark.parametrize("form", list(CORRUPT))
def test_a_corrupt_ledger_never_blocks_ls_or_down(cloud, gpuops, form):
    cloud.capacity(TYPE, ["us-east-1"])
    for name in ("one", "two"):
        r = _up(gpuops, cloud, name, "--no-verify", "--ttl", "2h")
        assert r.code == 0, r.all
    (one, two) = sorted(_live(cloud), key=lambda i: i["name"])
    led = ledger_path()
    led.write_text(CORRUPT[form])
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all
    assert "internal error" not in r.all and "Traceback" not in r.all
    assert r.err.count("was passed over") == 1, r.err
    assert {row["id"] for row in json.loads(r.out)["instances"]} >= {one["id"], two["id"]}
    aside = list(led.parent.glob("ledger.json.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == CORRUPT[form]  # kept, never lost
    led.write_text(CORRUPT[form])  # corrupt again: down NAME and down ID must pass over it too
    r = gpuops("down", "one", "--yes")
    assert r.code == 0, r.all
    assert r.err.count("was passed over") == 1 and "internal error" not in r.all
    led.write_text(CORRUPT[form])
    r = gpuops("down", two["id"], "--yes")
    assert r.code == 0, r.all
    assert r.err.count("was passed over") == 1 and "internal error" not in r.all
    assert not _live(cloud)
    assert len(list(led.parent.glob("ledger.json.corrupt-*"))) == 3


def _records() -> list:
    d = Path.cwd() / "runs" / "pipelines"
    return sorted(d.glob("*.json")) if d.is_dir() else []


def test_refused_options_launch_nothing_and_leave_no_record_to_resume(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("print('hi')\n")
    for ask in (["--gpu", "H100:8", "--max-price", "1"], ["--gpu", "H100:3"], ["--type", TYPE, "--key", "/nope"]):
        r = gpuops("run", "--key", str(cloud.key), *ask, "--script", "train.py", "--yes")  # the last --key wins
        assert r.code in (2, 3), (ask, r.all)  # 3: the key file
        assert not _records(), ask
    assert cloud.launch_requests() == 0 and not _live(cloud)
    r = gpuops("run", "--resume", "--yes")
    assert r.code == 2 and "no unfinished run to resume" in r.err, r.all
