"""Issue #28 end to end through the sandbox: what sync sends, secrets and settings, processes. The pure parts:
tests/transfer/test_syncsec_unit.py."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from support import wait_for
from support.blackhole import Blackhole
from support.runs import put, remote_project, run_dir, run_id_of, run_texts, wait_ended


def write(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_node_modules_is_excluded_by_default(sandbox, gpuops):
    here = Path.cwd()
    for rel in ["train.py", "node_modules/left-pad/index.js", "web/node_modules/x/y.js"]:
        write(here / rel)
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 0, r.all
    assert tree(remote_project(sandbox)) == {"train.py"}


ENV_SPY = """\
import json, os
json.dump({k: v for k, v in os.environ.items()}, open("env.json", "w"))
print("ok", flush=True)
"""


def test_every_dotenv_variable_and_secret_looking_env_reach_the_job_as_secrets(sandbox, gpuops, monkeypatch):
    monkeypatch.delenv("WANDB_MODE")  # the tests' own setting: here the project's .env decides
    values = {"HF_TOKEN": "hf_TOKENVALUE_5a4b3c", "WANDB_MODE": "offline-mode-x7", "WANDB_PROJECT": "proj-q9z8",
              "MY_SETTING": "setting-v1w2"}
    Path(".env").write_text("".join(f"{k}={v}\n" for k, v in values.items()) +
                            "LAMBDA_API_KEY=secret_lambda_abc.def\nGPUOPS_SOMETHING=gpuops-own-1\n")
    os.chmod(".env", 0o600)
    put(sandbox, "spy.py", ENV_SPY)
    cli = "openai-cli-secret-3k4j"
    res = gpuops("train", "--script", "spy.py", "--no-sync", "--no-snapshot", "--env", f"OPENAI_API_KEY={cli}",
                 "--env", "PLAIN_ONE=visible-1")
    rid = run_id_of(res)
    assert wait_ended(sandbox, rid) == 0
    got = json.loads((remote_project(sandbox) / "env.json").read_text())
    for k, v in values.items():
        assert got.get(k) == v, k
    assert got["OPENAI_API_KEY"] == cli and got["PLAIN_ONE"] == "visible-1"
    assert "LAMBDA_API_KEY" not in got and "GPUOPS_SOMETHING" not in got  # gpuops' own stay here
    # the launch lists the names it sent, never the values
    for name in [*values, "OPENAI_API_KEY"]:
        assert f"{name}=<secret" in res.err, name
    assert "PLAIN_ONE=visible-1" in res.err
    places = {"train output": res.all, **run_texts(run_dir(sandbox, rid), rid)}
    for where, text in places.items():
        for v in [*values.values(), cli]:
            assert v not in text, f"{v} leaked in {where}"
    meta = json.loads((Path("runs") / rid / "meta.json").read_text())
    assert sorted(meta["secrets"]) == sorted([*values, "OPENAI_API_KEY"])


SETSID_CHILD = """\
import os, signal, subprocess, sys, time
env = dict(os.environ, GPUOPS_SANDBOX_HOLD="0:40000")
child = subprocess.Popen([sys.executable, "-c",
    "import os, signal, time\\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\\n"
    "open('setsid_child.pid', 'w').write(str(os.getpid()))\\ntime.sleep(600)"], env=env, start_new_session=True)
print("training", flush=True)
time.sleep(600)
"""


def _pid_alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_stop_ends_a_child_that_started_its_own_session_and_the_next_train_sees_the_gpu_free(sandbox, gpuops):
    import signal

    put(sandbox, "setsid_job.py", SETSID_CHILD)
    put(sandbox, "quick.py", "print('quick', flush=True)\n")
    rid = run_id_of(gpuops("train", "--script", "setsid_job.py", "--no-sync", "--no-snapshot"))
    proj = remote_project(sandbox)
    f = proj / "setsid_child.pid"
    child = int(wait_for(lambda: f.is_file() and f.read_text(), what="the setsid child"))
    try:
        assert os.getsid(child) == child  # its own session: not in the launcher's process group
        res = gpuops("stop", rid, "--grace", "0.5", "--json")
        assert res.code == 0, res.all
        wait_for(lambda: not _pid_alive(child), timeout=5, what="the setsid child to end")
        nxt = gpuops("train", "--script", "quick.py", "--no-sync", "--no-snapshot", "--name", "next")
        assert nxt.code == 0, nxt.all
        assert "holds" not in nxt.err
        assert wait_ended(sandbox, run_id_of(nxt)) == 0
    finally:
        if _pid_alive(child):
            os.kill(child, signal.SIGKILL)


def _snapshot_with_wandb(sandbox, isolated):
    import io

    from gpuops.console import Output
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect
    from gpuops.transfer import snapshot as snap

    prof = profiles.resolve("sandbox", isolated)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    rid = "wb-20260115-100000"
    remote = connect(prof, announce=lambda m: None)
    t0 = time.monotonic()
    try:
        res = snap.snapshot_for_run(remote, prof, run_id=rid, remote_run_dir=f"~/wbproj/runs/{rid}",
                                    local_dir=isolated / "runs" / rid / "environment", out=out, project_dir=isolated)
    finally:
        remote.close()
    return res, time.monotonic() - t0, out.stderr.getvalue()


@pytest.fixture
def wandb_server(monkeypatch, tmp_path):
    hole = Blackhole()
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{hole.port}")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    monkeypatch.delenv("WANDB_MODE")  # the tests' own setting: here the project's .env decides
    yield hole
    hole.close()


def test_gpuops_wandb_logging_obeys_wandb_mode_offline_in_dotenv(sandbox, isolated, wandb_server):
    (isolated / ".env").write_text("WANDB_API_KEY=" + "7a" * 20 + "\nWANDB_MODE=offline\n")
    res, took, _ = _snapshot_with_wandb(sandbox, isolated)
    assert res["ok"] and res["error"] is None, res["error"]
    assert res["wandb"]["mode"] == "offline"
    assert not wandb_server.accepted  # the network was never tried
    assert took < 60


def test_gpuops_wandb_logging_is_bounded_in_time(sandbox, isolated, wandb_server):
    (isolated / ".env").write_text("WANDB_API_KEY=" + "7a" * 20 + "\nGPUOPS_WANDB_TIMEOUT=4\n")
    res, took, err = _snapshot_with_wandb(sandbox, isolated)
    assert res["ok"] and res["wandb"] is None  # the snapshot itself is kept
    assert "W&B logging gave up after 4s" in res["error"]
    assert "gave up after 4s" in err and "7a7a7a" not in err
    assert took < 30


# -- what sync sends ------------------------------------------------------------------------------------------------
def sparse(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)
    return path


class _Terminal:
    """stdin as a person at a terminal who answers `answer` to the question."""

    def __init__(self, answer: str):
        import io

        self._buf = io.StringIO(answer + "\n")

    def isatty(self):
        return True

    def readline(self, *a):
        return self._buf.readline(*a)

    def read(self, *a):
        return self._buf.read(*a)


def test_a_large_upload_is_said_with_its_biggest_folders_and_a_resync_of_it_is_not(sandbox, gpuops):
    write(Path.cwd() / "train.py", "print('hi')\n")
    sparse(Path.cwd() / "data" / "forgotten.bin", 120_000_000)  # far more than the code (> 100 MB, > 50x)
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    (w,) = [w for w in doc["warnings"] if "this sync uploads" in w]
    assert w.startswith("this sync uploads 120.0 MB (2 files) to sandbox:") and "the biggest: data/ 120.0 MB" in w
    assert ".gpuopsignore" in w
    assert (remote_project(sandbox) / "data" / "forgotten.bin").stat().st_size == 120_000_000
    again = gpuops("sync", "-p", "sandbox", "--json")  # nothing would go: nothing said
    assert again.code == 0 and not [w for w in json.loads(again.out)["warnings"] if "uploads" in w]


def test_a_large_upload_declined_at_a_terminal_sends_nothing_and_yes_skips_the_question(sandbox, gpuops, monkeypatch):
    import sys

    write(Path.cwd() / "train.py", "print('hi')\n")
    sparse(Path.cwd() / "data" / "huge.bin", 600_000_000)
    monkeypatch.setattr(sys, "stdin", _Terminal("n"))
    r = gpuops("sync", "-p", "sandbox")
    assert r.code == 1, r.all
    assert "this sync uploads 600.0 MB" in r.err and "upload 600.0 MB to sandbox?" in r.err
    assert "not synced: 600.0 MB would have been uploaded" in r.err and "Traceback" not in r.all
    assert not (remote_project(sandbox) / "train.py").exists()  # nothing was sent
    monkeypatch.setattr(sys, "stdin", _Terminal(""))  # --yes: no question read
    sparse(Path.cwd() / "data" / "huge.bin", 0)  # (and nothing big to send, so the test stays fast)
    sparse(Path.cwd() / "data" / "big.bin", 130_000_000)
    r = gpuops("sync", "-p", "sandbox", "--yes")
    assert r.code == 0, r.all
    assert "this sync uploads 130.0 MB" in r.err and "upload 130.0 MB to sandbox?" not in r.err
    assert (remote_project(sandbox) / "train.py").exists()


def test_symlinks_pointing_outside_are_said_in_text_and_json_and_copy_links_sends_their_targets(sandbox, gpuops,
                                                                                                tmp_path):
    outside = tmp_path / "shared-weights"
    write(outside / "w.bin", "weights")
    write(Path.cwd() / "train.py", "print('hi')\n")
    (Path.cwd() / "weights.bin").symlink_to(outside / "w.bin")
    (Path.cwd() / "shared").symlink_to(outside)
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    (w,) = [w for w in doc["warnings"] if "symlink" in w]
    assert w.startswith("2 symlink(s) point outside the project and would arrive on the host as links")
    assert "--copy-links" in w
    assert sorted(x["path"] for x in doc["outside_links"]) == ["shared", "weights.bin"]
    remote = remote_project(sandbox)
    # a link to a path of this machine (the sandbox host is this machine: on a real host it dangles)
    assert (remote / "weights.bin").is_symlink() and os.readlink(remote / "weights.bin") == str(outside / "w.bin")
    t = gpuops("sync", "-p", "sandbox")
    assert "2 symlink(s) point outside the project" in t.err
    c = gpuops("sync", "-p", "sandbox", "--copy-links", "--json")
    assert c.code == 0, c.all
    assert not (remote / "weights.bin").is_symlink() and (remote / "weights.bin").read_text() == "weights"
    assert (remote / "shared" / "w.bin").read_text() == "weights" and not (remote / "shared").is_symlink()
    assert any("their targets are copied" in w for w in json.loads(c.out)["warnings"])
    # the profile's sync.copy_links says the same
    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "sync:\n  copy_links: true\n")
    assert any("their targets are copied" in w for w in json.loads(gpuops("sync", "-p", "sandbox", "--json").out)["warnings"])


def test_train_says_before_it_syncs_that_a_file_the_script_names_is_left_out(sandbox, gpuops):
    write(Path.cwd() / "train.py", "import os\nprint(os.path.exists('checkpoints/pretrained.pt'), flush=True)\n")
    sparse(Path.cwd() / "checkpoints" / "pretrained.pt", 1000)
    r = gpuops("train", "--script", "train.py", "--no-snapshot")
    assert r.code == 0, r.all
    said = ("train.py names checkpoints/pretrained.pt, which sync leaves out (rule 'checkpoints' of the profile's "
            "sync.exclude): the job will not find it on the host; to send it: set sync: exclude:")
    assert said in r.err
    assert r.err.index(said) < r.err.index("syncing")  # before anything is sent
    assert wait_ended(sandbox, run_id_of(r)) == 0


from support.cloud import TYPE


def test_run_says_what_sync_leaves_out_and_asks_before_a_large_upload_before_anything_bills(cloud, gpuops,
                                                                                           monkeypatch):
    import sys

    from gpuops.pipeline import stages as pl

    write(Path.cwd() / "train.py", "import torch\nsd = torch.load('checkpoints/pretrained.pt')\n")
    sparse(Path.cwd() / "checkpoints" / "pretrained.pt", 1000)
    sparse(Path.cwd() / "data" / "forgotten.bin", 2_000_000_000)
    (Path.cwd() / "link").symlink_to("/etc/hostname")
    monkeypatch.setattr(sys, "stdin", _Terminal("n"))
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--script", "train.py")
    assert r.code == 1, r.all
    assert "train.py names checkpoints/pretrained.pt, which sync leaves out (rule 'checkpoints'" in r.err
    assert "1 symlink(s) point outside the project" in r.err
    assert "this sync uploads 2.0 GB (2 files); the biggest: data/ 2.0 GB" in r.err
    assert "upload 2.0 GB once the instance is up?" in r.err and "not launched" in r.err
    assert "--exclude" not in r.err and "give data with --data" in r.err  # run has no --exclude (review28)
    assert not cloud.launch_requests() and not cloud.instances()  # nothing billed
    d = pl.records_dir(Path.cwd())
    assert not (d.is_dir() and any(d.iterdir()))  # and no run record left behind


# -- rehearsing with the Lambda Stack image --------------------------------------------------------------------------
def test_sandbox_up_image_lambda_stack_gives_the_host_lambda_stacks_python(sandbox, gpuops):
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect
    from gpuops.sandbox import host

    try:
        r = gpuops("sandbox", "up", "--image", "lambda-stack", "--json")
        assert r.code == 0, r.all
        assert json.loads(r.out)["image"] == "lambda-stack"
        prof = profiles.resolve("sandbox", Path.cwd())
        with connect(prof, announce=lambda m: None) as remote:
            res = remote.run("python3 -c 'import torch, sys; print(torch.__version__, torch.version.cuda, sys.prefix)'",
                             timeout=60)
        assert res.rc == 0, res.stderr
        version, cuda, prefix = res.stdout.split()
        assert (version, cuda) == ("2.9.0+cu128", "12.8") and prefix.endswith("images/lambda-stack")
        bad = gpuops("sandbox", "up", "--image", "ubuntu")
        assert bad.code == 2 and "unknown image; known: lambda-stack" in bad.err
    finally:
        host.up()  # the session's sandbox as the other tests know it


def test_sandbox_up_cloud_image_lambda_stack_sets_what_instances_boot_with(starts_hosts, gpuops, monkeypatch,
                                                                           tmp_path):
    import urllib.request

    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    r = gpuops("sandbox", "up", "--cloud", "--image", "lambda-stack", "--json", "--boot-seconds", "0.2")
    assert r.code == 0, r.all
    info = json.loads(r.out)
    try:
        def image() -> str:
            req = urllib.request.Request(info["url"].rsplit("/api/v1", 1)[0] + "/_emulator/state",
                                         headers={"Authorization": f"Bearer {info['api_key']}"})
            with urllib.request.urlopen(req, timeout=5) as resp:
                return json.loads(resp.read())["data"]["image"]

        assert info["image"] == "lambda-stack" and image() == "lambda-stack"
    finally:
        gpuops("sandbox", "down", "--cloud")
