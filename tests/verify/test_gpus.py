"""The GPU identity table: every name a GPU goes by leads to one row (pure, on the packaged gpus.yaml)."""
import pytest

from gpuops.verify import gpus
from gpuops.errors import UsageError

REQUIRED = ["h100-pcie", "h100-sxm5", "h200", "a100-pcie-40gb", "a100-pcie-80gb", "a100-sxm4-40gb", "a100-sxm4-80gb",
            "a10", "a6000", "rtx6000-ada", "gh200", "b200", "rtxpro6000", "v100"]


def test_table_covers_the_required_gpus_each_with_a_source():
    rows = {r.id: r for r in gpus.load()}
    for gid in REQUIRED:
        r = rows[gid]
        assert r.smi_names and r.memory_mib and r.compute_capability and r.power_limit_w and r.source, gid


@pytest.mark.parametrize("name,gid", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm5"),          # nvidia-smi, real capture
    ("H100 (80 GB SXM5)", "h100-sxm5"),              # Lambda gpu_description
    ("H100 SXM", "h100-sxm5"), ("h100-sxm5", "h100-sxm5"), ("h100_sxm5", "h100-sxm5"),
    ("gpu_8x_h100_sxm5", "h100-sxm5"),
    ("NVIDIA H200", "h200"), ("H200 SXM", "h200"), ("h200", "h200"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("H100 PCIe", "h100-pcie"),
    ("A100 (40 GB SXM4)", "a100-sxm4-40gb"), ("8x A100 (40 GB SXM4)", "a100-sxm4-40gb"),
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"), ("NVIDIA A100-PCIE-40GB", "a100-pcie-40gb"),
    ("GH200 (96 GB)", "gh200"), ("1x GH200 (96 GB)", "gh200"), ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"), ("B200 (180 GB SXM6)", "b200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtxpro6000"), ("RTX PRO 6000", "rtxpro6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000-ada"), ("Quadro RTX 6000", "rtx6000"),
    ("NVIDIA RTX A6000", "a6000"), ("A6000", "a6000"), ("NVIDIA A10", "a10"),
    ("Tesla V100-SXM2-16GB", "v100"), ("V100", "v100"),
])
def test_match_any_name_case_and_spacing_aside(name, gid):
    assert gpus.match(name).id == gid
    assert gpus.match(name.upper()).id == gid
    assert gpus.match("  " + name.lower() + " ").id == gid


@pytest.mark.parametrize("name", ["H100", "A100", "", "   ", "NVIDIA Quantum 9000", "RTX"])
def test_ambiguous_or_unknown_names_match_nothing(name):
    assert gpus.match(name) is None


@pytest.mark.parametrize("itype,gid,count", [
    ("gpu_1x_h100_sxm5", "h100-sxm5", 1), ("gpu_8x_h100_sxm5", "h100-sxm5", 8), ("gpu_8x_h100_sxm5gdr", "h100-sxm5", 8),
    ("gpu_1x_h100_pcie", "h100-pcie", 1), ("gpu_8x_a100", "a100-sxm4-40gb", 8), ("gpu_1x_a10", "a10", 1),
    ("gpu_1x_gh200", "gh200", 1), ("gpu_8x_b200_sxm6", "b200", 8), ("gpu_4x_a6000", "a6000", 4),
    ("GPU_2X_H100_SXM5", "h100-sxm5", 2),
    ("gpu_2x_h200_sxm5", "h200", 2),     # not listed for 2x: understood from the pattern
])
def test_for_instance_type(itype, gid, count):
    row, n = gpus.for_instance_type(itype)
    assert (row.id, n) == (gid, count)


@pytest.mark.parametrize("itype", ["", "cpu_4x_general", "gpu_1x_quantum9000", "h100"])
def test_unknown_instance_types(itype):
    assert gpus.for_instance_type(itype) is None


def test_a_name_in_two_rows_is_a_usage_error():
    doc = {"gpus": [{"id": "a", "aliases": ["X1"], "source": "s"}, {"id": "b", "aliases": ["x-1"], "source": "s"}]}
    with pytest.raises(UsageError, match="belongs to both"):
        gpus.rows_from_doc(doc)
    with pytest.raises(UsageError, match="needs a source"):
        gpus.rows_from_doc({"gpus": [{"id": "a"}]})


def test_every_preset_named_exists():
    from gpuops import knowledge
    names = set(knowledge.presets()["presets"])
    for r in gpus.load():
        assert r.preset is None or r.preset in names, r.id


def test_reference_speeds_are_the_sustained_ones_with_how_they_were_measured():
    """What a healthy GPU sustains in the bench's own loop (issue #23), not a 30 ms burst (797, 790)."""
    h100, h200 = gpus.match("NVIDIA H100 80GB HBM3"), gpus.match("NVIDIA H200")
    assert (h100.ref("bf16_tflops"), h100.ref("copy_tbps")) == (671, 2.95)
    assert (h200.ref("bf16_tflops"), h200.ref("copy_tbps")) == (662, 4.21)
    for row in (h100, h200):
        assert "1 s" in row.reference["measured"] and "8192" in row.reference["measured"]
        assert "sustained" in row.reference["source"] and "driver 580.159.04" in row.reference["source"]
    assert gpus.match("NVIDIA B200").ref("bf16_tflops") is None
