"""Issue #28 tried as a careful user would (review28): what `gpuops run` says before anything bills must reach its
--json document and name only what `run` takes."""
from __future__ import annotations

import json
from pathlib import Path

from support.cloud import TYPE


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


def test_a_gate_refusal_in_run_points_to_a_new_run_not_to_setup_on_the_terminated_instance(cloud, gpuops, tmp_path):
    """The gate's fix said "add it to the project's requirements, then gpuops setup": the run then terminates the
    instance (and its profile), so setup has nothing to run on. The fix says to start gpuops run again. (The
    requirement is a wheel file: what it installs is known only on the instance, so the local plan leaves the
    module to the gate, as it does whenever it cannot resolve.)"""
    from support.indexes import make_wheel

    whl = make_wheel(tmp_path / "wheels", "otherpkg", "1.0", "VALUE = 1\n")
    (Path.cwd() / "requirements.txt").write_text(f"{whl}\n")
    (Path.cwd() / "train.py").write_text("import nosuchmod_review28\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py")
    assert r.code == 1, r.all
    assert "imports nosuchmod_review28, which" in r.err and "cannot import" in r.err
    line = next(ln for ln in r.err.splitlines() if ln.startswith("error:"))
    assert line.count("not launch") == 1, line  # "not launched: ...; not launching" said it twice
    assert "then gpuops setup" not in r.err, r.err
    assert "add nosuchmod_review28 to the project's requirements, then start gpuops run again" in r.err
    assert not [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def test_refusal_hint_keeps_setup_for_a_kept_instance_and_rewords_every_setup_fix_otherwise():
    from gpuops.pipeline.stages import refusal_hint

    gate = ("fix (x): add x to the project's requirements, then gpuops setup\n"
            "fix: put torchrun in the project's dependencies (or expect.packages) and run gpuops setup")
    assert refusal_hint(gate, kept=True) == gate  # --keep: the instance and its profile stay, setup applies
    said = refusal_hint(gate, kept=False)
    assert "gpuops setup" not in said and said.count("start gpuops run again") == 2
    assert refusal_hint(None, kept=False) is None
    extra = ("fix (aenum): the project lists aenum only in pyproject.toml's extra track, which setup does not install: "
             "add it to the profile's setup.extras (setup: {extras: [track]}), then gpuops setup")
    assert refusal_hint(extra, kept=False) == (
        "fix (aenum): the project lists aenum only in pyproject.toml's extra track, which setup does not install: add "
        "it to setup.extras of a profile given with --from (gpuops run --from PROFILE) (setup: {extras: [track]}), "
        "then start gpuops run again (its setup runs on the new instance)")
    setup = "the whole log is ~/p/.gpuops/setup/log on the host; fix the cause, then run `gpuops setup` again " \
            "(finished steps are not repeated)"
    assert refusal_hint(setup, kept=False) == ("the whole log is ~/p/.gpuops/setup/log on the host; fix the cause, "
                                               "then start gpuops run again (its setup runs on the new instance)")


def test_a_setup_failure_in_run_says_its_cause_and_points_to_a_new_run(cloud, gpuops):
    """setup's hint "fix the cause, then run `gpuops setup` again" was said after the run terminated the instance."""
    (Path.cwd() / "train.py").write_text("print(1)\n")
    (Path.cwd() / "requirements.txt").write_text("git+https://127.0.0.1:9/nobody/pkg.git\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py")
    assert r.code == 1, r.all
    assert "error: setup failed" in r.err and "127.0.0.1" in r.err.split("error: setup failed", 1)[1].splitlines()[0]
    assert "gpuops setup` again" not in r.err and "then start gpuops run again" in r.err, r.err
    assert not [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def test_index_lines_of_a_requirements_file_are_searched_as_pip_does_under_uv(sandbox, gpuops, tmp_path):
    """requirements.txt includes (-r) a file with two --extra-index-url lines, the first index lacking the pinned
    version: pip finds it (it considers every index); uv by default stops at the first index that has the package.
    The file is pip's format, read by a user for pip: setup gives uv pip's semantics there too."""
    from support.envs import file_index
    from support.envs import fresh_env, set_profile

    first = file_index(tmp_path / "first", "pinpkg", "1.1")
    second = file_index(tmp_path / "second", "pinpkg", "1.0")
    set_profile(sandbox, python=fresh_env(sandbox, "senv-req-indexes"), expect={"packages": {"pinpkg": "1.0"}})
    Path("requirements.txt").write_text("-r requirements/base.txt\n")
    (Path("requirements") / "base.txt").parent.mkdir()
    Path("requirements/base.txt").write_text(f"--extra-index-url {first}\n--extra-index-url {second}\npinpkg==1.0\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "installer: uv" in r.out and "PASS  pinpkg: 1.0" in r.out


def test_names_extra_index_reads_the_files_a_requirements_file_includes():
    from gpuops.project.read import installs_itself, names_extra_index

    texts = {"requirements.txt": "-r requirements/base.txt\n-e .\n", "requirements/base.txt":
             "# pinned\n--extra-index-url=https://a.example/simple  # ours\nsix==1.16.0\n",
             "plain.txt": "--index-url https://b.example/simple\nsix\n"}
    assert names_extra_index(texts, "requirements.txt") == "requirements/base.txt"
    assert names_extra_index(texts, "plain.txt") is None  # one index: nothing to choose among
    assert installs_itself(texts, "requirements.txt") == "requirements.txt"  # the walk they share


def test_the_lambda_stack_rehearsal_runs_as_docs_sandbox_md_prints_it(sandbox, gpuops):
    """docs/sandbox.md: `gpuops sandbox up --image lambda-stack`, then `gpuops setup sandbox && gpuops train -s
    train.py -p sandbox`. setup refused (exit 2: the profile named the system python3, as no Lambda profile does);
    and once an `up` rewrote the profile, setup found nothing to do and left the job on the system python."""
    import shutil

    import yaml

    from gpuops.sandbox import host
    from support.runs import run_dir, run_id_of, wait_ended
    from support.envs import home

    shutil.rmtree(home(sandbox) / ".venvs" / "gpuops", ignore_errors=True)
    (Path.cwd() / "train.py").write_text("import sys, torch\nprint('python', sys.executable, torch.__version__)\n")
    try:
        for attempt in (1, 2):  # the second `up` regenerates the profile; the environment is already there
            assert gpuops("sandbox", "up", "--image", "lambda-stack").code == 0
            assert "python" not in yaml.safe_load(sandbox["profile"].read_text())  # as `gpuops up` writes one
            assert gpuops("sync", "-p", "sandbox").code == 0
            r = gpuops("setup", "sandbox")
            assert r.code == 0, r.all
            assert yaml.safe_load(sandbox["profile"].read_text())["python"] == "~/.venvs/gpuops/bin/python"
            r = gpuops("train", "-s", "train.py", "-p", "sandbox", "--no-sync")
            assert r.code == 0, r.all
            rid = run_id_of(r)
            assert wait_ended(sandbox, rid) == 0
            log = (run_dir(sandbox, rid) / "log").read_text()
            assert "/.venvs/gpuops/bin/python 2.9.0+cu128" in log, (attempt, log)  # the image's torch, seen
    finally:
        host.up()  # the session's sandbox as the other tests know it


def test_train_json_carries_the_warnings_said_before_the_launch(sandbox, gpuops):
    """train said on stderr that the script's checkpoints/pretrained.pt is left out by the sync and that a symlink
    points outside the project; its --json document had no word of either."""
    from support.runs import wait_ended

    root = Path.cwd()
    (root / "train.py").write_text("import os\nprint(os.path.exists('checkpoints/pretrained.pt'))\n")
    (root / "checkpoints").mkdir()
    (root / "checkpoints" / "pretrained.pt").write_text("weights")
    (root / "link").symlink_to("/etc/hostname")
    r = gpuops("train", "-p", "sandbox", "-s", "train.py", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert [w for w in doc["warnings"] if "train.py names checkpoints/pretrained.pt, which sync leaves out" in w]
    assert [w for w in doc["warnings"] if "1 symlink(s) point outside the project" in w]
    assert wait_ended(sandbox, doc["run_id"]) == 0


def test_a_missing_launch_key_is_hinted_with_the_option_that_gives_it(cloud, gpuops, tmp_path):
    """`run` and `up` take the key with --key (default ~/.ssh/id_ed25519); the hint said "set 'key:' in the profile",
    a profile the run has not written yet."""
    (Path.cwd() / "train.py").write_text("print(1)\n")
    for cmd in (["run", "--script", "train.py"], ["up", "box"]):
        r = gpuops(*cmd, "--type", TYPE, "--key", str(tmp_path / "nokey"), "--yes")
        assert r.code != 0 and f"key file not found: {tmp_path / 'nokey'}" in r.err, r.all
        assert "set 'key:' in the profile" not in r.err and "--key" in r.err.split("hint:", 1)[1], r.err
        assert "Traceback" not in r.all
    assert not cloud.launch_requests()
