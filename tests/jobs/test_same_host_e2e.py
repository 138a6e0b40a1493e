"""Issue #36: a run can be stopped (watched, followed) through any profile that names the host it runs on, not only
the profile it was launched with: `gpuops stop RUN -p other` where `other` is the same host:port said "run RUN
belongs to profile 'sandbox'" (exit 2) while the job went on. A profile naming another host still refuses."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from support.runs import run_id_of, wait_ended


def _copy_profile(sandbox, name: str, **changes) -> None:
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.update(changes)
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(data))


def test_stop_through_another_profile_of_the_same_host(sandbox, gpuops, isolated):
    (isolated / "job.sh").write_text("#!/bin/sh\nwhile true; do echo tick; sleep 0.2; done\n")
    r = gpuops("train", "-p", "sandbox", "--script", "job.sh", "--no-snapshot")
    rid = run_id_of(r)
    _copy_profile(sandbox, "box")  # the same host, port and user, another name
    _copy_profile(sandbox, "elsewhere", host="127.0.0.254")
    r = gpuops("stop", rid, "-p", "elsewhere", "--grace", "1")
    assert r.code == 2 and "belongs to profile 'sandbox'" in r.err, r.all
    r = gpuops("status", "-p", "box")
    assert r.code == 0, r.all
    r = gpuops("stop", rid, "-p", "box", "--grace", "1")
    assert r.code == 0, r.all
    assert wait_ended(sandbox, rid) != 0  # stopped
