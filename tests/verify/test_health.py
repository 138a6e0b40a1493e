"""GPU identity and passive health, pure: parsers on the real H100 SXM5 / H200 captures, every rule on recorded facts,
the old-driver retry of the probe against the emulated nvidia-smi, and the emulator's fidelity to the real files."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops import knowledge
from gpuops.verify.checks import FAIL, INFO, PASS, WARN, evaluate
from gpuops.verify.facts import SMI_QUERY_FIELDS, from_probe, parse_health, parse_smi_header, parse_xids
from gpuops.profiles.model import Profile
from gpuops.remote import probe

from support.helpers import fact, healthy_cuda, probe_doc, smi
from support import ROOT


KN = knowledge.knowledge()
PRESETS = knowledge.presets()
PLAYBOOK = knowledge.load_playbook("verify")
HEALTH_IDS = ("gpu.ecc", "gpu.row_remap", "gpu.retired_pages", "gpu.recovery", "gpu.clocks", "gpu.pcie", "gpu.mig",
              "gpu.persistence", "gpu.power", "gpu.xid", "gpu.health_fields")


SRC = ROOT / "src" / "gpuops"


# -- the real captures --------------------------------------------------------------------------------------------
def real_capture(gpu: str):
    """(health fields {field: raw value}, dmesg lines) from a real health-fields.txt."""
    fields, dmesg = {}, []
    for line in smi(f"real_{gpu}_580_health_fields.txt").splitlines():
        if line.startswith("["):
            dmesg.append(line)
        elif line.strip() and not line.startswith("dmesg rc="):
            name, value = line.split(None, 1)
            fields[name] = value.strip()
    return fields, dmesg


def real_query_noheader(gpu: str) -> str:
    """The real CSV (header, units) reordered into the probe's query order, as `csv,noheader` prints it."""
    lines = smi(f"real_{gpu}_580_query.csv").splitlines()
    header = [h.split(" [")[0].strip() for h in lines[0].split(",")]
    key = {"index": "index", "name": "name", "uuid": "uuid", "memory_total_mib": "memory.total",
           "memory_used_mib": "memory.used", "utilization_pct": "utilization.gpu", "temperature_c": "temperature.gpu",
           "power_draw_w": "power.draw", "power_limit_w": "power.limit", "compute_cap": "compute_cap",
           "driver_version": "driver_version", "bus_id": "pci.bus_id"}
    out = []
    for line in lines[1:]:
        vals = dict(zip(header, [v.strip() for v in line.split(",")]))
        out.append(", ".join(vals[key[f]] for f in SMI_QUERY_FIELDS))
    return "\n".join(out) + "\n"


def health_doc(gpu: str, over: dict | None = None, unsupported=(), kernel=None, n: int = 1, **kw):
    """A probe document for the real GPU `gpu` with its real health values (optionally changed)."""
    raw, dmesg = real_capture(gpu)
    fields = ["index"] + [f for f in probe.HEALTH_FIELDS if f in raw and f not in unsupported]
    rows = []
    for i in range(n):
        vals = dict(raw, index=str(i))
        vals.update({k: str(v) for k, v in (over or {}).items()})
        rows.append(", ".join(vals[f] for f in fields))
    query = real_query_noheader(gpu)
    if n > 1:
        first = query.strip()
        query = "".join(first.replace("0, ", f"{i}, ", 1).replace(":00:06.0", f":00:0{6 + i}.0") + "\n" for i in range(n))
    doc = probe_doc(query=query, table=smi(f"real_{gpu}_580_table.txt"), cuda=healthy_cuda(n=n, cuda="13.0",
                    version="2.11.0+cu130"), packages={"torch": "2.11.0+cu130"}, **kw)
    doc["gpu_health"] = fact({"found": True, "rc": 0, "stdout": "\n".join(rows) + "\n", "stderr": "", "fields": fields,
                              "unsupported": list(unsupported), "renamed": {}, "tries": 1})
    doc["kernel_log"] = fact(kernel if kernel is not None else
                             {"readable": True, "source": "dmesg", "lines": dmesg, "total_lines": 812})
    return doc


def profile(**over):
    data = {"name": "lambda", "host": "192.0.2.7", "instance_type": "gpu_1x_h100_sxm5",
            "expect": {"gpu": "H100 SXM", "python": ">=3.8"}}
    data.update(over)
    return Profile.model_validate(data)


def run(doc, prof=None, playbook=None):
    f = from_probe(doc, failures=KN["nvidia_smi_failures"])
    return {r.id: r for r in evaluate(f, prof or profile(), playbook or PLAYBOOK, KN, PRESETS, {})}


def alarms(results, ids=HEALTH_IDS + ("gpu.model", "gpu.count", "gpu.memory")):
    return {i: (r.status, r.measured) for i, r in results.items() if i in ids and r.status in (WARN, FAIL)}


def test_real_table_header_and_query_parse():
    hdr = parse_smi_header(smi("real_h100_sxm5_580_table.txt"))
    assert (hdr["driver"], hdr["cuda"], hdr["style"]) == ("580.159.04", "13.0", "legacy")
    f = from_probe(health_doc("h200"))
    g = f.gpus[0]
    assert (g.name, g.memory_total_mib, g.power_limit_w, g.compute_cap) == ("NVIDIA H200", 143771, 700.0, "9.0")


@pytest.mark.parametrize("gpu", ["h100_sxm5", "h200"])
def test_real_health_fields_parse(gpu):
    raw, dmesg = real_capture(gpu)
    fields = ["index"] + [f for f in probe.HEALTH_FIELDS if f in raw]
    h = parse_health("0, " + ", ".join(raw[f] for f in fields[1:]) + "\n", fields)[0]
    assert h.values["remapped_rows.pending"] is False and h.values["ecc.errors.uncorrected.volatile.total"] == 0
    assert h.values["pcie.link.width.current"] == 16 and h.values["persistence_mode"] is True
    assert h.values["power.limit"] == 700.0 and h.values["clocks.max.sm"] == 1980
    assert h.values["clocks_event_reasons.active"] == 1 and h.values["gpu_recovery_action"] == "None"
    assert h.unknown == {"retired_pages.pending": "N/A"} and h.values["retired_pages.pending"] is None
    assert parse_xids(dmesg) == [] and any("NVRM" in ln for ln in dmesg) == (gpu == "h100_sxm5")  # h200: none captured


@pytest.mark.parametrize("gpu,words", [("h100_sxm5", "H100 SXM"), ("h200", "H200 SXM"), ("h100_sxm5", "h100-sxm5"),
                                       ("h100_sxm5", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")])
def test_real_hosts_pass_with_the_names_users_write_and_raise_no_alarm(gpu, words):
    """Issue #15: 'expect.gpu: H100 SXM' FAILED on a real H100 SXM5; the healthy captures must stay quiet."""
    itype = "gpu_1x_h100_sxm5" if "h100" in gpu else None
    r = run(health_doc(gpu), profile(instance_type=itype, expect={"gpu": words}))
    assert r["gpu.model"].status == PASS, r["gpu.model"]
    assert alarms(r) == {}
    assert r["gpu.xid"].status == PASS and "dmesg" in r["gpu.xid"].measured
    assert r["gpu.pcie"].status == INFO and r["gpu.pcie"].measured == "Gen5 x16"


def test_instance_type_alone_expects_its_gpu_count_and_memory():
    r = run(health_doc("h100_sxm5"), profile(instance_type="gpu_1x_h100_sxm5", expect={}))
    assert (r["gpu.model"].status, r["gpu.count"].status, r["gpu.memory"].status) == (PASS, PASS, PASS)
    assert r["gpu.count"].expected == "1 (gpu_1x_h100_sxm5)" and r["gpu.memory"].expected.startswith(">= 79,112")
    r = run(health_doc("h100_sxm5"), profile(instance_type="gpu_8x_h100_sxm5", expect={}))
    assert r["gpu.count"].status == FAIL and r["gpu.count"].expected == "8 (gpu_8x_h100_sxm5)"
    r = run(health_doc("h100_sxm5"), profile(instance_type="gpu_1x_h200_sxm5", expect={}))
    assert r["gpu.model"].status == FAIL and r["gpu.memory"].status == FAIL  # 81,559 MiB < 97 % of 143,771


def test_mismatch_names_both_sides_in_the_same_words():
    r = run(health_doc("h200"), profile(instance_type="gpu_1x_h100_sxm5", expect={"gpu": "H100 SXM"}))["gpu.model"]
    assert r.status == FAIL
    assert r.measured == "H200 (141 GB SXM5) [nvidia-smi: NVIDIA H200]"
    assert r.expected == ("H100 (80 GB SXM5) [nvidia-smi: NVIDIA H100 80GB HBM3], as on gpu_1x_h100_sxm5 "
                          "(expect.gpu: H100 SXM)")
    assert "launch gpu_1x_h100_sxm5" in r.remediation and "expect.gpu: 'H200 SXM'" in r.remediation
    assert "not the instance type the profile describes" not in r.remediation


def test_unknown_words_fall_back_to_a_substring_of_the_name():
    assert run(health_doc("h100_sxm5"), profile(expect={"gpu": "H100"}))["gpu.model"].status == PASS
    r = run(health_doc("h100_sxm5"), profile(expect={"gpu": "A100"}))["gpu.model"]
    assert r.status == FAIL and r.expected == "*A100*"


# -- every rule on recorded facts --------------------------------------------------------------------------------
@pytest.mark.parametrize("over,cid,status,words", [
    ({"ecc.errors.uncorrected.volatile.total": 3}, "gpu.ecc", FAIL, "GPU 0: 3"),
    ({"ecc.errors.corrected.volatile.total": 17}, "gpu.ecc", INFO, "correctable: GPU 0: 17"),
    ({"remapped_rows.pending": "Yes"}, "gpu.row_remap", FAIL, "pending on GPU 0"),
    ({"remapped_rows.failure": "Yes"}, "gpu.row_remap", FAIL, "failed on GPU 0"),
    ({"retired_pages.pending": "Yes"}, "gpu.retired_pages", FAIL, "pending on GPU 0"),
    ({"gpu_recovery_action": "Drain and Reset"}, "gpu.recovery", FAIL, "GPU 0: Drain and Reset"),
    ({"clocks_event_reasons.hw_slowdown": "Active"}, "gpu.clocks", WARN, "hardware slowdown"),
    ({"clocks_event_reasons.hw_thermal_slowdown": "Active"}, "gpu.clocks", WARN, "hardware thermal slowdown"),
    ({"clocks_event_reasons.sw_thermal_slowdown": "Active"}, "gpu.clocks", WARN, "software thermal slowdown"),
    ({"clocks_event_reasons.sw_power_cap": "Active"}, "gpu.clocks", PASS, "at its power cap"),
    ({"pcie.link.width.current": 8}, "gpu.pcie", WARN, "x8 of x16"),
    ({"pcie.link.gen.gpucurrent": 1}, "gpu.pcie", INFO, "Gen1 x16 (max Gen5 x16)"),  # idle: not a fault
    ({"mig.mode.current": "Enabled"}, "gpu.mig", WARN, "enabled on GPU 0"),
    ({"persistence_mode": "Disabled"}, "gpu.persistence", WARN, "off on GPU 0"),
    ({"power.limit": "400.00 W"}, "gpu.power", INFO, "below this GPU's default 700 W"),
])
def test_each_health_rule(over, cid, status, words):
    r = run(health_doc("h100_sxm5", over))
    assert r[cid].status == status and words in r[cid].measured, r[cid]
    if status == FAIL:
        assert "sudo nvidia-smi -r -i 0" in r[cid].remediation or "terminate" in r[cid].remediation
    others = {k: v for k, v in alarms(r).items() if k != cid}
    assert others == {}, others


def test_fail_fix_names_the_instance_to_replace_when_the_profile_knows_it():
    """A cloud profile that records its instance id (cloud commands) gets it in the fix line."""
    from types import SimpleNamespace

    from gpuops.verify.checks_health import _reset_fix

    c = SimpleNamespace(p=SimpleNamespace(instance_id="0920582c7ff041399e34823a0be62549"))
    assert _reset_fix(c, [1, 3]) == ("reset the GPU if you own the host (`sudo nvidia-smi -r -i 1,3` with no process on "
                                     "it, else reboot); on a rented instance terminate it "
                                     "(0920582c7ff041399e34823a0be62549) and launch a new one")
    assert "terminate it and launch" in _reset_fix(SimpleNamespace(p=SimpleNamespace()), [0])


def test_faults_name_the_gpu_on_a_multi_gpu_host():
    doc = health_doc("h100_sxm5", n=4)
    rows = doc["gpu_health"]["value"]["stdout"].splitlines()
    rows[2] = rows[2].replace("No, No", "Yes, No", 1)  # GPU 2: remapped_rows.pending
    doc["gpu_health"]["value"]["stdout"] = "\n".join(rows) + "\n"
    r = run(doc, profile(instance_type="gpu_4x_h100_sxm5", expect={}))
    assert r["gpu.row_remap"].status == FAIL and r["gpu.row_remap"].measured == "row remapping pending on GPU 2"
    assert "-i 2" in r["gpu.row_remap"].remediation and r["gpu.count"].status == PASS


def test_mig_expected_by_the_profile_is_quiet():
    r = run(health_doc("h100_sxm5", {"mig.mode.current": "Enabled"}), profile(expect={"gpu": "H100 SXM", "mig": True}))
    assert "gpu.mig" not in r
    r = run(health_doc("h100_sxm5"), profile(expect={"gpu": "H100 SXM", "mig": True}))
    assert r["gpu.mig"].status == WARN


@pytest.mark.parametrize("value", ["[N/A]", "[Not Supported]", "N/A"])
def test_unknown_values_are_never_alarms(value):
    raw, _ = real_capture("h100_sxm5")
    over = {f: value for f in raw if f not in ("index",)}
    r = run(health_doc("h100_sxm5", over))
    assert alarms(r) == {}
    assert r["gpu.ecc"].status == INFO and "gpu.clocks" not in r and "gpu.persistence" not in r


def test_fields_an_older_driver_rejects_are_info_and_the_gpu_table_stays():
    r = run(health_doc("h100_sxm5", unsupported=("gpu_recovery_action",)))
    assert r["gpu.health_fields"].status == INFO and "gpu_recovery_action" in r["gpu.health_fields"].measured
    assert "gpu.recovery" not in r and alarms(r) == {} and r["gpu.model"].status == PASS


def test_a_failed_or_timed_out_health_query_is_info():
    doc = health_doc("h100_sxm5")
    doc["gpu_health"] = fact(ok=False, error="timed out after 47s")
    r = run(doc)
    assert r["gpu.health_fields"].status == INFO and alarms(r) == {} and r["gpu.nvidia_smi"].status == PASS
    doc["gpu_health"] = fact({"found": True, "rc": 9, "stdout": "Unable to determine the device handle", "stderr": "",
                              "fields": [], "unsupported": []})
    r = run(doc)
    assert r["gpu.health_fields"].status == INFO and "exit 9" in r["gpu.health_fields"].detail


def test_unreadable_kernel_log_is_info():
    r = run(health_doc("h100_sxm5", kernel={"readable": False,
                                             "error": "dmesg: dmesg: read kernel buffer failed: Operation not permitted"}))
    assert r["gpu.xid"].status == INFO and "not readable" in r["gpu.xid"].measured
    assert "sudo dmesg" in r["gpu.xid"].detail and alarms(r) == {}


XID_LINE = ("[ 5231.774012] NVRM: Xid (PCI:0000:00:06): {code}, pid=48213, name=python3, {text}")
JOURNAL_LINE = "Nov 23 04:12:09 h100 kernel: NVRM: Xid (PCI:0000:00:06): {code}, pid='<unknown>', name=<unknown>, {text}"


@pytest.mark.parametrize("code,status,line", [
    (79, FAIL, XID_LINE), (48, FAIL, JOURNAL_LINE), (95, FAIL, XID_LINE), (119, FAIL, XID_LINE), (74, FAIL, XID_LINE),
    (13, INFO, XID_LINE), (31, INFO, JOURNAL_LINE), (43, INFO, XID_LINE),  # application faults: INFO at most
    (63, WARN, XID_LINE), (9999, WARN, XID_LINE),                          # unknown code: never silently passed
])
def test_xid_severity_comes_from_the_table(code, status, line):
    lines = real_capture("h100_sxm5")[1] + [line.format(code=code, text="text of the driver")]
    r = run(health_doc("h100_sxm5", kernel={"readable": True, "source": "dmesg", "lines": lines}))["gpu.xid"]
    assert r.status == status and f"Xid {code}" in r.measured and "on GPU 0" in r.detail, r


def test_xid_table_rows_each_have_a_meaning_and_a_severity():
    table = knowledge.load_playbook("xid")
    assert table["source"].startswith("NVIDIA")
    for code, row in table["xids"].items():
        assert isinstance(code, int) and row["severity"] in ("fail", "warn", "info") and row["meaning"]
    assert {c for c, r in table["xids"].items() if r["severity"] == "info"} >= {13, 31, 43}


def test_health_is_off_when_the_playbook_leaves_it_out():
    pb = dict(PLAYBOOK, checks=[c for c in PLAYBOOK["checks"] if c not in ("gpu.health_fields", "gpu.kernel_log")])
    r = run(health_doc("h100_sxm5", {"remapped_rows.pending": "Yes"}), playbook=pb)
    assert "gpu.row_remap" not in r and "gpu.xid" not in r
    from gpuops.verify.host import probe_params
    params = probe_params(profile(), pb, PRESETS, Path("."))
    assert params["health"] is False and params["kernel_log"] is False and "bench" not in params
    assert probe_params(profile(), PLAYBOOK, PRESETS, Path("."), bench=True)["bench"]["seconds"] == 1.0


# -- the probe's retry against the emulated nvidia-smi (a real process) -------------------------------------------
def emulated_host(tmp_path, **state):
    (tmp_path / "bin").mkdir(parents=True)
    for tool, module in (("nvidia-smi", "nvidia_smi.py"), ("dmesg", "kernel_log.py"), ("journalctl", "kernel_log.py")):
        (tmp_path / "bin" / tool).write_text(f"#!{sys.executable}\n" + (SRC / "sandbox" / module).read_text())
        (tmp_path / "bin" / tool).chmod(0o755)
    (tmp_path / "gpu.json").write_text(json.dumps({"gpu": "h100-sxm5", "count": 2, "driver": "580.159.04", **state}))
    return {"GPUOPS_SANDBOX_DIR": str(tmp_path), "PATH": str(tmp_path / "bin")}  # the emulated tools only


def run_probe_fn(env, code):
    out = subprocess.run([sys.executable, "-c", f"import json, sys; sys.path.insert(0, {str(SRC / 'remote')!r}); "
                          f"import probe; print(json.dumps({code}))"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_old_driver_query_is_retried_under_old_names_and_without_unknown_fields(tmp_path):
    env = emulated_host(tmp_path, driver="525.105.17")
    r = run_probe_fn(env, "probe.gpu_health(probe.HEALTH_FIELDS, 10)")
    assert r["rc"] == 0 and r["unsupported"] == ["gpu_recovery_action"] and r["tries"] == 3
    assert r["renamed"]["clocks_throttle_reasons.hw_slowdown"] == "clocks_event_reasons.hw_slowdown"
    assert "clocks_event_reasons.hw_slowdown" in r["fields"] and "gpu_recovery_action" not in r["fields"]
    hs = parse_health(r["stdout"], r["fields"], r["unsupported"])
    assert [h.index for h in hs] == [0, 1] and hs[1].values["clocks_event_reasons.hw_slowdown"] is False
    assert hs[0].unknown["gpu_recovery_action"] == "not supported by this driver"
    new = run_probe_fn(emulated_host(tmp_path / "new"), "probe.gpu_health(probe.HEALTH_FIELDS, 10)")
    assert new["tries"] == 1 and new["unsupported"] == [] and new["renamed"] == {}


def test_kernel_log_falls_back_to_journalctl_and_reports_unreadable(tmp_path):
    env = emulated_host(tmp_path, faults=["xid=79@1"])
    r = run_probe_fn(env, "probe.kernel_log(10)")
    assert r["readable"] and r["source"] == "dmesg"
    assert parse_xids(r["lines"])[0]["code"] == 79 and parse_xids(r["lines"])[0]["pci"] == "0000:19:00"
    (tmp_path / "bin" / "dmesg").unlink()  # no dmesg: journalctl -k
    r = run_probe_fn(env, "probe.kernel_log(10)")
    assert r["readable"] and r["source"] == "journalctl" and "kernel: NVRM: Xid" in r["lines"][-1]
    env2 = emulated_host(tmp_path / "u", faults=["kernel-log-unreadable"])
    r = run_probe_fn(env2, "probe.kernel_log(10)")
    assert r == {"readable": False, "error": "dmesg: dmesg: read kernel buffer failed: Operation not permitted; "
                                             "journalctl: Hint: You are currently not seeing messages from other "
                                             "users and the system."}


# -- the emulator prints what the real tools print -----------------------------------------------------------------
def emulated(env, *args):
    return subprocess.run([str(Path(env["GPUOPS_SANDBOX_DIR"]) / "bin" / "nvidia-smi"), *args], env=env,
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("model,gpu", [("h100-sxm5", "h100_sxm5"), ("h200", "h200")])
def test_emulated_health_fields_equal_the_real_idle_gpu(tmp_path, model, gpu):
    env = emulated_host(tmp_path, gpu=model, count=1)
    raw, _ = real_capture(gpu)
    for field, value in raw.items():
        r = emulated(env, f"--query-gpu={field}", "--format=csv,noheader")
        assert (r.returncode, r.stdout.strip()) == (0, value), field


def test_emulated_table_has_the_real_layout(tmp_path):
    env = emulated_host(tmp_path, count=1)
    real = smi("real_h100_sxm5_580_table.txt").splitlines()
    fake = [ln for ln in emulated(env).stdout.splitlines() if "EMULATED" not in ln]
    assert len(fake) == len(real)
    mask = lambda s: re.sub(r"[0-9A-Fa-f]", "9", s)  # noqa: E731 - numbers differ, layout must not
    for a, b in list(zip(fake, real))[1:]:
        assert len(a) == len(b) and [i for i, ch in enumerate(a) if ch == "|"] == [i for i, ch in enumerate(b) if ch == "|"]
    assert mask(fake[2]) == mask(real[2])  # the header line: NVIDIA-SMI / Driver Version / CUDA Version


def test_emulated_query_matches_the_real_csv_format(tmp_path):
    env = emulated_host(tmp_path, count=1)
    real = smi("real_h100_sxm5_580_query.csv").splitlines()
    fields = "index,name,uuid,driver_version,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw," \
             "power.limit,pstate,compute_cap,pci.bus_id"
    fake = emulated(env, f"--query-gpu={fields}", "--format=csv").stdout.splitlines()
    assert fake[0] == real[0]
    unit = lambda s: [re.sub(r"[\d.]+", "N", v.strip()) for v in s.split(",")]  # noqa: E731
    assert unit(fake[1])[3:] == unit(real[1])[3:] and unit(fake[1])[1] == unit(real[1])[1]


def test_slow_smi_fault_is_data_every_call_waits_for():
    """`--fault slow-smi[=MS]` (benchmarks/bench_verify.py's slow nvidia-smi): a latency each call sleeps, not a branch."""
    from gpuops.sandbox.nvidia_smi import fault_problem, latency

    assert latency({"faults": []}) == 0 and latency({"faults": ["slow-smi"]}) == 0.3
    assert latency({"faults": ["slow-smi=1500@0", "ecc"]}) == 1.5
    assert fault_problem("slow-smi=fast", 1) == "--fault slow-smi=fast: the value must be a whole number"


@pytest.mark.parametrize("code,gpu,line", [(79, 2, XID_LINE), (48, 3, JOURNAL_LINE)])
def test_the_xid_fix_resets_the_gpu_that_failed_not_gpu_0(code, gpu, line):
    """Issue #29: Xid 79 on GPU 2 (48 on GPU 3) said `nvidia-smi -r -i 0` while the detail named GPU 2."""
    pci = f"PCI:0000:00:0{6 + gpu}"
    lines = real_capture("h100_sxm5")[1] + [line.format(code=code, text="text of the driver").replace("PCI:0000:00:06", pci)]
    r = run(health_doc("h100_sxm5", n=4, kernel={"readable": True, "source": "dmesg", "lines": lines}))["gpu.xid"]
    assert r.status == FAIL and f"on GPU {gpu}" in r.detail, r
    assert f"nvidia-smi -r -i {gpu}`" in r.remediation and "-i 0" not in r.remediation, r.remediation
    from gpuops.verify.checks_health import health_failures
    from gpuops.verify.facts import parse_xids

    # the same judgement while a run is watched (no bus ids known there: the GPU is not guessed as 0)
    watched = health_failures([], parse_xids(lines[-1:]))
    assert watched and "-i 0`" not in watched[0].remediation, watched[0].remediation
