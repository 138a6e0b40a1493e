"""`gpuops verify` end to end through the real sandbox sshd (emulated nvidia-smi, real Python on the host)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from gpuops.sandbox import host
from support.helpers import default_sigint
from support.envs import profile_from_sandbox
from support import ROOT


def test_healthy_sandbox_passes_in_one_remote_execution(sandbox, gpuops, isolated):
    r = gpuops("verify", "sandbox")
    assert r.code == 0, r.all
    assert "PASS" in r.out and "EMULATED" in r.out and "1 remote execution(s)" in r.out
    assert "trusted new host key" in r.err and "SHA256:" in r.err  # first use: recorded and shown
    assert "torch not installed" in r.out  # honest: no torch on the sandbox
    assert gpuops("verify", "sandbox", "--no-save", "--fail-on-warn").code == 1  # that warning gates CI
    saved = sorted((isolated / "logs" / "env_checks").iterdir())
    assert [p.suffix for p in saved] == [".json", ".txt"] and saved[0].name.endswith("_sandbox.json")
    doc = json.loads(saved[0].read_text())
    assert doc["remote_executions"] == 1 and doc["verdict"] in ("pass", "warn")
    assert "PASS" in saved[1].read_text()
    # second run: the key is known, nothing announced
    r2 = gpuops("verify")  # the last used profile in this project
    assert r2.code == 0 and "trusted new host key" not in r2.err


def test_json_output_is_one_document(sandbox, gpuops):
    r = gpuops("verify", "sandbox", "--json", "--no-save")
    assert r.code == 0
    doc = json.loads(r.out)
    ids = {c["id"] for c in doc["checks"]}
    assert {"gpu.nvidia_smi", "gpu.model", "gpu.driver", "python.version"} <= ids
    assert doc["facts"]["gpus"][0]["name"] == "NVIDIA H100 PCIe" and doc["remote_executions"] == 1


def test_each_nvidia_smi_failure_is_named(sandbox, gpuops):
    expected = {"driver-not-loaded": "NVIDIA driver not loaded", "version-mismatch": "driver/library version mismatch",
                "no-devices": "no GPU devices found", "gpu-lost": "GPU lost"}
    for mode, title in expected.items():
        host.up(fail=mode)
        r = gpuops("verify", "sandbox", "--no-save")
        assert r.code == 1, (mode, r.all)
        assert title in r.out and "fix:" in r.out, (mode, r.out)


def test_hung_nvidia_smi_is_reported_within_its_time_limit(sandbox, gpuops, isolated):
    host.up(fail="hang")
    (isolated / "playbooks").mkdir()
    pb = yaml.safe_load((ROOT / "playbooks" / "verify.yaml").read_text())
    pb["timeouts"]["nvidia_smi"] = 1
    (isolated / "playbooks" / "verify.yaml").write_text(yaml.safe_dump(pb))
    t = time.monotonic()
    r = gpuops("verify", "sandbox", "--no-save")
    assert r.code == 1 and "nvidia-smi hung" in r.out
    assert time.monotonic() - t < 15


def test_kmd_header_and_several_gpus(sandbox, gpuops):
    host.up(gpu="a100", gpus=4, header="kmd", driver="610.43.02", cuda="13.3")
    r = gpuops("verify", "sandbox", "--json", "--no-save")
    doc = json.loads(r.out)
    assert r.code == 0, r.all
    assert doc["facts"]["cuda_driver"] == "13.3" and doc["facts"]["smi_header_style"] == "kmd"
    assert len(doc["facts"]["gpus"]) == 4


def test_wrong_gpu_model_fails(sandbox, gpuops):
    profile_from_sandbox(sandbox, "wrong", expect={"gpu": "H200", "gpu_count": 8})
    r = gpuops("verify", "wrong", "--no-save")
    assert r.code == 1 and "GPU model" in r.out and "GPU count" in r.out


def test_user_checks_run_in_the_same_round_trip(sandbox, gpuops, isolated):
    (isolated / "playbooks").mkdir()
    pb = yaml.safe_load((ROOT / "playbooks" / "verify.yaml").read_text())
    pb["user_checks"] = [{"name": "home is isolated", "command": "pwd; echo $HOME", "expect_contains": "sandbox/home"},
                         {"name": "dataset present", "command": "test -d data", "remediation": "gpuops sync first"}]
    (isolated / "playbooks" / "verify.yaml").write_text(yaml.safe_dump(pb))
    r = gpuops("verify", "sandbox", "--json", "--no-save")
    doc = json.loads(r.out)
    by_id = {c["id"]: c for c in doc["checks"]}
    assert by_id["user.home_is_isolated"]["status"] == "pass"
    assert by_id["user.dataset_present"]["status"] == "fail" and by_id["user.dataset_present"]["remediation"] == "gpuops sync first"
    assert doc["remote_executions"] == 1 and r.code == 1


def test_host_without_python(sandbox, gpuops):
    profile_from_sandbox(sandbox, "nopy", python="python9")
    r = gpuops("verify", "nopy", "--no-save")
    assert r.code == 1
    assert "'python9' not found on the host" in r.out
    assert "GPU model: H100 (80 GB PCIe) [nvidia-smi: NVIDIA H100 PCIe]" in r.out  # GPU facts still gathered


def test_wrong_key_is_refused_with_exit_3(sandbox, gpuops, tmp_path):
    key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    profile_from_sandbox(sandbox, "wrongkey", key=str(key))
    r = gpuops("verify", "wrongkey")
    assert r.code == 3 and "refused authentication" in r.err and "Traceback" not in r.err


def test_unreachable_port_fails_fast(sandbox, gpuops):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile_from_sandbox(sandbox, "closed", port=port)
    t = time.monotonic()
    r = gpuops("verify", "closed")
    elapsed = time.monotonic() - t
    assert r.code == 3 and "cannot connect" in r.err and "refused" in r.err.lower()
    assert elapsed < 6, elapsed  # retried with backoff, well under the 10 s connect timeout


def test_changed_host_key_is_refused_then_reset(sandbox, gpuops):
    from support.helpers import record_another_host_key

    kh, pub = record_another_host_key(sandbox["port"])
    r = gpuops("verify", "sandbox")
    assert r.code == 3 and "host key" in r.err and "CHANGED" in r.err
    assert "gpuops trust sandbox --reset" in r.err
    before = kh.read_bytes()
    # not confirmed (no terminal, no --fingerprint, no --yes): nothing forgotten
    r = gpuops("trust", "sandbox", "--reset")
    assert r.code == 3 and "not confirmed" in r.err and "recorded key is kept" in r.err
    assert kh.read_bytes() == before
    # a wrong fingerprint: nothing forgotten
    r = gpuops("trust", "sandbox", "--reset", "--fingerprint", "SHA256:AAAAwrongAAAA")
    assert r.code == 3 and "not the expected" in r.err
    assert kh.read_bytes() == before
    assert gpuops("verify", "sandbox").code == 3  # still refused: the old key was not forgotten
    # the right fingerprint replaces it in one step
    fp = subprocess.run(["ssh-keygen", "-lf", str(sandbox["dir"] / "host_ed25519_key.pub")], capture_output=True,
                        text=True).stdout.split()[1]
    r = gpuops("trust", "sandbox", "--reset", "--fingerprint", fp)
    assert r.code == 0 and "forgot 1" in r.err, r.all
    assert kh.read_text().count(f"[127.0.0.1]:{sandbox['port']}") == 1 and pub[1] not in kh.read_text()
    assert gpuops("verify", "sandbox", "--no-save").code == 0


def test_trust_reset_with_the_host_unreachable_keeps_the_recorded_key(sandbox, gpuops):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    profile_from_sandbox(sandbox, "gone", port=port)
    kh = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "known_hosts"
    kh.parent.mkdir(parents=True, exist_ok=True)
    line = f"[127.0.0.1]:{port} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    kh.write_text(line)
    r = gpuops("trust", "gone", "--reset", "--yes")
    assert r.code == 3 and "cannot connect" in r.err
    assert kh.read_text() == line  # an attacker who makes the host unreachable gains nothing


def test_known_host_offering_another_key_type_is_a_changed_key(sandbox, gpuops):
    from support.helpers import record_another_host_key

    kh, pub = record_another_host_key(sandbox["port"], "ecdsa")
    before = kh.read_bytes()
    r = gpuops("verify", "sandbox")  # the sandbox offers ed25519 only
    assert r.code == 3 and "CHANGED" in r.err, r.all
    assert kh.read_bytes() == before  # not added beside the recorded key
    r = gpuops("trust", "sandbox")
    assert r.code == 3 and "CHANGED" in r.err
    assert kh.read_bytes() == before
    assert gpuops("trust", "sandbox", "--reset", "--yes").code == 0
    assert "ecdsa" not in kh.read_text() and gpuops("verify", "sandbox", "--no-save").code == 0


def test_strict_policy_requires_trust(sandbox, gpuops):
    profile_from_sandbox(sandbox, "strict", host_key_policy="strict")
    r = gpuops("verify", "strict")
    assert r.code == 3 and "not known" in r.err and "gpuops trust strict" in r.err
    r = gpuops("trust", "strict", "--fingerprint", "SHA256:AAAAwrongAAAA")
    assert r.code == 3 and "not the expected" in r.err
    r = gpuops("trust", "strict", "--json")
    fp = json.loads(r.out)["fingerprint"]
    assert r.code == 0 and fp.startswith("SHA256:")
    out = subprocess.run(["ssh-keygen", "-lf", str(sandbox["dir"] / "host_ed25519_key.pub")], capture_output=True, text=True).stdout
    assert fp in out  # the same fingerprint OpenSSH computes
    assert gpuops("verify", "strict", "--no-save").code == 0


def test_key_file_problems(sandbox, gpuops, tmp_path):
    key = tmp_path / "loose_key"
    key.write_bytes((sandbox["dir"] / "client_ed25519").read_bytes())
    key.chmod(0o644)
    profile_from_sandbox(sandbox, "loose", key=str(key))
    r = gpuops("verify", "loose")
    assert r.code == 3 and "readable by others" in r.err and f"chmod 600 {key}" in r.err
    profile_from_sandbox(sandbox, "nokey", key=str(tmp_path / "missing.pem"))
    r = gpuops("verify", "nokey")
    assert r.code == 3 and "key file not found" in r.err


def test_profile_errors_exit_2_naming_the_key(sandbox, gpuops):
    profile_from_sandbox(sandbox, "typo", expect={"gpu_cont": 1})
    r = gpuops("verify", "typo")
    assert r.code == 2 and "expect.gpu_cont: unknown key" in r.err and "gpu_count" in r.err
    assert "Traceback" not in r.err
    r = gpuops("verify", "no-such-profile")
    assert r.code == 2 and "no profile named 'no-such-profile'" in r.err
    r = gpuops("--debug", "verify", "typo")
    assert r.code == 2 and "Traceback" in r.err


def test_cli_usage_errors_and_help_in_a_real_process():
    env = {**os.environ, "NO_COLOR": "1"}
    p = subprocess.run([sys.executable, "-m", "gpuops", "--help"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "verify" in p.stdout and "sandbox" in p.stdout
    p = subprocess.run([sys.executable, "-m", "gpuops", "--version"], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stdout.startswith("gpuops 0.")
    p = subprocess.run([sys.executable, "-m", "gpuops", "verify", "--bogus"], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "No such option" in p.stderr and "Traceback" not in p.stderr


def test_ctrl_c_exits_130_without_traceback(sandbox, isolated):
    import signal

    host.up(fail="hang")
    env = {**os.environ, "NO_COLOR": "1"}
    p = subprocess.Popen([sys.executable, "-m", "gpuops", "verify", "sandbox", "--no-save"], cwd=isolated, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    time.sleep(3)  # connected, waiting on the hung nvidia-smi
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err
