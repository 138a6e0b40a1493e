"""`gpuops run` takes the options of the commands it composes (issue #29, "`run` and `train` disagree"): --env and
--seed as `train`, --idle and --guard as `up`, and --force, which the launch gate's "add --force" names. Through the
Lambda emulator and the sandbox hosts it launches."""
from __future__ import annotations

import json
import stat
from pathlib import Path

from gpuops.cloud.ledger import Ledger
from support.cloud import API_KEY, TYPE, live_instances


SHOW = """\
import os
print("FOO=" + os.environ.get("FOO", "<unset>"), flush=True)
print("SEED=" + os.environ.get("GPUOPS_SEED", "<unset>") + " HASHSEED=" + os.environ.get("PYTHONHASHSEED", "-"))
print("TOKEN_LEN=" + str(len(os.environ.get("HF_TOKEN", ""))), flush=True)
"""
TOKEN = "hf_" + "Qw7" * 10


def _run(gpuops, cloud, *extra):
    return gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", *extra)


def test_env_and_seed_reach_the_job_and_env_values_stay_out_of_the_record(cloud, gpuops, monkeypatch):
    import gpuops.pipeline.runner as runner

    (Path.cwd() / "train.py").write_text(SHOW)
    seen = {}
    real = runner.Runner.stage_train

    def spy(self):  # the 0600 file that holds --env while the run may still launch
        f = self._env_file()
        seen["mode"] = stat.S_IMODE(f.stat().st_mode)
        seen["record"] = (f.parent / f"{self.rec.id}.json").read_text()
        return real(self)

    monkeypatch.setattr(runner.Runner, "stage_train", spy)
    r = _run(gpuops, cloud, "--script", "train.py", "--env", "FOO=bar baz", "--env", f"HF_TOKEN={TOKEN}",
             "--seed", "7")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    log = (Path.cwd() / doc["fetched"]["log"]).read_text()
    assert "FOO=bar baz" in log and "SEED=7 HASHSEED=7" in log and f"TOKEN_LEN={len(TOKEN)}" in log
    assert seen["mode"] == 0o600 and TOKEN not in seen["record"]
    rec = json.loads((Path.cwd() / "runs" / "pipelines" / f"{doc['run']}.json").read_text())
    assert rec["seed"] == 7 and rec["env_names"] == ["FOO", "HF_TOKEN"]
    assert not list((Path.cwd() / "runs" / "pipelines").glob("*.env"))  # the run is over: the values are gone
    assert not live_instances(cloud)


def test_a_bad_env_or_guard_is_refused_before_anything_is_written(cloud, gpuops):
    (Path.cwd() / "train.py").write_text(SHOW)
    for bad, said in ((["--env", "NOEQUALS"], "expected NAME=VALUE"), (["--guard", "laptop"], "the only guard is"),
                      (["--idle", "0"], "--idle 0: give a duration above 0")):
        r = _run(gpuops, cloud, "--script", "train.py", *bad)
        assert r.code == 2 and said in r.err, (bad, r.all)
        assert not (Path.cwd() / "runs" / "pipelines").exists()
    assert cloud.launch_requests() == 0


def test_idle_and_guard_are_given_to_the_instance(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("print('ok')\n")
    r = _run(gpuops, cloud, "--script", "train.py", "--idle", "30m", "--guard", "on-instance", "--keep")
    assert r.code == 0, r.all
    assert "guard installed on the instance" in r.err and API_KEY not in r.all
    (rec,) = [x for x in Ledger().records() if x.open]
    assert rec.idle_limit_s == 1800 and rec.ttl_deadline is not None
    doc = json.loads(r.out)
    assert gpuops("down", doc["profile"], "--yes").code == 0
    assert not live_instances(cloud)


def test_force_launches_past_the_gate_as_its_hint_says(cloud, gpuops):
    (Path.cwd() / "train.py").write_text("import surely_not_installed_xq\n")
    r = _run(gpuops, cloud, "--script", "train.py")  # the local plan refuses it before any launch request (#34)
    assert r.code == 1 and "nothing was launched" in r.err and "--force" in r.err, r.all
    assert cloud.launch_requests() == 0
    r = _run(gpuops, cloud, "--script", "train.py", "--force")
    assert r.code == 1, r.all  # launched, and the job fails on its import
    doc = json.loads(r.out)
    train = next(s for s in doc["stages"] if s["stage"] == "train")
    assert train["ok"] is True and doc["job"] == "failed"
    assert "launching anyway" in r.err
    assert not live_instances(cloud)
