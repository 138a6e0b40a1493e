"""pipeline/prepplan.py, the pure half of `gpuops run --prep` (issue 38): the outputs named, the key (the command, the
content of the files it runs, the outputs), the cheapest type with capacity in the filesystem's region, the record's
stage, spend and rows; and its remote executions run here by sh on real folders (the move: whole or not at all, the
marker last; the link: only to a complete preparation of the same key)."""
from __future__ import annotations

import json
import subprocess

import pytest

from gpuops.cloud.api import InstanceType, TypeAvailability
from gpuops.errors import UsageError
from gpuops.pipeline import prepplan as pp
from gpuops.pipeline import stages as pl


# -- the user's words --------------------------------------------------------------------------------------------------
def test_outs_are_project_paths_or_home_paths_and_nothing_else():
    assert pp.check_outs(["data/train.bin", "./shards/", "~/data", "$HOME/cache/x", "data/train.bin"]) == \
        ["data/train.bin", "shards", "~/data", "~/cache/x"]
    for bad in ["/etc/data", "../x", "a/../b", "", "~", "$HOME", "."]:
        with pytest.raises(UsageError):
            pp.check_outs([bad])
    with pytest.raises(UsageError, match="is inside --prep-out 'data'"):
        pp.check_outs(["data", "data/train.bin"])


def test_prep_needs_fs_and_an_output_and_its_options_need_prep():
    with pytest.raises(UsageError, match="--prep needs --fs NAME") as e:
        pp.refuse_without_fs("python prepare.py", None, None, ["data"])
    assert "gpuops fs create" not in e.value.message and "--fs data" in e.value.hint
    with pytest.raises(UsageError, match="at least one --prep-out"):
        pp.refuse_without_fs("python prepare.py", "work", None, [])
    with pytest.raises(UsageError, match="--prep-type and --prep-out without --prep"):
        pp.refuse_without_fs(None, "work", "gpu_1x_a10", ["data"])
    pp.refuse_without_fs(None, None, None, [])  # no preparation: nothing to say
    pp.refuse_without_fs("python prepare.py", "work", None, ["data"])


def test_profile_name_fits_what_up_accepts():
    assert pp.profile_name("sft-20261127-101500-ab12") == "prep-sft-20261127-101500-ab12"
    long = "n" * 38 + "-20261127-101500-ab12"
    assert len(pp.profile_name(long)) <= 63 and pp.profile_name(long).endswith("ab12")


# -- the key ---------------------------------------------------------------------------------------------------------
def _project(tmp_path):
    (tmp_path / "prepare.py").write_text("import helpers.tok\nfrom .local import x\nprint(1)\n")
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text("")
    (tmp_path / "helpers" / "tok.py").write_text("import os, numpy\nfrom helpers import vocab\n")
    (tmp_path / "helpers" / "vocab.py").write_text("WORDS = 3\n")
    (tmp_path / "local.py").write_text("x = 1\n")
    (tmp_path / "prep.sh").write_text("#!/bin/bash\nset -e\npython prepare.py --out data  # tokenize\n"
                                      "bash fetch_shards.sh\n")
    (tmp_path / "fetch_shards.sh").write_text("curl -sO https://example.org/shard.bin\n")
    (tmp_path / "unrelated.py").write_text("print('not run')\n")
    return tmp_path


def test_the_files_a_command_runs_are_found_through_imports_and_scripts(tmp_path):
    p = _project(tmp_path)
    assert pp.command_files("python prepare.py --vocab=32k", p) == \
        ["helpers/__init__.py", "helpers/tok.py", "helpers/vocab.py", "local.py", "prepare.py"]
    assert pp.command_files("bash prep.sh", p) == \
        ["fetch_shards.sh", "helpers/__init__.py", "helpers/tok.py", "helpers/vocab.py", "local.py", "prep.sh",
         "prepare.py"]
    assert pp.command_files("python -m helpers.tok", p) == ["helpers/__init__.py", "helpers/tok.py",
                                                            "helpers/vocab.py"]
    assert pp.command_files("curl -s https://x/y | tar x", p) == []


def test_the_key_changes_with_the_script_a_file_it_imports_the_command_and_the_outputs(tmp_path):
    p = _project(tmp_path)
    a = pp.plan("python prepare.py", ["data/train.bin"], p)
    assert a == pp.plan("python prepare.py", ["data/train.bin"], p)  # the same preparation: the same folder
    assert a["folder"] == f"prepare-{a['key']}" and len(a["key"]) == pp.KEY_LEN
    (p / "unrelated.py").write_text("print('edited, not run')\n")
    assert pp.plan("python prepare.py", ["data/train.bin"], p)["key"] == a["key"]
    assert pp.plan("python prepare.py --vocab 8k", ["data/train.bin"], p)["key"] != a["key"]
    assert pp.plan("python prepare.py", ["data/train.bin", "data/val.bin"], p)["key"] != a["key"]
    (p / "helpers" / "vocab.py").write_text("WORDS = 4\n")  # two imports deep
    b = pp.plan("python prepare.py", ["data/train.bin"], p)
    assert b["key"] != a["key"] and b["files"]["helpers/vocab.py"] != a["files"]["helpers/vocab.py"]


def test_an_output_folder_holding_the_script_is_refused_with_the_files_to_name(tmp_path):
    (tmp_path / "data" / "shakespeare_char").mkdir(parents=True)
    (tmp_path / "data" / "shakespeare_char" / "prepare.py").write_text("print(1)\n")
    with pytest.raises(UsageError, match="holds data/shakespeare_char/prepare.py") as e:
        pp.refuse_runs_inside_outs("python data/shakespeare_char/prepare.py", ["data/shakespeare_char"], tmp_path)
    assert "--prep-out data/shakespeare_char/train.bin" in e.value.hint
    pp.refuse_runs_inside_outs("python data/shakespeare_char/prepare.py",
                               ["data/shakespeare_char/train.bin", "data/shakespeare_char/val.bin", "~/data"], tmp_path)


def test_cheapest_type_with_capacity_in_the_region():
    def t(name, cents, regions):
        return TypeAvailability(InstanceType(name=name, price_cents_per_hour=cents), tuple(regions))

    types = {x.type.name: x for x in [t("gpu_8x_h100_sxm5", 2392, ["us-east-1"]), t("gpu_1x_a10", 75, ["us-west-1"]),
                                      t("gpu_1x_gh200", 149, ["us-east-1"]), t("gpu_1x_a100_sxm4", 179, ["us-east-1"]),
                                      t("noprice", 0, ["us-east-1"])]}
    assert pp.cheapest_types(types, "us-east-1") == ["gpu_1x_gh200", "gpu_1x_a100_sxm4", "gpu_8x_h100_sxm5"]
    assert pp.cheapest_types(types, "us-west-1") == ["gpu_1x_a10"]
    assert pp.cheapest_types(types, None)[0] == "gpu_1x_a10"
    # no capacity there: every priced type, cheapest first (up says none, or waits with --wait-for-capacity)
    assert pp.cheapest_types(types, "europe-central-1") == ["gpu_1x_a10", "gpu_1x_gh200", "gpu_1x_a100_sxm4",
                                                            "gpu_8x_h100_sxm5"]


def test_the_template_keeps_the_environment_not_the_training_gpu():
    t = {"python": "~/.venvs/gpuops/bin/python", "expect": {"gpu": "H100", "gpu_count": 8, "packages": {"torch": "2.5"}},
         "setup": {"extras": ["train"]}}
    assert pp.template(t) == {"python": "~/.venvs/gpuops/bin/python", "expect": {"packages": {"torch": "2.5"}},
                              "setup": {"extras": ["train"]}}
    assert pp.template(None) is None


# -- the remote executions, run here by sh ------------------------------------------------------------------------
def _sh(script: str, cwd, home) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": "/usr/bin:/bin"})


def _marker(key="abc123"):
    return pp.make_marker({"key": key, "command": "python prepare.py", "outs": ["data/train.bin", "~/cache"],
                           "files": {"prepare.py": "0" * 64}}, run="r1", job="prep-1", instance="i1",
                          itype="gpu_1x_a10", at=1.0, seconds=2.0)


def test_move_is_whole_with_the_marker_last_and_link_only_to_a_complete_one(tmp_path):
    home, proj, fs = tmp_path / "home", tmp_path / "home" / "proj", tmp_path / "fs"
    (proj / "data").mkdir(parents=True)
    (proj / "data" / "train.bin").write_bytes(b"\1" * 1000)
    (home / "cache").mkdir()
    (home / "cache" / "v.json").write_text("{}")
    folder = str(fs / "gpuops" / "prep" / "prepare-abc123")
    r = _sh(pp.move_command(str(proj), folder, ["data/train.bin", "~/cache"], _marker(), "t0"), proj, home)
    assert r.returncode == 0, r.stderr
    assert pp.parse_moved(r.stdout)["moved"] == (1002, 2)
    assert (fs / "gpuops/prep/prepare-abc123/data/train.bin").stat().st_size == 1000
    assert (fs / "gpuops/prep/prepare-abc123/_home/cache/v.json").read_text() == "{}"
    assert not (proj / "data" / "train.bin").exists() and not (fs / "gpuops/prep/prepare-abc123.partial").exists()
    marker = json.loads((fs / "gpuops/prep/prepare-abc123" / pp.MARKER).read_text())
    assert pp.complete(marker, "abc123") and not pp.complete(marker, "other")
    assert pp.complete(pp.parse_marker(_sh(pp.status_command(folder), proj, home).stdout), "abc123")

    # on a training instance: the marker checked, then each output linked where the job expects it
    (proj / "data").mkdir(exist_ok=True)  # an empty folder of that name: fine
    r = _sh(pp.link_command(str(proj), folder, ["data/train.bin", "~/cache"], "abc123"), proj, home)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (proj / "data" / "train.bin").is_symlink() and (proj / "data" / "train.bin").stat().st_size == 1000
    assert (home / "cache").is_symlink() and (home / "cache" / "v.json").read_text() == "{}"
    assert pp.parse_marker(r.stdout)["key"] == "abc123"
    r = _sh(pp.link_command(str(proj), folder, ["data/train.bin"], "abc123"), proj, home)  # again: replaced
    assert r.returncode == 0, r.stderr
    # another key: nothing linked
    (proj / "data" / "train.bin").unlink()
    r = _sh(pp.link_command(str(proj), folder, ["data/train.bin"], "zzz"), proj, home)
    assert r.returncode == 5 and "@incomplete" in r.stdout and not (proj / "data" / "train.bin").exists()
    # a file of the job's own at that path: refused, left as it is
    (proj / "data" / "train.bin").write_text("mine")
    r = _sh(pp.link_command(str(proj), folder, ["data/train.bin"], "abc123"), proj, home)
    assert r.returncode == 3 and "@taken data/train.bin" in r.stdout
    assert (proj / "data" / "train.bin").read_text() == "mine"


def test_move_says_what_is_missing_keeps_a_complete_one_and_sets_aside_a_cut_off_one(tmp_path):
    home, proj, fs = tmp_path / "home", tmp_path / "home" / "proj", tmp_path / "fs"
    proj.mkdir(parents=True)
    folder = str(fs / "f")
    r = _sh(pp.move_command(str(proj), folder, ["data/train.bin"], _marker(), "t0"), proj, home)
    assert r.returncode == 5 and pp.parse_moved(r.stdout)["missing"] == "data/train.bin"
    assert not fs.exists()  # nothing made
    # a folder from a cut-off attempt (no marker): set aside, never deleted
    (fs / "f" / "data").mkdir(parents=True)
    (fs / "f" / "data" / "half.bin").write_text("half")
    (proj / "data").mkdir()
    (proj / "data" / "train.bin").write_text("whole")
    r = _sh(pp.move_command(str(proj), folder, ["data/train.bin"], _marker(), "t1"), proj, home)
    assert r.returncode == 0 and pp.parse_moved(r.stdout)["set_aside"], r.stdout + r.stderr
    assert (fs / "f.incomplete-t1" / "data" / "half.bin").read_text() == "half"
    assert (fs / "f" / "data" / "train.bin").read_text() == "whole"
    # already complete (another run finished the same preparation meanwhile): kept as it is
    (proj / "data" / "train.bin").write_text("another")
    r = _sh(pp.move_command(str(proj), folder, ["data/train.bin"], _marker(), "t2"), proj, home)
    got = pp.parse_moved(r.stdout)
    assert r.returncode == 0 and got["already"]["key"] == "abc123" and got["moved"] is None
    assert (fs / "f" / "data" / "train.bin").read_text() == "whole"


def test_parse_marker_refuses_what_is_not_ours():
    assert pp.parse_marker("@none\n") is None
    assert pp.parse_marker("@marker\nnot json") is None
    assert pp.parse_marker('@marker\n{"key": "x"}') is None
    assert pp.parse_marker("@marker\n" + json.dumps(_marker()))["key"] == "abc123"
    assert not pp.complete({**_marker(), "exit_code": 1}, "abc123")


# -- the record: stages, money, rows -----------------------------------------------------------------------------
def _rec(**prep) -> pl.Record:
    return pl.Record(id="r", profile="run-r", instance_type="gpu_1x_h100_pcie", script="train.py", price_per_hour=2.49,
                     prep={"command": "python prepare.py", "outs": ["data"], "stage": {}, "instances": [], **prep})


def test_the_preparation_comes_first_and_a_failed_one_ends_the_run():
    rec = _rec()
    assert pl.next_stage(rec) == "prep"
    rec.prep["stage"] = {"started": 1.0, "ended": None}
    assert pl.next_stage(rec) == "prep"  # cut off (a crash): run again
    rec.prep["stage"] = {"started": 1.0, "ended": 2.0, "ok": True}
    assert pl.next_stage(rec) == "up"
    rec.prep["stage"] = {"started": 1.0, "ended": 2.0, "ok": False}
    assert pl.next_stage(rec) is None  # failed: no training instance
    rec.prep["interrupted"] = True
    assert pl.next_stage(rec) == "prep"  # interrupted: --resume prepares again
    assert pl.next_stage(pl.Record(id="r", profile="p", instance_type="t", script="s")) == "up"


def test_the_preparations_instances_count_in_the_spend_the_rows_and_the_budget():
    rec = _rec(stage={"started": 0.0, "ended": 1800.0, "ok": True, "detail": "ran"},
               instances=[{"ids": ["i0"], "type": "gpu_1x_a10", "region": "us-east-1", "price_per_hour": 0.75,
                           "started": 0.0, "ended": 1800.0, "how": "terminated"}])
    assert pl.spend(rec, 5000.0) == pytest.approx(0.375)
    rec.max_cost = 0.30
    assert pl.over_budget(rec, 5000.0)
    rows = pl.summary(rec, 5000.0)
    assert rows[0] == {"stage": "prep", "label": "preparation", "seconds": 1800.0, "cost": 0.375, "ok": True,
                       "detail": "ran", "instance": 0}
    (inst,) = pl.instances(rec, 5000.0)
    assert inst["role"] == "prep" and inst["cost"] == 0.375 and inst["ended"] == "terminated"
    # one still running bills until now
    rec.prep["instances"].append({"ids": ["i1"], "price_per_hour": 0.75, "started": 4000.0, "ended": None})
    assert pl.spend(rec, 4000.0 + 3600.0) == pytest.approx(0.375 + 0.75)
    doc = pp.summary_doc(rec.prep, 7600.0)
    assert doc["cost"] == pytest.approx(1.125) and doc["duration_s"] == 1800.0


def test_a_failed_preparation_says_its_cause_as_a_jobs_ending():
    """The closing summary of a failed preparation: the ending's title, evidence and fix (jobs/endings.py's
    contract), then the log's last lines."""
    ending = {"cause": "module-missing", "title": "the job's python has no module tiktoken",
              "evidence": ["log: ModuleNotFoundError: No module named 'tiktoken'", "exit code 1"],
              "fix": "add the package that provides tiktoken", "source": "Python exceptions"}
    prep = {"command": "python prepare.py", "outs": ["data"], "state": "failed", "ending": ending,
            "why": "the preparation exited 1: the job's python has no module tiktoken",
            "last_lines": ["ModuleNotFoundError: No module named 'tiktoken'"],
            "stage": {"started": 0.0, "ended": 5.0, "ok": False}, "instances": []}
    doc = pp.summary_doc(prep, 10.0)
    assert doc["ending"] == ending
    lines = pp.summary_lines(doc)
    assert lines[:4] == ["preparation FAILED: the preparation exited 1: the job's python has no module tiktoken; no "
                         "training instance was launched",
                         "  why it ended: the job's python has no module tiktoken",
                         "      evidence: log: ModuleNotFoundError: No module named 'tiktoken'",
                         "      evidence: exit code 1"], lines
    assert lines[4] == "      fix: add the package that provides tiktoken"
    assert lines[5] == "  | ModuleNotFoundError: No module named 'tiktoken'"
