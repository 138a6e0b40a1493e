"""transfer/snapcompare.py on recorded probe outputs (tests/data/snapshot/): what changed between two snapshots
(`gpuops diff`) and the environment matrix (`gpuops matrix`); the commands themselves on saved snapshots are in
test_snapshot_unit.py."""
from __future__ import annotations

import json

from gpuops.transfer import snapcompare, snapshot as core
from support import DATA as TEST_DATA


DATA = TEST_DATA / "snapshot"
WHEN = "2026-01-15T10:00:00Z"


def snap(name: str, **kw) -> dict:
    return core.build(json.loads((DATA / name).read_text()), captured_at=WHEN, **kw)


# -- diff --------------------------------------------------------------------------------------------------
def test_diff_months_later():
    a, b = snap("probe_h100_torch29_cu128.json"), snap("probe_h100_torch28_cu126.json")
    d = snapcompare.diff(a, b)
    assert not d["identical"]
    assert d["python_version_changed"] and d["cuda_version_changed"] and d["driver_changed"]
    assert not d["gpu_changed"]
    sysd = {s["field"]: (s["a"], s["b"]) for s in d["system"] if s["changed"]}
    assert sysd == {"python": ("3.10.12", "3.10.14"), "cuda": ("12.8", "12.6"), "cudnn": ("9.10.2", "9.5.1"),
                    "driver": ("570.148.08", "550.90.07"), "cuda_driver": ("12.8", "12.4")}
    assert d["added"] == [["accelerate", "1.10.1"]]
    assert d["removed"] == [["transformers", "4.57.1"]]
    assert ["torch", "2.9.0+cu128", "2.8.0+cu126"] in d["changed"] and ["numpy", "2.1.2", "1.26.4"] in d["changed"]
    assert len(d["changed"]) == 6
    text = "\n".join(snapcompare.render_diff(d, "old", "new"))
    assert "Python: 3.10.12 -> 3.10.14" in text and "CUDA (PyTorch build): 12.8 -> 12.6" in text
    assert "NVIDIA driver: 570.148.08 -> 550.90.07" in text and "GPUs: 2 x NVIDIA H100 80GB HBM3  (same)" in text
    assert "~ torch: 2.9.0+cu128 -> 2.8.0+cu126" in text
    assert "+ accelerate==1.10.1" in text and "- transformers==4.57.1" in text


def test_diff_identical_and_name_normalisation():
    a = snap("probe_h100_torch29_cu128.json")
    b = json.loads(json.dumps(a))
    b["packages"]["jinja2"] = b["packages"].pop("Jinja2")  # same package, other spelling
    b["captured_at"] = "2027-01-01T00:00:00Z"
    d = snapcompare.diff(a, b)
    assert d["identical"] and d["unchanged_packages"] == 14
    assert snapcompare.render_diff(d, "a", "b")[0].startswith("identical: a and b")


def test_diff_gpu_change_only():
    a = snap("probe_h100_torch29_cu128.json")
    b = json.loads(json.dumps(a))
    b["gpu_count"], b["gpu_name"] = 1, "NVIDIA A100-SXM4-80GB"
    d = snapcompare.diff(a, b)
    assert not d["identical"] and d["gpu_changed"] and not (d["added"] or d["removed"] or d["changed"])


def test_diff_with_a_seed_style_environment_json():
    old = core.load(DATA / "seed_style_environment.json")
    new = snap("probe_h100_torch29_cu128.json")
    d = snapcompare.diff(old, new)
    assert ["torch", "2.1.0+cu121", "2.9.0+cu128"] in d["changed"]
    assert ["pandas", "2.0.3"] in d["removed"]
    gpu = next(s for s in d["system"] if s["field"] == "gpu")
    assert gpu["a"] == "Tesla T4" and gpu["changed"]
    osd = next(s for s in d["system"] if s["field"] == "os")
    assert osd["not_recorded"] == "a" and not osd["changed"]  # the old tool never recorded the OS
    text = "\n".join(snapcompare.render_diff(d, "old", "new"))
    assert "OS: not recorded -> Ubuntu 22.04.4 LTS  (not compared)" in text
    assert "NVIDIA driver: not recorded -> 570.148.08  (not compared)" in text


# -- matrix ------------------------------------------------------------------------------------------------
def test_matrix_single_snapshot_like_seed_section_1():
    s = snap("probe_h100_torch29_cu128.json")
    md = snapcompare.render_matrix(snapcompare.matrix([("lambda-h100", s)]))
    assert "| Component | Version | How verified |" in md
    assert "| Python | 3.10.12 | `python -V` |" in md
    assert '| PyTorch | 2.9.0+cu128 | `python -c "import torch; print(torch.__version__)"` |' in md
    assert "| torchvision | 0.24.0+cu128 |" in md and "| CUDA runtime | 12.8 (PyTorch wheels) |" in md
    assert "| NVIDIA driver | 570.148.08 |" in md and "| GPUs | 2 x NVIDIA H100 80GB HBM3 (80 GiB each) |" in md
    assert "cuDNN | 9.10.2" in md


def test_matrix_two_columns():
    a, b = snap("probe_h100_torch29_cu128.json"), snap("probe_sandbox_2x_rtx6000ada.json")
    m = snapcompare.matrix([("h100", a), ("sandbox", b)])
    md = snapcompare.render_matrix(m)
    assert "| Component | h100 | sandbox | How verified |" in md
    assert "| PyTorch | 2.9.0+cu128 | — |" in md
    assert m["columns"] == ["h100", "sandbox"]
