"""GPU identity and health end to end: the real sandbox sshd, the emulated nvidia-smi / dmesg / journalctl with each
fault injected through `gpuops sandbox up --fault`, and healthy hosts that stay quiet."""
import json
import os
from pathlib import Path

import pytest
import yaml

from gpuops.sandbox import host

HEALTH = ("gpu.ecc", "gpu.row_remap", "gpu.retired_pages", "gpu.recovery", "gpu.clocks", "gpu.pcie", "gpu.mig",
          "gpu.persistence", "gpu.power", "gpu.xid", "gpu.health_fields", "gpu.model", "gpu.count", "gpu.memory",
          "gpu.health", "gpu.nvidia_smi")


def verify_json(gpuops, *args):
    r = gpuops("verify", "sandbox", "--json", "--no-save", "--no-cuda-check", *args)
    doc = json.loads(r.out)
    return r.code, {c["id"]: c for c in doc["checks"]}, doc


def alarms(checks):
    return {i: (c["status"], c["measured"]) for i, c in checks.items() if i in HEALTH and c["status"] in ("warn", "fail")}


@pytest.mark.parametrize("model", ["h100-pcie", "h100-sxm5", "h200", "a100", "rtx6000ada", "b200", "rtxpro6000", "gh200",
                                   "a10"])
def test_healthy_hosts_stay_quiet(sandbox, gpuops, model):
    host.up(gpu=model, gpus=2, driver="580.159.04", cuda="13.0")
    code, checks, doc = verify_json(gpuops)
    assert code == 0, checks
    assert alarms(checks) == {}
    assert checks["gpu.xid"]["status"] == "pass" and checks["gpu.ecc"]["status"] == "pass"
    assert checks["gpu.model"]["status"] == "pass" and doc["remote_executions"] == 1


@pytest.mark.parametrize("fault,cid,status,words", [
    ("ecc", "gpu.ecc", "fail", "uncorrectable since boot: GPU 0: 2"),
    ("ecc=7@1", "gpu.ecc", "fail", "GPU 1: 7"),
    ("remap-pending", "gpu.row_remap", "fail", "row remapping pending on GPU 0"),
    ("remap-failure", "gpu.row_remap", "fail", "row remapping failed on GPU 0"),
    ("recovery-action", "gpu.recovery", "fail", "GPU 0: Reset"),
    ("recovery-action=Drain P2P", "gpu.recovery", "fail", "GPU 0: Drain P2P"),
    ("thermal", "gpu.clocks", "warn", "hardware thermal slowdown"),
    ("power-brake", "gpu.clocks", "warn", "power brake"),
    ("pcie-x8", "gpu.pcie", "warn", "GPU 0: x8 of x16"),
    ("persistence-off", "gpu.persistence", "warn", "off on GPU 0"),
    ("mig", "gpu.mig", "warn", "enabled on GPU 0"),
    ("xid", "gpu.xid", "fail", "Xid 79"),
    ("xid=48@1", "gpu.xid", "fail", "Xid 48"),
    ("xid=13", "gpu.xid", "info", "Xid 13"),
    ("kernel-log-unreadable", "gpu.xid", "info", "kernel log not readable"),
    ("correctable-ecc", "gpu.ecc", "info", "correctable: GPU 0: 12"),
])
def test_each_injected_fault_is_caught(sandbox, gpuops, fault, cid, status, words):
    r = gpuops("sandbox", "up", "--gpu", "h100-sxm5", "--gpus", "2", "--driver", "580.159.04", "--fault", fault)
    assert r.code == 0 and f"faults: {fault}" in r.all, r.all
    code, checks, _ = verify_json(gpuops)
    c = checks[cid]
    assert (c["status"], words in c["measured"]) == (status, True), c
    expected_code = 1 if status == "fail" else 0
    assert code == expected_code
    others = {k: v for k, v in alarms(checks).items() if k != cid and not (fault == "thermal" and k == "gpu.health")}
    assert others == {}, others  # one fault, one alarm (thermal also trips the temperature check, as it should)
    if status == "fail":
        assert "terminate it" in c["remediation"] or "reset" in c["remediation"]


def test_plain_report_shows_the_fault_and_its_fix(sandbox, gpuops):
    host.up(gpu="h100-sxm5", driver="580.159.04", faults=["xid=79", "remap-pending"])
    r = gpuops("verify", "sandbox", "--no-save", "--no-cuda-check")
    assert r.code == 1
    assert "FAIL  Xid errors (kernel log): Xid 79 since boot (1 line(s))" in r.out
    assert "Xid 79 on GPU 0: GPU has fallen off the bus" in r.out
    assert "fix: reset the GPU if you own the host (`sudo nvidia-smi -r -i 0`" in r.out
    st = gpuops("sandbox", "status")
    assert st.code == 0 and "faults: xid=79, remap-pending" in st.out


def test_old_driver_rejects_new_fields_but_verify_keeps_the_gpu_table(sandbox, gpuops):
    host.up(gpu="a100", gpus=2, driver="525.105.17", cuda="12.0")
    code, checks, doc = verify_json(gpuops)
    assert code == 0 and alarms(checks) == {}
    assert checks["gpu.health_fields"]["status"] == "info"
    assert checks["gpu.health_fields"]["measured"] == "not supported by this driver: gpu_recovery_action"
    assert checks["gpu.clocks"]["status"] == "pass"  # read under the old name clocks_throttle_reasons.*
    assert len(doc["facts"]["gpus"]) == 2 and "gpu.recovery" not in checks
    host.up(gpu="a100", gpus=2, driver="525.105.17", cuda="12.0", faults=["thermal"])
    _, checks, _ = verify_json(gpuops)
    assert checks["gpu.clocks"]["status"] == "warn"  # the old name still carries the fault


def profile(sandbox, name, **over):
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.update(over)
    (Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml").write_text(yaml.safe_dump(data))


def test_instance_type_alone_expects_its_gpu_and_a_mismatch_names_both(sandbox, gpuops):
    host.up(gpu="h100-pcie")
    profile(sandbox, "typed", instance_type="gpu_1x_h100_sxm5", expect={"python": ">=3.8"})
    r = gpuops("verify", "typed", "--no-save", "--no-cuda-check")
    assert r.code == 1
    assert ("FAIL  GPU model: H100 (80 GB PCIe) [nvidia-smi: NVIDIA H100 PCIe]  (expected H100 (80 GB SXM5) "
            "[nvidia-smi: NVIDIA H100 80GB HBM3], as on gpu_1x_h100_sxm5)") in r.out
    host.up(gpu="h100-sxm5", gpus=8)
    profile(sandbox, "typed8", instance_type="gpu_8x_h100_sxm5", expect={"python": ">=3.8"})
    r = gpuops("verify", "typed8", "--no-save", "--no-cuda-check")
    assert r.code == 0 and "PASS  GPU count: 8  (expected 8 (gpu_8x_h100_sxm5))" in r.out


@pytest.mark.parametrize("words", ["H100 SXM", "h100-sxm5", "H100 (80 GB SXM5)", "NVIDIA H100 80GB HBM3"])
def test_expect_gpu_by_any_name(sandbox, gpuops, words):
    host.up(gpu="h100-sxm5")
    profile(sandbox, "named", expect={"gpu": words})
    r = gpuops("verify", "named", "--no-save", "--no-cuda-check")
    assert r.code == 0 and "PASS  GPU model: H100 (80 GB SXM5)" in r.out, r.out


def test_bench_without_torch_is_a_warning_with_the_reason(sandbox, gpuops, isolated):
    host.up(gpu="h100-sxm5")
    r = gpuops("verify", "sandbox", "--bench")
    assert r.code == 0, r.all
    assert "WARN  Benchmark: did not run" in r.out and "No module named 'torch'" in r.out
    saved = sorted((isolated / "logs" / "env_checks").glob("*.json"))
    doc = json.loads(saved[-1].read_text())
    assert "No module named 'torch'" in doc["bench"]["error"]
    assert any(c["id"] == "bench.run" for c in doc["checks"])


def test_fault_options_are_validated(sandbox, gpuops):
    r = gpuops("sandbox", "up", "--fault", "meltdown")
    assert r.code == 2 and "unknown --fault 'meltdown'" in r.all
    assert gpuops("sandbox", "up", "--fault", "ecc@3").code == 2  # only 1 GPU
    assert gpuops("sandbox", "up", "--fault", "mig=2").code == 2
    assert gpuops("sandbox", "up", "--fault", "ecc=lots").code == 2
    assert "--fault" in gpuops("sandbox", "up", "--help").out
