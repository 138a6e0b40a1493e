"""train / logs / status / stop end to end through the sandbox's real sshd."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from support import wait_for
from support.runs import (CRASH, FOREVER, OOM, STEPS, alive, group_alive, meta, put, remote_project, run_dir,
                          run_id_of, run_texts, wait_ended, write)


pytestmark = pytest.mark.usefixtures("cleanup_runs")


def test_train_syncs_runs_detached_and_records(sandbox, gpuops):
    write(Path("train.py"), STEPS)
    res = gpuops("train", "--script", "train.py", "-e", "STEPS=3", "--", "--lr", "1e-6")
    rid = run_id_of(res)
    assert rid.startswith("train-") and len(rid) == len("train-20250101-120000-beef")
    assert f"gpuops watch {rid}" in res.err and f"gpuops logs -f {rid}" in res.err
    assert (remote_project(sandbox) / "train.py").is_file()  # synced
    # detached: its own session and process group, streams redirected
    assert wait_ended(sandbox, rid) == 0
    d = run_dir(sandbox, rid)
    pid = int((d / "pid").read_text())
    sess = json.loads((remote_project(sandbox) / "session.json").read_text())
    assert sess["sid"] == pid and sess["pgid"] == pid  # the launcher leads the job's session and process group
    assert sess["fds"] == ["/dev/null", str(d / "log"), str(d / "log")]
    assert (remote_project(sandbox) / "checkpoints" / "global_step_3").is_dir()
    log = (d / "log").read_text()
    assert "step 3/3" in log and "done" in log
    m = json.loads((d / "meta.json").read_text())
    local = meta(rid)
    for doc in (m, local):
        assert doc["script"] == "train.py" and doc["args"] == ["--lr", "1e-6"]
        assert doc["profile"] == "sandbox" and doc["run_id"] == rid
        assert "git_commit" in doc and "git_dirty" in doc and doc["started_at"]
    # logs, logs -f, status
    res = gpuops("logs", rid, "-n", "2")
    assert res.code == 0 and res.out.splitlines() == ["step 3/3 loss=0.3333", "done"]
    res = gpuops("logs", "-f")
    assert res.code == 0 and "step 1/3" in res.out and res.out.rstrip().endswith("done")
    res = gpuops("status", "--json")
    doc = json.loads(res.out)
    row = [r for r in doc["runs"] if r["run_id"] == rid][0]
    assert row["state"] == "succeeded" and row["exit_code"] == 0 and row["script"] == "train.py"
    assert doc["gpus"] and "util" in doc["gpus"][0]  # other jobs on this machine may load the emulated GPU
    res = gpuops("status")
    assert res.code == 0 and rid in res.out and "succeeded" in res.out
    assert json.loads((Path("runs") / rid / "state.json").read_text())["state"] == "succeeded"


def test_job_survives_client_disconnect(sandbox, gpuops):
    put(sandbox, "slow.py", "import time\ntime.sleep(8)\nopen('finished', 'w').write('yes')\nprint('bye')\n")
    rid = run_id_of(gpuops("train", "--script", "slow.py", "--no-sync", "--no-snapshot"))
    assert not (run_dir(sandbox, rid) / "exit_code").exists()  # still running; the connection is closed
    assert wait_ended(sandbox, rid) == 0
    assert (remote_project(sandbox) / "finished").read_text() == "yes"


def test_exit_codes_recorded_and_returned(sandbox, gpuops):
    put(sandbox, "crash.py", CRASH)
    put(sandbox, "three.py", "import sys\nprint('x')\nsys.exit(3)\n")
    rid = run_id_of(gpuops("train", "--script", "crash.py", "--no-sync", "--no-snapshot"))
    assert wait_ended(sandbox, rid) == 1
    res = gpuops("logs", "-f", rid)
    assert res.code == 1 and "RuntimeError: boom" in res.out
    rid3 = run_id_of(gpuops("train", "--script", "three.py", "--no-sync", "--no-snapshot", "--name", "three"))
    assert rid3.startswith("three-")
    res = gpuops("logs", "-f", rid3)
    assert res.code == 1 and "exit 3" in res.err, res.all  # gpuops' own codes: 3 would mean a connection error
    assert gpuops("watch", rid3).code == 1
    res = gpuops("status", "--json")
    states = {r["run_id"]: (r["state"], r["exit_code"]) for r in json.loads(res.out)["runs"]}
    assert states[rid] == ("failed", 1) and states[rid3] == ("failed", 3)


def test_env_precedence_preset_profile_cli_and_seed(sandbox, gpuops):
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + 'env:\n  NVIDIA_TF32_OVERRIDE: "0"\n  FROM_PROFILE: "p"\n  SHARED: profile\n')
    put(sandbox, "envdump.py", "import json, os\njson.dump(dict(os.environ), open('env.json', 'w'))\n")
    res = gpuops("train", "--script", "envdump.py", "--no-sync", "--no-snapshot", "-e", "SHARED=cli", "-e", "CUDA_DEVICE_MAX_CONNECTIONS=8",
                 "-e", "PYTORCH_CUDA_ALLOC_CONF=", "--seed", "1234")
    rid = run_id_of(res)
    assert wait_ended(sandbox, rid) == 0
    env = json.loads((remote_project(sandbox) / "env.json").read_text())
    assert env["VLLM_ATTENTION_BACKEND"] == "FLASH_ATTN"  # preset h100
    assert env["NVIDIA_TF32_OVERRIDE"] == "0"  # profile over preset
    assert env["FROM_PROFILE"] == "p"
    assert env["SHARED"] == "cli" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "8"  # --env over both
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env  # --env NAME= unsets
    assert env["GPUOPS_SEED"] == "1234" and env["PYTHONHASHSEED"] == "1234"
    assert env["WANDB_RUN_NAME"] == rid and env["WANDB_RUN_GROUP"] == "sandbox"
    assert env["GPUOPS_RUN_ID"] == rid
    # the variables used were printed before launch, with where they came from
    assert "NVIDIA_TF32_OVERRIDE=0  [profile]" in res.err and "SHARED=cli  [--env]" in res.err
    assert "PYTORCH_CUDA_ALLOC_CONF(unset)" in res.err
    assert meta(rid)["seed"] == 1234


def test_conflict_warned_when_vllm_installed(sandbox, gpuops):
    """expandable_segments (preset h100) + vLLM >= 0.8 on the host: warned, launched anyway."""
    site = Path(sandbox["dir"]) / "home" / ".local" / "lib"
    import subprocess

    py = subprocess.run(["python3", "-c", "import sys; print('python%d.%d' % sys.version_info[:2])"],
                        capture_output=True, text=True).stdout.strip()
    dist = site / py / "site-packages" / "vllm-0.12.0.dist-info"
    write(dist / "METADATA", "Metadata-Version: 2.1\nName: vllm\nVersion: 0.12.0\n")
    try:
        put(sandbox, "ok.py", "print('ok')\n")
        res = gpuops("train", "--script", "ok.py", "--no-sync", "--no-snapshot")
        assert res.code == 0, res.all
        assert "expandable_segments" in res.err and "vllm 0.12.0 is installed" in res.err
        wait_ended(sandbox, run_id_of(res))
    finally:
        import shutil

        shutil.rmtree(dist)


def test_secrets_never_on_command_line_meta_logs_or_output(sandbox, gpuops, monkeypatch):
    wandb_key = "wk_" + "a1b2c3d4" * 6
    hf = "hf_SECRETVALUE_9f8e7d6c5b4a"
    monkeypatch.setenv("WANDB_API_KEY", wandb_key)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    Path(".env").write_text(f"HF_TOKEN={hf}\n")
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "secrets: [HF_TOKEN]\n")
    put(sandbox, "spy.py", """\
import os, subprocess, time
time.sleep(0.3)
open("ps.txt", "w").write(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
open("got.txt", "w").write(os.environ.get("HF_TOKEN", "") + "\\n" + os.environ.get("WANDB_API_KEY", ""))
print("have secrets:", bool(os.environ.get("HF_TOKEN")), bool(os.environ.get("WANDB_API_KEY")))
""")
    res = gpuops("train", "--script", "spy.py", "--no-sync", "--no-snapshot")
    rid = run_id_of(res)
    assert wait_ended(sandbox, rid) == 0
    proj = remote_project(sandbox)
    assert (proj / "got.txt").read_text() == f"{hf}\n{wandb_key}"  # the job has them
    ps = (proj / "ps.txt").read_text()
    assert "spy.py" in ps  # the listing is real
    d = run_dir(sandbox, rid)
    assert not (d / "secrets.env").exists()  # sourced, then deleted
    logs = gpuops("logs", rid)
    assert "have secrets: True True" in logs.out
    places = {"remote ps": ps, "train output": res.all, "logs output": logs.all, **run_texts(d, rid)}
    for where, text in places.items():
        assert hf not in text and wandb_key not in text, f"secret leaked in {where}"
    assert sorted(meta(rid)["secrets"]) == ["HF_TOKEN", "WANDB_API_KEY"]
    assert "HF_TOKEN=<secret, from .env>" in res.err


def test_hostile_script_name_and_args_run_literally(sandbox, gpuops):
    name = "we ird;$(touch PWNED1) `touch PWNED2` 'q\".py"
    args = ["a b", "$(touch PWNED3)", "`touch PWNED4`", "; touch PWNED5", "'\"", "--x=$HOME", "*"]
    put(sandbox, name, "import json, sys\njson.dump(sys.argv, open('argv.json', 'w'))\n")
    rid = run_id_of(gpuops("train", "--script", name, "--no-sync", "--no-snapshot", "--name", "hostile", "--", *args))
    assert wait_ended(sandbox, rid) == 0
    proj = remote_project(sandbox)
    assert json.loads((proj / "argv.json").read_text()) == [name, *args]
    home = Path(sandbox["dir"]) / "home"
    assert not [p for p in (*home.rglob("PWNED*"), *Path.cwd().rglob("PWNED*"))]
    assert meta(rid)["args"] == args and meta(rid)["script"] == name


def test_preflight_refuses_while_another_run_is_running(sandbox, gpuops):
    put(sandbox, "forever.py", FOREVER)
    first = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot", "--name", "first"))
    res = gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot", "--name", "second")
    assert res.code == 1 and first in res.err and "--force" in res.err
    second = run_id_of(gpuops("train", "--script", "forever.py", "--no-sync", "--no-snapshot", "--name", "second", "--force"))
    for rid in (first, second):
        res = gpuops("stop", rid, "--grace", "3")
        assert res.code == 0, res.all
        assert "SIGINT" in res.err
    res = gpuops("status", "--json")
    rows = {r["run_id"]: r for r in json.loads(res.out)["runs"]}
    assert rows[first]["state"] == "stopped" and rows[first]["exit_code"] == 130
    assert "interrupted: saving" in (run_dir(sandbox, first) / "log").read_text()
    # stopping a run that has ended says so
    res = gpuops("stop", first)
    assert res.code == 0 and "not running" in res.err


def test_stop_ends_the_whole_process_group(sandbox, gpuops):
    put(sandbox, "stubborn.py", """\
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time\\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "open('child.pid', 'w').write(str(__import__('os').getpid()))\\ntime.sleep(600)"])
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("running", flush=True)
time.sleep(600)
""")
    rid = run_id_of(gpuops("train", "--script", "stubborn.py", "--no-sync", "--no-snapshot"))
    proj = remote_project(sandbox)
    child = int(wait_for(lambda: (proj / "child.pid").is_file() and (proj / "child.pid").read_text(), what="child"))
    pgid = int((run_dir(sandbox, rid) / "pid").read_text())
    assert alive(child)
    t0 = time.monotonic()
    res = gpuops("stop", rid, "--grace", "0.5", "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    assert doc["result"] == "KILL" and doc["state"] == "stopped" and doc["exit_code"] == 137
    assert time.monotonic() - t0 < 10
    assert not alive(child) and not group_alive(pgid)
    stop = json.loads((run_dir(sandbox, rid) / "stop.json").read_text())
    assert stop["signal"] == "KILL" and stop["by"] == "gpuops stop"


def test_a_stop_after_the_job_ended_by_itself_claims_nothing(sandbox, gpuops):
    """The job's command returned by itself (exit 5: a GPU that killed it, say) and its launcher is still recording
    the end (its end facts: df, made slow here, 3 s a call): `stop` waits for that end and signals nothing; the run
    keeps its own exit code and no stop record (before: the stop signalled the launcher, wrote stop.json, said
    `INT`, and a run whose GPU had killed its job was said to be stopped by gpuops)."""
    slow = Path(sandbox["dir"]) / "home" / "slowbin"
    write(slow / "df", "#!/bin/sh\nsleep 3\nexec /usr/bin/df \"$@\"\n")
    (slow / "df").chmod(0o755)
    put(sandbox, "five.py", "import sys\nprint('bye', flush=True)\nsys.exit(5)\n")
    rid = run_id_of(gpuops("train", "--script", "five.py", "--no-sync", "--no-snapshot",
                           "-e", f"PATH={slow}:/usr/local/bin:/usr/bin:/bin"))
    d = run_dir(sandbox, rid)
    wait_for(lambda: (d / "job_ended").is_file(), what="the job's command returned")
    assert not (d / "exit_code").exists(), "the launcher's end facts were not slow: nothing to test"
    res = gpuops("stop", rid, "--json")
    assert res.code == 0, res.all
    doc = json.loads(res.out)
    assert doc["result"] == "notrunning" and doc["exit_code"] == 5 and doc["state"] == "failed", doc
    assert not (d / "stop.json").exists() and "signal" not in (d / "end.facts").read_text()


def test_no_gpu_refuses_launch(sandbox, gpuops):
    from gpuops.sandbox import host

    host.up(fail="driver-not-loaded")
    put(sandbox, "ok.py", "print('ok')\n")
    res = gpuops("train", "--script", "ok.py", "--no-sync", "--no-snapshot")
    assert res.code == 1 and "no GPU visible" in res.err and "couldn't communicate with the NVIDIA driver" in res.err
    assert not (Path("runs")).exists()


def test_usage_errors(sandbox, gpuops):
    assert gpuops("train", "--script", "missing.py").code == 2
    write(Path("ok.py"), "print(1)\n")
    res = gpuops("train", "--script", "ok.py", "--no-sync", "--no-snapshot", "-e", "NOEQUALS")
    assert res.code == 2 and "NAME=VALUE" in res.err
    res = gpuops("train", "--script", "nothere.py", "--no-sync", "--no-snapshot")
    assert res.code == 2 and "not found on the host" in res.err
    assert gpuops("watch", "nosuchrun").code == 1
    res = gpuops("stop", "nosuchrun")
    assert res.code == 1 and "run nosuchrun not found" in res.err
    assert gpuops("logs").code == 2  # no runs recorded


def test_oom_highlighted(sandbox, gpuops):
    put(sandbox, "oom.py", OOM)
    rid = run_id_of(gpuops("train", "--script", "oom.py", "--no-sync", "--no-snapshot"))
    wait_ended(sandbox, rid)
    res = gpuops("watch", rid, "--json")
    assert res.code == 1
    docs = [json.loads(x) for x in res.out.splitlines()]
    oom = [d for d in docs if d["type"] == "log" and "CUDA out of memory" in d["line"]]
    assert oom and oom[0]["kind"] == "error"
    res = gpuops("watch", rid)
    assert "log ! torch.OutOfMemoryError" in res.out


def test_shell_scripts_run_as_by_hand(sandbox, gpuops):
    """A runbook script uses bash features; gpuops must not hand it to sh (dash on Ubuntu)."""
    bashy = '#!/usr/bin/env bash\nset -euo pipefail\narr=(a b c)\nif [[ ${#arr[@]} -eq 3 ]]; then echo "bash ok ${arr[2]} $1"; fi\n'
    put(sandbox, "run_h100_multisignal.sh", bashy)  # not executable: the #! line is still honoured
    rid = run_id_of(gpuops("train", "--script", "run_h100_multisignal.sh", "--no-sync", "--no-snapshot", "--", "--quick"))
    assert wait_ended(sandbox, rid) == 0
    assert "bash ok c --quick" in (run_dir(sandbox, rid) / "log").read_text()
    put(sandbox, "noshebang.sh", 'arr=(x y)\necho "no shebang ${arr[1]}"\n')  # no #!: bash, as the runbooks assume
    rid = run_id_of(gpuops("train", "--script", "noshebang.sh", "--no-sync", "--no-snapshot", "--name", "nos"))
    assert wait_ended(sandbox, rid) == 0
    assert "no shebang y" in (run_dir(sandbox, rid) / "log").read_text()
