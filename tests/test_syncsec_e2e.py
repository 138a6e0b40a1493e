"""Issue #28 end to end through the sandbox: what sync sends, secrets and settings, processes. The pure parts:
tests/test_syncsec_unit.py."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from test_runs_e2e import cleanup_runs, put, remote_project, run_dir, run_id_of, wait_ended, wait_for  # noqa: F401


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
    places = {"train output": res.all}
    for f in run_dir(sandbox, rid).rglob("*"):
        if f.is_file():
            places[f"remote {f.name}"] = f.read_text(errors="replace")
    for f in (Path("runs") / rid).rglob("*"):
        if f.is_file():
            places[f"local {f}"] = f.read_text(errors="replace")
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


class Blackhole:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a W&B server that hangs."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.sock.close()
        for c in self.accepted:
            c.close()


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
