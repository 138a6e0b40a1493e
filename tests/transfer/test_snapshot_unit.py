"""Environment snapshots on recorded probe outputs (tests/data/snapshot/): build, the three files, the CLI's diff and
matrix on saved snapshots (the comparing itself: test_snapcompare_unit.py), and W&B logging with the real wandb
library in offline mode."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuops.transfer import snapshot as core
from gpuops.errors import RemoteError, UsageError
from support.wandb_offline import wandb_artifact_and_config
from support import DATA as TEST_DATA


DATA = TEST_DATA / "snapshot"
WHEN = "2026-01-15T10:00:00Z"


def facts(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def snap(name: str, **kw) -> dict:
    return core.build(facts(name), captured_at=WHEN, **kw)


class Prof:
    name, instance_type, region, python = "lambda-h100", "gpu_2x_h100_sxm5", "us-east-1", "python3"


# -- building ------------------------------------------------------------------------------------------
def test_build_h100_has_every_documented_field():
    s = snap("probe_h100_torch29_cu128.json", profile=Prof(), extra={"run_id": "r1", "seed": 7})
    assert s["python_version_short"] == "3.10.12"
    assert s["python_version"].startswith("3.10.12 (main")
    assert s["platform"] == "Linux-6.8.0-1015-gcp-x86_64-with-glibc2.35"
    assert (s["os_name"], s["os_release"]) == ("Ubuntu 22.04.4 LTS", "6.8.0-1015-gcp")
    assert s["torch_version"] == "2.9.0+cu128"
    assert s["transformers_version"] == "4.57.1" and s["numpy_version"] == "2.1.2"
    assert s["cuda_available"] is True and s["cuda_version"] == "12.8"
    assert s["cudnn_version"] == "9.10.2"
    assert s["driver_version"] == "570.148.08" and s["cuda_driver_version"] == "12.8"
    assert s["gpu_name"] == "NVIDIA H100 80GB HBM3" and s["gpu_count"] == 2
    assert [g["compute_cap"] for g in s["gpus"]] == ["9.0", "9.0"]
    assert s["torch_index_url"] == "https://download.pytorch.org/whl/cu128"
    assert s["pip_freeze_source"] == "pip freeze --all"
    assert s["packages"]["torch"] == "2.9.0+cu128" and len(s["packages"]) == 14
    assert s["source"] == {"profile": "lambda-h100", "instance_type": "gpu_2x_h100_sxm5", "region": "us-east-1",
                           "python": "python3", "run_id": "r1", "seed": 7}
    assert s["problems"] == []
    assert s["captured_at"] == WHEN


def test_credentials_in_urls_never_reach_the_files():
    s = snap("probe_h100_torch29_cu128.json")
    files = core.render_files(s)
    for text in files.values():
        assert "ghp_SECRETTOKEN123" not in text and "oauth2:" not in text
    req = files["requirements.txt"]
    assert "my-lab-utils @ git+https://****@github.com/lab/my-lab-utils.git@4f2a9c1" in req
    assert "flash_attn @ git+ssh://git@github.com/Dao-AILab/flash-attention.git@v2.8.3" in req  # ssh user kept


@pytest.mark.parametrize("text,expected", [
    ("x @ https://user:pw@host/a.whl", "x @ https://****@host/a.whl"),
    ("x @ git+https://ghp_abc@github.com/o/r.git", "x @ git+https://****@github.com/o/r.git"),
    ("x @ git+ssh://git@github.com/o/r.git", "x @ git+ssh://git@github.com/o/r.git"),
    ("x==1.0", "x==1.0"),
])
def test_redact(text, expected):
    assert core.redact(text) == expected


def test_requirements_is_pip_freeze_format():
    s = snap("probe_h100_torch29_cu128.json")
    lines = core.render_requirements(s).splitlines()
    comments = [ln for ln in lines if ln.startswith("#")]
    body = [ln for ln in lines if not ln.startswith("#")]
    assert len(comments) == 3 and "download.pytorch.org/whl/cu128" in comments[2]
    assert "torch==2.9.0+cu128" in body and "numpy==2.1.2" in body and "Jinja2==3.1.4" in body
    assert len(body) == 14
    assert core.parse_freeze("\n".join(body))["torch"] == "2.9.0+cu128"


def test_reproduce_md_python_index_hardware_nondeterminism():
    s = snap("probe_h100_torch29_cu128.json", extra={"seed": 42})
    md = core.render_reproduce(s)
    assert "Python 3.10.12" in md and "uv venv --python 3.10.12" in md
    assert ("pip install torch==2.9.0+cu128 torchvision==0.24.0+cu128 torchaudio==2.9.0+cu128 "
            "--index-url https://download.pytorch.org/whl/cu128") in md
    assert "pip install -r requirements.txt --extra-index-url https://download.pytorch.org/whl/cu128" in md
    assert "| GPUs | 2 x NVIDIA H100 80GB HBM3 (80 GiB each) |" in md
    assert "| NVIDIA driver | 570.148.08 |" in md and "| cuDNN | 9.10.2 |" in md
    assert "## 4. Known sources of non-determinism" in md
    assert "use_deterministic_algorithms" in md and "TF32" in md and "Multi-GPU: 2 GPUs" in md
    assert "seed **42**" in md and "gpuops train --seed 42" in md


@pytest.mark.parametrize("torch,cuda,imported,url", [
    ("2.9.0+cu128", "12.8", True, "https://download.pytorch.org/whl/cu128"),
    ("2.1.0+cu118", "11.8", True, "https://download.pytorch.org/whl/cu118"),
    ("2.5.1+cpu", None, True, "https://download.pytorch.org/whl/cpu"),
    ("2.4.1+rocm6.1", None, True, "https://download.pytorch.org/whl/rocm6.1"),
    ("2.7.0", "12.6", True, "https://download.pytorch.org/whl/cu126"),  # PyPI wheel: use torch.version.cuda
    ("2.7.0", None, True, "https://download.pytorch.org/whl/cpu"),
    ("2.7.0", None, False, None),  # torch installed but not importable: unknown build
    (None, None, False, None),
])
def test_torch_index_url(torch, cuda, imported, url):
    assert core.torch_index_url(torch, cuda, imported) == url


@pytest.mark.parametrize("raw,text", [(91002, "9.10.2"), (90100, "9.1.0"), (8902, "8.9.2"), (None, None)])
def test_cudnn_text(raw, text):
    assert core.cudnn_text(raw) == text


def test_broken_host_is_reported_not_fatal():
    s = snap("probe_broken_no_pip_no_driver.json")
    assert s["pip_freeze_source"] == "importlib.metadata"
    assert "torch==2.9.0+cu128" in s["pip_freeze"]  # rebuilt from importlib.metadata
    assert s["gpu_count"] == 0 and s["driver_version"] is None
    text = " | ".join(s["problems"])
    assert "pip freeze unavailable" in text and "No module named pip" in text
    assert "nvidia-smi failed (exit 9)" in text and "libcudnn.so.9" in text
    md = core.render_reproduce(s)
    assert "## Notes from the capture" in md and "| GPUs | none detected |" in md


def test_missing_python_is_an_error():
    with pytest.raises(RemoteError, match="python3.12"):
        snap("probe_no_python.json")


def test_sandbox_recording_without_torch():
    s = snap("probe_sandbox_2x_rtx6000ada.json")
    assert s["torch_version"] is None and s["cuda_version"] is None and s["torch_index_url"] is None
    assert s["gpu_count"] == 2 and s["gpu_name"] == "NVIDIA RTX 6000 Ada Generation"
    assert s["numpy_version"] == "2.4.6"
    assert "pip install -r requirements.txt\n" in core.render_reproduce(s)


# -- save / load ---------------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    s = snap("probe_h100_torch29_cu128.json")
    paths = core.save(s, tmp_path / "env")
    assert sorted(p.name for p in (tmp_path / "env").iterdir()) == sorted(core.FILES)  # no temp files left
    for ref in (tmp_path / "env", paths["environment.json"]):
        loaded = core.load(ref)
        assert loaded["packages"] == s["packages"]
    run_dir = tmp_path / "runs" / "20260115-abc"
    core.save(s, run_dir / "environment")
    assert core.load(run_dir)["torch_version"] == "2.9.0+cu128"  # a run folder: its environment/
    assert core.find_run_env("20260115-abc", tmp_path) == run_dir / "environment"
    assert core.find_run_env("20260115", tmp_path) == run_dir / "environment"  # unique prefix
    assert core.find_run_env("nope", tmp_path) is None


def test_load_rejects_non_snapshots(tmp_path):
    (tmp_path / "x.json").write_text('{"a": 1}')
    (tmp_path / "bad.json").write_text("{")
    for ref in (tmp_path / "x.json", tmp_path / "bad.json", tmp_path):
        with pytest.raises(UsageError):
            core.load(ref)


# -- the CLI on saved snapshots (no network) -----------------------------------------------------------------
@pytest.fixture
def saved(isolated):
    a, b = snap("probe_h100_torch29_cu128.json"), snap("probe_h100_torch28_cu126.json")
    core.save(a, isolated / "snapA")
    core.save(b, isolated / "snapB")
    core.save(a, isolated / "runs" / "20260115-093000-abcd" / "environment")
    return isolated


def test_cli_diff_saved(gpuops, saved):
    r = gpuops("diff", "snapA", "snapB")
    assert r.code == 1, r.all
    assert "~ torch: 2.9.0+cu128 -> 2.8.0+cu126" in r.out and "+ accelerate==1.10.1" in r.out
    r = gpuops("diff", "snapA", "snapA/environment.json")
    assert r.code == 0 and r.out.startswith("identical:")
    r = gpuops("diff", "20260115-093000-abcd", "snapA")  # a run id
    assert r.code == 0, r.all
    r = gpuops("diff", "snapA", "snapB", "--json")
    doc = json.loads(r.out)
    assert r.code == 1 and doc["identical"] is False and doc["added"] == [["accelerate", "1.10.1"]]
    assert doc["a"] == "snapA"


def test_cli_diff_bad_input(gpuops, saved):
    r = gpuops("diff", "snapA", "no-such-thing")
    assert r.code == 2 and "'no-such-thing' is not a snapshot folder" in r.err and "Traceback" not in r.all
    (saved / "junk").mkdir()
    r = gpuops("diff", "junk", "snapA")
    assert r.code == 2 and "no environment.json" in r.err


def test_cli_matrix_from_saved(gpuops, saved):
    r = gpuops("matrix", "--from", "snapA", "--from", "snapB", "--out", "docs/environment.md")
    assert r.code == 0, r.all
    text = (saved / "docs" / "environment.md").read_text()  # -o: the file, not stdout (#36)
    assert "| PyTorch | 2.9.0+cu128 | 2.8.0+cu126 |" in text and r.out == ""
    assert text.startswith("## Environment matrix")
    r = gpuops("matrix", "--from", "snapA", "--json")
    assert json.loads(r.out)["rows"][0]["component"] == "OS"


def test_log_to_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    (tmp_path / "wandb-dir").mkdir()
    key = "k" * 40
    s = snap("probe_h100_torch29_cu128.json", profile=Prof())
    core.save(s, tmp_path / "env")
    info = core.log_to_wandb(tmp_path / "env", s, run_name="lambda-h100-environment", project="proj",
                             api_key=key, artifact_name="lambda-h100-environment", aliases=["r1"])
    assert info["mode"] == "offline" and info["artifact"] == "lambda-h100-environment:latest"
    import os
    assert os.environ.get("WANDB_API_KEY") is None  # restored
    arts, config = wandb_artifact_and_config(Path(info["run_dir"]))
    (art,) = arts
    assert art.type == "environment" and art.name == "lambda-h100-environment"
    assert set(art.aliases) == {"latest", "r1"}
    assert sorted(c.path for c in art.manifest.contents) == sorted(core.FILES)
    meta = json.loads(art.metadata)
    assert meta["torch"] == "2.9.0+cu128" and meta["driver"] == "570.148.08" and meta["python"] == "3.10.12"
    assert config["environment"] == {"python": "3.10.12", "torch": "2.9.0+cu128", "cuda": "12.8", "cudnn": "9.10.2",
                                     "driver": "570.148.08", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 2}
    staged = {c.path: Path(c.local_path).read_bytes() for c in art.manifest.contents}
    assert staged["environment.json"] == (tmp_path / "env" / "environment.json").read_bytes()
    for f in (tmp_path / "wandb-dir").rglob("*"):
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f


def test_log_to_wandb_online_without_key_is_usage_error(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    s = snap("probe_h100_torch29_cu128.json")
    core.save(s, tmp_path / "env")
    with pytest.raises(UsageError, match="WANDB_API_KEY"):
        core.log_to_wandb(tmp_path / "env", s, run_name="x", project="p")
    with pytest.raises(UsageError, match="missing"):
        core.log_to_wandb(tmp_path, s, run_name="x", project="p")


def test_r610_kmd_header_gives_the_cuda_driver_version():
    """The snapshot reads nvidia-smi with verify's parsers, so the R610+ 'CUDA UMD Version' header is understood."""
    base = json.loads((DATA / "probe_h100_torch29_cu128.json").read_text())
    table = (TEST_DATA / "nvidia-smi" / "b200_x2_kmd_header.txt").read_text()
    base["nvidia_smi"] = {"ok": True, "value": {"found": True, "rc": 0, "stdout": table, "stderr": ""}}
    snap = core.build(base)
    assert snap["cuda_driver_version"] == "13.3"
