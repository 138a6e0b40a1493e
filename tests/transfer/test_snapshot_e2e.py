"""Environment snapshots end to end through the sandbox host, with a sandbox Python that has packages installed
(a real venv with pip, plus packages installed as *.dist-info, which is what importlib.metadata and pip read)."""
from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.wandb_offline import wandb_artifact_and_config, wandb_records


def _install(site: Path, name: str, version: str) -> None:
    """A package as pip leaves it: an importable module and its dist-info (METADATA, INSTALLER, RECORD)."""
    mod = name.replace("-", "_").lower()
    for old in site.glob(f"{mod}-*.dist-info"):
        shutil.rmtree(old)
    (site / mod).mkdir(exist_ok=True)
    (site / mod / "__init__.py").write_text(f"__version__ = {version!r}\n")
    info = site / f"{mod}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: test\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text(f"{mod}/__init__.py,,\n{info.name}/METADATA,,\n")


def _uninstall(site: Path, name: str) -> None:
    mod = name.replace("-", "_").lower()
    for old in site.glob(f"{mod}-*.dist-info"):
        shutil.rmtree(old)
    shutil.rmtree(site / mod, ignore_errors=True)


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A real virtual environment (with pip) for the sandbox host's Python."""
    d = tmp_path_factory.mktemp("sandbox-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    py = d / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    version = subprocess.run([str(py), "-c", "import platform; print(platform.python_version())"],
                             check=True, capture_output=True, text=True).stdout.strip()
    return {"python": py, "site": site, "version": version}


@pytest.fixture
def venv_sandbox(sandbox, venv):
    """The sandbox profile pointed at the venv's Python, with numpy, transformers and demo-lib installed.
    The sandbox remembers its Python across `up()` calls, so the previous one is restored afterwards."""
    from gpuops.sandbox import host

    site = venv["site"]
    for name in list(site.glob("*.dist-info")):
        if not name.name.startswith(("pip-", "setuptools-")):
            shutil.rmtree(name)
    _install(site, "numpy", "1.26.4")
    _install(site, "transformers", "4.44.2")
    _install(site, "demo-lib", "0.1.0")
    before = host.read_state().get("python") or "python3"
    host.up(python=str(venv["python"]))
    try:
        yield {**sandbox, **venv}
    finally:
        host.up(python=before)


def test_snapshot_then_diff_after_a_package_changes(gpuops, venv_sandbox, isolated):
    site = venv_sandbox["site"]
    r = gpuops("snapshot", "sandbox", "--out", "snapA")
    assert r.code == 0, r.all
    assert re.search(rf"Python:\s+{re.escape(venv_sandbox['version'])}", r.out) and re.search(r"numpy:\s+1\.26\.4", r.out)
    assert re.search(r"GPUs:\s+1 x NVIDIA H100 PCIe", r.out)
    req = (isolated / "snapA" / "requirements.txt").read_text()
    body = [ln for ln in req.splitlines() if not ln.startswith("#")]
    assert {"demo-lib==0.1.0", "numpy==1.26.4", "transformers==4.44.2"} <= set(body)
    assert any(ln.startswith("pip==") for ln in body)  # pip freeze --all, from the venv's own pip
    env = json.loads((isolated / "snapA" / "environment.json").read_text())
    assert env["pip_freeze_source"] == "pip freeze --all"
    assert env["python_version_short"] == venv_sandbox["version"]
    assert env["python_executable"] == str(venv_sandbox["python"])
    assert env["packages"]["demo-lib"] == "0.1.0" and env["numpy_version"] == "1.26.4"
    assert env["transformers_version"] == "4.44.2" and env["torch_version"] is None
    assert env["driver_version"] == "570.148.08" and env["cuda_driver_version"] == "12.8"
    assert env["gpu_count"] == 1 and env["gpu_name"] == "NVIDIA H100 PCIe"
    assert env["source"]["profile"] == "sandbox"
    md = (isolated / "snapA" / "REPRODUCE.md").read_text()
    assert f"Python {venv_sandbox['version']}" in md and "| NVIDIA driver | 570.148.08 |" in md

    # the same environment again, live against saved: identical
    r = gpuops("diff", "snapA", "sandbox")
    assert r.code == 0, r.all
    assert r.out.startswith("identical:")

    # upgrade one package, add one, remove one
    _install(site, "numpy", "2.0.2")
    _install(site, "tqdm", "4.66.5")
    _uninstall(site, "demo-lib")
    r = gpuops("snapshot", "sandbox", "--out", "snapB")
    assert r.code == 0, r.all
    r = gpuops("diff", "snapA", "snapB")
    assert r.code == 1, r.all
    assert "~ numpy: 1.26.4 -> 2.0.2" in r.out
    assert "+ tqdm==4.66.5" in r.out and "- demo-lib==0.1.0" in r.out
    assert f"Python: {venv_sandbox['version']}  (same)" in r.out
    r = gpuops("diff", "snapA", "snapB", "--json")
    doc = json.loads(r.out)
    assert r.code == 1 and doc["changed"] == [["numpy", "1.26.4", "2.0.2"]]
    assert doc["added"] == [["tqdm", "4.66.5"]] and doc["removed"] == [["demo-lib", "0.1.0"]]


def test_diff_sees_a_gpu_and_driver_change(gpuops, venv_sandbox):
    from gpuops.sandbox import host

    assert gpuops("snapshot", "sandbox", "--out", "before").code == 0
    host.up(python=str(venv_sandbox["python"]), gpu="a100", gpus=2, driver="550.90.07", cuda="12.4")
    r = gpuops("diff", "before", "sandbox")
    assert r.code == 1, r.all
    assert "NVIDIA driver: 570.148.08 -> 550.90.07" in r.out
    assert "GPUs: 1 x NVIDIA H100 PCIe -> 2 x NVIDIA A100-SXM4-80GB" in r.out
    assert "CUDA (driver supports): 12.8 -> 12.4" in r.out


def test_capture_is_one_remote_execution(venv_sandbox, isolated):
    from gpuops.profiles import model as profiles
    from gpuops.transfer import snapshot as core
    from gpuops.remote.connection import connect

    prof = profiles.resolve("sandbox", isolated)
    remote = connect(prof, announce=lambda m: None)
    try:
        snap = core.capture(remote, prof)
        assert remote.exec_count == 1
    finally:
        remote.close()
    assert snap["packages"]["transformers"] == "4.44.2"


def test_snapshot_for_run_local_remote_and_wandb(venv_sandbox, isolated, tmp_path, monkeypatch, capsys):
    """What `gpuops train` calls: local runs/<id>/environment, the same files remotely, W&B when the key is set."""
    from gpuops.profiles import model as profiles
    from gpuops.transfer import snapshot as core
    from gpuops.console import Output
    from gpuops.remote.connection import connect

    key = "wandbkey-" + "9" * 31
    (isolated / ".env").write_text(f"WANDB_API_KEY={key}\nWANDB_PROJECT=e2e-proj\n")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    prof = profiles.resolve("sandbox", isolated)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    run_id = "20260115-100000-e2e1"
    remote = connect(prof, announce=lambda m: None)
    try:
        res = core.snapshot_for_run(remote, prof, run_id=run_id, remote_run_dir=f"~/proj dir/runs/{run_id}",
                                    local_dir=isolated / "runs" / run_id / "environment", out=out, seed=1234)
        assert remote.exec_count == 2  # capture + write, nothing else
    finally:
        remote.close()
    assert res["ok"], res["error"]
    local = isolated / "runs" / run_id / "environment"
    remote_dir = venv_sandbox["dir"] / "home" / "proj dir" / "runs" / run_id / "environment"
    for name in core.FILES:
        assert (local / name).read_bytes() == (remote_dir / name).read_bytes()
    env = json.loads((local / "environment.json").read_text())
    assert env["source"]["run_id"] == run_id and env["source"]["seed"] == 1234
    assert "seed **1234**" in (local / "REPRODUCE.md").read_text()

    wb = res["wandb"]
    assert wb and wb["mode"] == "offline" and wb["project"] == "e2e-proj"
    arts, config = wandb_artifact_and_config(Path(wb["run_dir"]))
    (art,) = arts
    assert art.type == "environment" and art.name == "sandbox-environment" and run_id in art.aliases
    assert sorted(c.path for c in art.manifest.contents) == sorted(core.FILES)
    assert json.loads(art.metadata)["source"]["run_id"] == run_id
    assert config["environment"]["python"] == venv_sandbox["version"]
    assert config["environment"]["driver"] == "570.148.08" and config["seed"] == 1234
    (run_rec,) = [rec.run for kind, rec in wandb_records(Path(wb["run_dir"])) if kind == "run"]
    assert run_rec.display_name == f"{run_id}-environment" and run_rec.run_group == "sandbox"
    assert run_rec.job_type == "environment"

    # the key never printed, never in a file we or wandb wrote
    cap = capsys.readouterr()
    assert key not in cap.out + cap.err + out.stdout.getvalue() + out.stderr.getvalue()
    for root in (local, remote_dir, tmp_path / "wb"):
        for f in root.rglob("*"):
            if f.is_file():
                assert key.encode() not in f.read_bytes(), f

    # and the run id works for diff
    from gpuops.cli import main

    assert main.run(["diff", run_id, str(local)]) == 0


def test_snapshot_for_run_never_raises(venv_sandbox, isolated):
    from gpuops.profiles import model as profiles
    from gpuops.transfer import snapshot as core
    from gpuops.console import Output
    from gpuops.remote.connection import connect

    prof = profiles.resolve("sandbox", isolated)
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    (isolated / "blocker").write_text("a file where a folder should go")
    remote = connect(prof, announce=lambda m: None)
    try:
        res = core.snapshot_for_run(remote, prof, run_id="r2", remote_run_dir="~/p/runs/r2",
                                    local_dir=isolated / "blocker" / "environment", out=out)
    finally:
        remote.close()
    assert not res["ok"] and "cannot write the snapshot" in res["error"]
    assert "environment snapshot failed" in out.stderr.getvalue()


def test_snapshot_wandb_flag_json(gpuops, venv_sandbox, isolated, tmp_path, monkeypatch):
    key = "secret-" + "x" * 33
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    (tmp_path / "wb").mkdir()
    r = gpuops("snapshot", "-p", "sandbox", "--wandb", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)  # stdout stays one JSON document despite wandb
    assert doc["out"] == "environment" and (isolated / "environment" / "REPRODUCE.md").is_file()
    assert doc["wandb"]["artifact"] == "sandbox-environment:latest"
    assert doc["snapshot"]["packages"]["numpy"] == "1.26.4"
    assert key not in r.all
    arts, config = wandb_artifact_and_config(Path(doc["wandb"]["run_dir"]))
    assert arts[0].type == "environment" and config["environment"]["gpu"] == "NVIDIA H100 PCIe"


def test_snapshot_wandb_online_without_key_fails_before_connecting(gpuops, sandbox, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    r = gpuops("snapshot", "sandbox", "--wandb")
    assert r.code == 2 and "WANDB_API_KEY" in r.err and "Traceback" not in r.all


def test_matrix_live_and_saved(gpuops, venv_sandbox, isolated):
    r = gpuops("matrix", "-p", "sandbox")
    assert r.code == 0, r.all
    assert f"| Python | {venv_sandbox['version']} | `python -V` |" in r.out
    assert "| NVIDIA driver | 570.148.08 |" in r.out and "| NumPy | 1.26.4 |" in r.out
    assert "live `gpuops snapshot`" in r.out
    assert gpuops("snapshot", "sandbox").code == 0  # default --out ./environment
    r = gpuops("matrix")  # nothing given: ./environment
    assert r.code == 0 and "| GPUs | 1 x NVIDIA H100 PCIe (80 GiB each) |" in r.out
    r = gpuops("matrix", "--from", "environment", "-p", "sandbox")
    assert "| Component | sandbox | sandbox (" in r.out


def test_broken_driver_still_snapshots(gpuops, sandbox):
    from gpuops.sandbox import host

    host.up(fail="driver-not-loaded")
    r = gpuops("snapshot", "sandbox", "--out", "env")
    assert r.code == 0, r.all
    assert "nvidia-smi failed (exit 9)" in r.err
    env = json.loads(Path("env/environment.json").read_text())
    assert env["gpu_count"] == 0 and any("couldn't communicate" in p for p in env["problems"])


def test_errors_have_exit_codes(gpuops, sandbox, isolated):
    r = gpuops("snapshot", "no-such-profile")
    assert r.code == 2 and "Traceback" not in r.all
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    text = Path(sandbox["profile"]).read_text()
    (isolated / "profiles").mkdir()
    (isolated / "profiles" / "closed.yaml").write_text(
        "\n".join(f"port: {port}" if ln.startswith("port:") else ln for ln in text.splitlines()) + "\n")
    r = gpuops("snapshot", "closed")
    assert r.code == 3, r.all
    r = gpuops("diff", "closed", "closed")
    assert r.code == 3, r.all
    r = gpuops("diff", "profiles/closed.yaml", "closed")  # a profile by its path
    assert r.code == 3, r.all


def test_unwritable_out_fails_before_connecting(sandbox, gpuops, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = gpuops("snapshot", "sandbox", "--out", str(blocker / "sub"))
    assert r.code == 2 and "cannot write the snapshot" in r.err
    assert "capturing" not in r.err  # nothing was gathered on the host
