"""Parsers of nvidia-smi output on recorded outputs of several GPUs and every failure mode."""
from gpuops import knowledge
from gpuops.verify.facts import classify_smi_failure, from_probe, parse_smi_header, parse_smi_query

from support.helpers import probe_doc, smi


FAILURES = knowledge.knowledge()["nvidia_smi_failures"]


def test_h100_query_parses_every_field():
    (g,) = parse_smi_query(smi("h100_pcie_x1.csv"))
    assert g.index == 0 and g.name == "NVIDIA H100 PCIe"
    assert g.memory_total_mib == 81559 and g.memory_used_mib == 4
    assert g.temperature_c == 33 and g.power_draw_w == 47.81 and g.power_limit_w == 350
    assert g.compute_cap == "9.0" and g.driver_version == "570.148.08" and g.bus_id == "00000000:08:00.0"
    assert not g.unavailable and not g.emulated


def test_eight_a100_with_na_power_values():
    gpus = parse_smi_query(smi("a100_sxm4_x8_na_power.csv"))
    assert [g.index for g in gpus] == list(range(8))
    assert all(g.power_draw_w is None and g.unavailable["power_draw_w"] == "N/A" for g in gpus)
    assert gpus[7].bus_id == "00000000:BD:00.0"


def test_not_supported_values_are_recorded_not_crashing():
    (g,) = parse_smi_query(smi("gh200_not_supported.csv"))
    assert g.temperature_c is None and g.unavailable["temperature_c"] == "Not Supported"
    assert g.unavailable["power_limit_w"] == "Not Supported" and g.power_draw_w == 88.52


def test_two_ada_gpus_one_busy():
    gpus = parse_smi_query(smi("rtx6000ada_x2_busy.csv"))
    assert len(gpus) == 2 and gpus[0].utilization_pct == 87 and gpus[1].memory_used_mib == 3


def test_legacy_header():
    h = parse_smi_header(smi("h100_legacy_header.txt"))
    assert h == {"driver": "570.148.08", "cuda": "12.8", "style": "legacy", "emulated": False}


def test_r610_kmd_header():
    h = parse_smi_header(smi("b200_x2_kmd_header.txt"))
    assert h["driver"] == "610.43.02" and h["cuda"] == "13.3" and h["style"] == "kmd"


def test_failures_are_named_by_message():
    cases = {
        "fail_driver_not_loaded.txt": (9, "driver-not-loaded"),
        "fail_version_mismatch.txt": (18, "version-mismatch"),
        "fail_no_devices.txt": (6, "no-devices"),
        "fail_gpu_lost.txt": (15, "gpu-lost"),
    }
    for name, (rc, fid) in cases.items():
        st = classify_smi_failure(rc, smi(name), FAILURES)
        assert st.failure == fid, name
        assert st.remediation and st.message


def test_unknown_failure_keeps_exit_code_and_message():
    st = classify_smi_failure(255, "Something new went wrong\n", FAILURES)
    assert st.failure == "unknown" and st.exit_code == 255 and "Something new" in st.message


def test_gpu_lost_in_query_output_marks_smi_failed():
    f = from_probe(probe_doc(query=smi("gpu_lost_query.csv"), table=""), failures=FAILURES)
    assert f.smi.state == "failed" and f.smi.failure == "gpu-lost"
    assert f.gpus[1].lost


def test_from_probe_healthy():
    f = from_probe(probe_doc(query=smi("h100_pcie_x1.csv"), table=smi("h100_legacy_header.txt"),
                             packages={"torch": "2.9.0+cu128"}), failures=FAILURES)
    assert f.smi.state == "ok" and f.driver == "570.148.08" and f.cuda_driver == "12.8"
    assert f.packages["torch"] == "2.9.0+cu128" and f.disk["free_bytes"] == 361 * 10**9


def test_a_broken_fact_is_reported_not_fatal():
    doc = probe_doc(query=smi("h100_pcie_x1.csv"), table=smi("h100_legacy_header.txt"))
    doc["disk"] = {"ok": False, "error": "timed out after 10s", "timeout": True}
    f = from_probe(doc, failures=FAILURES)
    assert f.disk == {} and "timed out" in f.errors["disk"]
    assert f.smi.state == "ok"


def test_nvidia_smi_hang_is_named():
    doc = probe_doc(query="", table="")
    doc["nvidia_smi_query"] = {"ok": False, "error": "timed out after 22s", "timeout": True}
    f = from_probe(doc, failures=FAILURES)
    assert f.smi.state == "timeout" and "hung" in f.smi.title


def test_python_missing_fallback_document():
    from gpuops.remote.gather import _parse_fallback

    text = ("@@gpuops-no-python\n@@smi_query 0\n" + smi("h100_pcie_x1.csv") + "@@smi 0\n" + smi("h100_legacy_header.txt")
            + "@@os\n6.8.0-60-generic\nx86_64\n\"Ubuntu 22.04.5 LTS\"\n")
    f = from_probe(_parse_fallback(text, "python3"), failures=FAILURES)
    assert not f.python_ok and f.python_missing == "python3"
    assert len(f.gpus) == 1 and f.driver == "570.148.08" and f.os["pretty"] == "Ubuntu 22.04.5 LTS"


def test_probe_is_stdlib_only_and_python38_syntax():
    import ast
    import sys
    from pathlib import Path

    import gpuops.remote.probe as probe

    src = Path(probe.__file__).read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    imported = {n.names[0].name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)
