"""verify --bench judgement (pure, on recorded figures) and its remote part run for real on the sandbox with CPU torch
(no GPU on a test machine: the snippet's `device: cpu` path runs the same loops, sampling and all-reduce via gloo)."""
import json
import os
from pathlib import Path

from gpuops.verify.bench import judge, likely_causes, sample_by_gpu
from gpuops.verify.checks import INFO, PASS, WARN
from support.bench_facts import BUS, FIELDS, dev, facts, results, sample


def capped(**kw):
    """A sample at full load as the real H100 SXM5 and H200 are: at the 700 W default limit, sw_power_cap Active
    (mask 0x4), SM clock 1410 of 1980 MHz (../shared/reference/sustained-matmul.md)."""
    s = sample(mask="0x0000000000000004", **kw)
    values = s["gpus"].strip().split(", ")
    values[FIELDS.index("clocks_event_reasons.sw_power_cap")], values[FIELDS.index("clocks.sm")] = "Active", "1410"
    return dict(s, gpus=", ".join(values) + "\n")


def test_reference_speed_passes():
    r = results({"pid": 42, "devices": [dev(672.213, 2.9546, sample=capped())]})["bench.gpu0"]
    assert r.status == PASS and r.measured == "bf16 672 TFLOP/s (100 % of 671), copy 2.95 TB/s (100 % of 2.95)"


def test_a_healthy_gpu_at_its_power_cap_reads_at_least_90_percent():
    """The issue's healthy GPUs: 668 TFLOP/s on an H100 SXM5 (10 s), 663 and 658 on an H200, in the bench's loop."""
    h100 = results({"pid": 1, "devices": [dev(668, 2.95, sample=capped())]}, th={"bench_warn_fraction": 0.9})
    assert h100["bench.gpu0"].status == PASS and "bf16 668 TFLOP/s (100 % of 671)" in h100["bench.gpu0"].measured
    for tf in (663.077, 658):
        r = results({"pid": 1, "devices": [dev(tf, 4.21, name="NVIDIA H200", sample=capped())]}, facts("NVIDIA H200"),
                    th={"bench_warn_fraction": 0.9})["bench.gpu0"]
        assert r.status == PASS and f"of 662), copy 4.21 TB/s (100 % of 4.21)" in r.measured, r.measured


def test_h200_reference():
    r = results({"pid": 1, "devices": [dev(500, 4.3, name="NVIDIA H200")]}, facts("NVIDIA H200"))["bench.gpu0"]
    assert r.status == WARN and "bf16 500 TFLOP/s (76 % of 662)" in r.measured and "nothing visible" in r.detail


def test_the_power_cap_at_the_default_limit_is_not_named_as_the_cause():
    """A slow GPU at its power cap with the default 700 W limit: the cap (and the low SM clock it brings) is normal
    at full load; naming it would send the user after a non-problem."""
    r = results({"pid": 1, "devices": [dev(480, 2.9, sample=capped())]})["bench.gpu0"]
    assert r.status == WARN and "72 % of 671" in r.measured
    assert r.detail == ("nothing visible in nvidia-smi explains it (its power cap at the default 700 W limit is normal "
                        "at full load)")
    hot = capped(temp=91)
    r = results({"pid": 1, "devices": [dev(480, 2.9, sample=hot)]})["bench.gpu0"]
    assert r.detail == "likely cause, seen during the matmul: temperature 91 C"


def test_the_power_cap_at_a_lowered_limit_is_named_with_the_limit():
    s = capped(limit="400.00")
    r = results({"pid": 1, "devices": [dev(390, 2.9, sample=s)]})["bench.gpu0"]
    assert r.detail == ("likely cause, seen during the matmul: power cap reached at power limit 400 W (this GPU's "
                        "default is 700 W)")


def test_figures_are_printed_at_the_precision_a_person_reads():
    from gpuops.verify.bench import figure

    assert [figure(x) for x in (672.213, 2.9546, 4.21, 3.0, 1234.5, 12.345, 0.041234)] == \
        ["672", "2.95", "4.21", "3", "1234", "12.3", "0.0412"]


def test_slow_gpu_names_the_thermal_slowdown_seen_at_that_moment():
    r = results({"pid": 1, "devices": [dev(420, 3.0, sample=sample(thermal=True, temp=91))]})["bench.gpu0"]
    assert r.status == WARN and "63 % of 671" in r.measured
    assert r.detail == "likely cause, seen during the matmul: hardware thermal slowdown; temperature 91 C"


def test_slow_gpu_names_a_lowered_power_limit_and_another_process():
    s = sample(limit="400.00", apps=f"4242, {BUS}, 30112\n99, {BUS}, 1024\n")
    r = results({"pid": 99, "devices": [dev(500, 2.9, sample=s)]})["bench.gpu0"]
    assert r.status == WARN
    assert "power limit 400 W (this GPU's default is 700 W)" in r.detail
    assert "another process on the GPU (pid 4242, 30112 MiB)" in r.detail and "pid 99" not in r.detail


def test_mask_is_used_when_the_single_reason_fields_are_unknown():
    h, _ = sample_by_gpu({"fields": ["index", "clocks_event_reasons.active"], "gpus": "0, 0x0000000000000080\n"})
    assert likely_causes(h[0], [], set(), None, {}) == ["power brake"]


def test_slow_copy_alone_warns():
    r = results({"pid": 1, "devices": [dev(670, 1.1)]})["bench.gpu0"]
    assert r.status == WARN and "copy 1.1 TB/s (37 % of 2.95)" in r.measured


def test_no_reference_is_info_not_a_guess():
    r = results({"pid": 1, "devices": [dev(1900, 6.1, name="NVIDIA B200")]}, facts("NVIDIA B200"))["bench.gpu0"]
    assert r.status == INFO and "no reference speed for B200 (180 GB SXM6)" in r.detail


def test_threshold_comes_from_the_playbook():
    b = {"pid": 1, "devices": [dev(590, 3.0)]}  # 88 % of 671
    assert results(b)["bench.gpu0"].status == PASS
    assert results(b, th={"bench_warn_fraction": 0.9})["bench.gpu0"].status == WARN


def test_allreduce_against_the_interconnect():
    b = {"pid": 1, "devices": [dev(790, 3.0, i=0), dev(790, 3.0, i=1)],
         "allreduce": {"world": 2, "bytes": 268435456, "busbw_gbps": 310.0, "backend": "nccl"}}
    r = results(b, facts(n=2))["bench.allreduce"]
    assert r.status == PASS and "69 % of nvlink 450 GB/s per direction" in r.measured
    b["allreduce"]["busbw_gbps"] = 21.0
    r = results(b, facts(n=2))["bench.allreduce"]
    assert r.status == WARN and "nvidia-smi topo -m" in r.remediation
    b["allreduce"] = {"world": 2, "error": "rank 1 exit 1: NCCL error: unhandled system error"}
    assert results(b, facts(n=2))["bench.allreduce"].status == WARN


def test_a_bench_that_did_not_run_is_a_warning_with_the_reason():
    r = results({"error": "CUDA not available", "devices": []})["bench.run"]
    assert r.status == WARN and "CUDA" in r.detail
    r = results({"pid": 1, "devices": [{"index": 0, "name": "NVIDIA H100 80GB HBM3",
                                         "error": "RuntimeError: CUDA error: uncorrectable ECC error encountered"}]})
    assert r["bench.gpu0"].status == WARN and "ECC" in r["bench.gpu0"].detail


# -- the remote part, for real, on the sandbox host ------------------------------------------------------------------
def test_bench_snippet_runs_on_the_sandbox_with_cpu_torch(sandbox, dist_python, isolated):
    """Through the real sshd, in the same single remote execution as the other facts: the loops, the nvidia-smi
    sample taken during the matmul, two all-reduce processes (gloo), and the judgement in the report."""
    import yaml

    from gpuops import console
    from gpuops.profiles import model as profiles
    from gpuops.verify import host as verify
    from gpuops.sandbox import host

    host.up(gpu="h100-sxm5", gpus=2, driver="580.159.04", cuda="13.0")
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["python"] = dist_python
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "benchcpu.yaml"
    path.write_text(yaml.safe_dump(data))
    import io

    prof = profiles.resolve("benchcpu")
    out = console.Output(json_mode=True, stdout=io.StringIO(), stderr=io.StringIO())
    params = {"bench": {"device": "cpu", "cpu_devices": 2, "seconds": 0.4, "matmul_n": 256, "copy_mib": 8,
                        "allreduce": True, "allreduce_mib": 4}}
    report, res = verify.check_host(prof, out, project_dir=isolated, extra_params=params, cuda_check=False)
    assert report["remote_executions"] == 1
    b = report["bench"]
    assert b.get("device") == "cpu" and b.get("torch", "").startswith("2.") and len(b.get("devices", [])) == 2, b
    for d in b["devices"]:
        assert d["bf16_tflops"] > 0 and d["copy_tbps"] > 0 and 0.4 <= d["matmul_seconds"] < 5, d
        smp = d["sample"]  # the emulated nvidia-smi answered the same fields the real one would
        assert smp.get("fields", [None] * 3)[2] == "clocks_event_reasons.active" and smp["gpus"].count("\n") == 2, smp
    ar = b["allreduce"]
    assert ar["world"] == 2 and ar.get("backend") == "gloo" and ar.get("busbw_gbps", 0) > 0 and "error" not in ar, ar
    by = {r.id: r for r in res}
    assert by["bench.gpu0"].status == INFO and by["bench.allreduce"].status == INFO  # CPU: nothing to compare with
    assert json.loads(json.dumps(report, default=str))["bench"]["devices"][1]["index"] == 1


def test_probe_bench_fact_failures_reach_the_judgement():
    """A crashed or timed-out bench (the probe's fact shapes) is a WARN with its reason, never a lost report."""
    from gpuops.verify.facts import from_probe

    from support.helpers import fact, probe_doc

    doc = probe_doc(query="0, NVIDIA H100 80GB HBM3, GPU-1, 81559, 0, 0, 37, 73.22, 700.00, 9.0, 580.159.04, "
                          "00000000:00:06.0\n")
    doc["bench"] = fact({"rc": 1, "error": "ModuleNotFoundError: No module named 'torch'", "stderr": "Traceback ..."})
    f = from_probe(doc)
    r = {x.id: x for x in judge(f.bench, f, {})}
    assert r["bench.run"].status == WARN and "No module named 'torch'" in r["bench.run"].detail
    doc["bench"] = fact(ok=False, error="timed out after 185s")
    f = from_probe(doc)
    assert f.bench["timeout"] is True
    assert [x.status for x in judge(f.bench, f, {})] == [WARN]


def test_the_sample_row_is_found_by_pci_address_when_indices_differ():
    """CUDA_VISIBLE_DEVICES=3: torch's GPU 0 is nvidia-smi's GPU 3; the cause must come from GPU 3's line."""
    cool = sample()["gpus"].strip()
    hot = sample(thermal=True, temp=93)["gpus"].strip().replace("0, " + BUS, "3, 00000000:1B:00.0", 1)
    s = dict(sample(), gpus=cool + "\n" + hot + "\n")
    r = results({"pid": 1, "devices": [dev(400, 3.0, sample=s, pci="0000:1b:00")]})["bench.gpu0"]
    assert r.status == WARN and "hardware thermal slowdown; temperature 93 C" in r.detail
