"""Issue #36: every tag read from the API is untrusted input. A TTL tag that is not a finite time (`inf`, `1e400`,
`nan`, garbage) is ignored and reported; it never crashes `ls` or `reap` (one bad tag stopped a cron `reap --yes`
for the whole account with `internal error: OverflowError`)."""
from __future__ import annotations

import json

import pytest

from gpuops.cloud import api, decisions as d

BAD = ["inf", "1e400", "-inf", "nan", "garbage", "", "1e300", "-5"]


def _inst(iid, tags):
    return api.Instance(id=iid, status="active", ip="127.0.0.9", region="us-east-1",
                        type=api.InstanceType(name="gpu_1x_h100_pcie", price_cents_per_hour=249), tags=tags)


@pytest.mark.parametrize("bad", BAD)
def test_a_ttl_tag_that_is_not_a_time_is_ignored_and_reported(bad):
    inst = _inst("i-bad", {d.TAG_LAUNCH: "LX", d.TAG_PROFILE: "far", d.TAG_TTL: bad})
    assert d.tag_deadline(inst.tags) is None
    rows, alerts = d.ls_rows([inst], [], {}, 1500.0)
    (row,) = rows
    assert row["ttl_left_s"] is None and not row["expired"]
    json.dumps(row, allow_nan=False)  # --json stays JSON
    said = [a for a in alerts if "i-bad" in a and d.TAG_TTL in a]
    assert said and "not a time" in said[0] and "ignored" in said[0], alerts
    assert d.reap_candidates(rows) == []


def test_a_good_ttl_tag_still_counts():
    inst = _inst("i-ok", {d.TAG_LAUNCH: "LX", d.TAG_TTL: "1000"})
    rows, alerts = d.ls_rows([inst], [], {}, 1500.0)
    assert rows[0]["ttl_left_s"] == -500 and rows[0]["expired"]
    assert not any("not a time" in a for a in alerts)


def test_a_tag_value_is_shown_cut_and_escaped():
    inst = _inst("i-x", {d.TAG_LAUNCH: "LX", d.TAG_TTL: "\x1b[31m" + "9" * 500})
    rows, alerts = d.ls_rows([inst], [], {}, 1500.0)
    (a,) = [a for a in alerts if d.TAG_TTL in a]
    assert "\x1b" not in a and len(a) < 600


def test_a_profile_tag_that_is_no_profile_name_is_never_pasted_into_a_command():
    inst = _inst("i-p", {d.TAG_LAUNCH: "LX", d.TAG_PROFILE: "x; rm -rf ~ \x1b[2J"})
    rows, alerts = d.ls_rows([inst], [], {}, 1500.0)
    assert rows[0]["profile"] is None
    assert not any("rm -rf" in a and "gpuops down x;" in a for a in alerts)
    assert any("gpuops down i-p" in a for a in alerts)
    assert any(d.TAG_PROFILE in a and "not a profile name" in a and "\x1b" not in a for a in alerts), alerts
