"""`gpuops profiles new` / `--from-host` / `pin` through the real sandbox host; every written profile is loaded back
through the hand-written profile's gate and verified against the host; every bad input is one message, exit 2."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuops.profiles.model import load_profile


def args_for(sandbox, name="box", *extra):
    return ["profiles", "new", name, "--host", "127.0.0.1", "--port", str(sandbox["port"]), "--user", sandbox["user"],
            "--key", str(sandbox["dir"] / "client_ed25519"), *extra]


def test_new_with_type_writes_a_valid_profile_that_verifies(sandbox, gpuops):
    res = gpuops(*args_for(sandbox, "box", "--type", "gpu_1x_h100_pcie"))
    assert res.code == 0, res.all
    path = Path("profiles/box.yaml")
    assert f"wrote profile 'box': {path.resolve()}" in res.err or "wrote profile 'box'" in res.err
    assert "next: gpuops verify box" in res.err
    text = path.read_text()
    assert text.startswith("# gpuops profile 'box'") and "# Check the host against it: gpuops verify box" in text
    prof = load_profile(path)
    assert prof.expect.gpu == "H100 PCIe" and prof.expect.gpu_count == 1
    assert prof.expect.gpu_memory_mib == int(81559 * 0.97)
    assert prof.env_preset == "h100" and prof.instance_type == "gpu_1x_h100_pcie"
    assert prof.key == sandbox["dir"] / "client_ed25519" and prof.port == sandbox["port"]
    res = gpuops("verify", "box")
    assert res.code == 0, res.all
    assert "PASS" in res.out and "GPU model" in res.out


def test_type_on_the_wrong_gpu_fails_verify(sandbox, gpuops):
    assert gpuops(*args_for(sandbox, "rtx", "--type", "gpu_1x_a100_sxm4")).code == 0
    res = gpuops("verify", "rtx")
    assert res.code == 1 and "GPU model" in res.out


def test_from_host_trusts_once_records_the_stack_and_verifies(sandbox, gpuops):
    from gpuops.sandbox import host

    host.up(gpu="h100-sxm", gpus=2, driver="580.65.06", cuda="13.0")
    res = gpuops(*args_for(sandbox, "live", "--from-host", "--user-config"))
    assert res.code == 0, res.all
    assert "trusted new host key for [127.0.0.1]:" in res.err and "SHA256:" in res.err
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / "live.yaml"
    assert not Path("profiles/live.yaml").exists()
    prof = load_profile(path)
    e = prof.expect
    assert (e.gpu, e.gpu_count, e.driver, e.cuda) == ("H100 80GB HBM3", 2, "580.65.06", "13.0")
    assert e.python is not None and e.python.count(".") == 1  # the sandbox's python3, major.minor
    assert prof.env_preset == "h100"  # gpus.yaml: H100 SXM5 -> h100
    assert "nvidia-smi: NVIDIA H100 80GB HBM3" in path.read_text()
    res = gpuops("verify", "live")
    assert res.code == 0, res.all
    assert "trusted new host key" not in res.err  # recorded once, by `profiles new`


def test_pin_shows_the_diff_keeps_comments_and_verifies(sandbox, gpuops):
    assert gpuops(*args_for(sandbox, "box", "--from-host")).code == 0
    path = Path("profiles/box.yaml")
    path.write_text("# my own note about this box\n" + path.read_text().replace(
        "fetch:", "price_per_hour: 2.49   # my price comment\nfetch:"))
    from gpuops.sandbox import host

    host.up(driver="575.51.03", cuda="12.9")  # the host moved on: a new driver
    assert gpuops("verify", "box").code == 1
    res = gpuops("profiles", "pin", "box", "--dry-run")
    assert res.code == 0, res.all
    assert '-  driver: "570.148.08"' in res.out and '+  driver: "575.51.03"' in res.out
    assert '+  cuda: "12.9"' in res.out and "dry run: nothing written" in res.err
    assert '"570.148.08"' in path.read_text()
    res = gpuops("profiles", "pin", "box")  # stdin is not a terminal: written without asking
    assert res.code == 0, res.all
    text = path.read_text()
    assert '"575.51.03"' in text and "# my own note about this box" in text and "# my price comment" in text
    assert load_profile(path).price_per_hour == 2.49
    assert gpuops("verify", "box").code == 0
    res = gpuops("profiles", "pin", "box", "--json")
    assert res.code == 0 and "nothing to change" in res.err


def test_pin_keeps_expectations_the_host_cannot_tell(sandbox, gpuops):
    prof = Path(sandbox["profile"])
    text = prof.read_text()
    Path("profiles").mkdir()
    mine = Path("profiles/mine.yaml")
    mine.write_text(text.replace("min_disk_gb: 1", "min_disk_gb: 1\n  packages: {not-a-real-package-xyz: \"1.0\"}"))
    res = gpuops("profiles", "pin", "mine", "--yes")
    assert res.code == 0, res.all
    e = load_profile(mine).expect
    assert e.min_disk_gb == 1 and e.packages == {"not-a-real-package-xyz": "1.0"} and e.driver == "570.148.08"


def test_pin_refuses_a_packaged_example(gpuops):
    res = gpuops("profiles", "pin", "lambda-h100")
    assert res.code == 2 and "packaged example" in res.err and "Traceback" not in res.err


@pytest.mark.parametrize("bad,words", [
    (["--host", "ubuntu@203.0.113.7"], "user@ belongs in 'user:'"),
    (["--host", "-oProxyCommand=touch x"], "is not a host"),
    (["--host", "203.0.113.7:22"], "port belongs in 'port:'"),
    (["--host", "203.0.113.7", "--type", "gpu_1x_h900"], "is not an instance type"),
    (["--host", "203.0.113.7", "--key", "MISSING"], "--key: key file not found"),
    (["--host", "203.0.113.7", "--key", "OPEN"], "readable by others"),
])
def test_new_refuses_bad_input_with_one_message(gpuops, tmp_path, bad, words):
    key = tmp_path / "open_key"
    key.write_text("x")
    key.chmod(0o644)
    bad = [str(key) if b == "OPEN" else str(tmp_path / "nope") if b == "MISSING" else b for b in bad]
    res = gpuops("profiles", "new", "box", *bad)
    assert res.code == 2, res.all
    assert words in res.err and "Traceback" not in res.err and res.err.count("error:") == 1
    assert not Path("profiles/box.yaml").exists()


def test_type_typo_suggests_the_close_name(gpuops):
    res = gpuops("profiles", "new", "box", "--host", "203.0.113.7", "--type", "gpu_1x_h100_sxm5x")
    assert "did you mean gpu_1x_h100_sxm5" in res.err


@pytest.mark.parametrize("name", ["../x", "a b", "x;rm", "é", "box.yaml", ".hidden", "x" * 65, "a/b"])
def test_new_refuses_a_name_that_is_not_a_file_safe_word(gpuops, name):
    res = gpuops("profiles", "new", name, "--host", "203.0.113.7")
    assert res.code == 2 and "is not a file-safe word" in res.err
    assert not Path("profiles").exists() or not any(Path("profiles").iterdir())


def test_new_never_overwrites_without_force(gpuops):
    assert gpuops("profiles", "new", "box", "--host", "203.0.113.7").code == 0
    before = Path("profiles/box.yaml").read_text()
    res = gpuops("profiles", "new", "box", "--host", "203.0.113.8")
    assert res.code == 2 and "exists; not overwritten" in res.err and "--force" in res.err
    assert Path("profiles/box.yaml").read_text() == before
    assert gpuops("profiles", "new", "box", "--host", "203.0.113.8", "--force").code == 0
    assert load_profile(Path("profiles/box.yaml")).host == "203.0.113.8"


def test_a_hand_written_profile_with_a_bad_host_is_refused_the_same_way(gpuops):
    Path("profiles").mkdir()
    Path("profiles/hand.yaml").write_text("host: ubuntu@203.0.113.7\n")
    res = gpuops("profiles", "show", "hand")
    assert res.code == 2 and "user@ belongs in 'user:'" in res.err


def test_a_tilde_the_local_shell_expanded_is_written_as_the_remote_home(gpuops):
    home = Path.home()
    res = gpuops("profiles", "new", "box", "--host", "203.0.113.7", "--remote-dir", f"{home}/One-Shot-RLVR",
                 "--python", f"{home}/venv/bin/python")
    assert res.code == 0 and "under your local home" in res.err
    prof = load_profile(Path("profiles/box.yaml"))
    assert prof.remote_dir == "~/One-Shot-RLVR" and prof.python == "~/venv/bin/python"


def test_pin_at_a_terminal_asks_and_a_no_writes_nothing(sandbox, gpuops):
    import shutil
    import subprocess
    import sys

    assert shutil.which("script"), "util-linux `script` gives the command a terminal"
    assert gpuops(*args_for(sandbox, "box", "--from-host")).code == 0
    from gpuops.sandbox import host

    host.up(driver="575.51.03")
    before = Path("profiles/box.yaml").read_text()
    cmd = f"{sys.executable} -c 'from gpuops.cli.main import run; run()' profiles pin box"
    p = subprocess.run(["script", "-qec", cmd, "/dev/null"], input="n\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "write these expectations to" in p.stdout and '+  driver: "575.51.03"' in p.stdout
    assert Path("profiles/box.yaml").read_text() == before
    p = subprocess.run(["script", "-qec", cmd, "/dev/null"], input="y\n", capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout
    assert '"575.51.03"' in Path("profiles/box.yaml").read_text()


def test_new_with_type_writes_the_price_from_the_price_list_without_a_key(sandbox, gpuops, monkeypatch):
    """Issue #29: `profiles new --type` wrote no price_per_hour, so watch and status showed no cost so far."""
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    res = gpuops(*args_for(sandbox, "priced", "--type", "gpu_1x_h100_sxm5"))
    assert res.code == 0, res.all
    text = Path("profiles/priced.yaml").read_text()
    assert "price_per_hour: 3.29   # USD, from Lambda's public price list" in text, text
    assert load_profile(Path("profiles/priced.yaml")).price_per_hour == 3.29
    # a type the table lacks: no price written, nothing invented
    res = gpuops(*args_for(sandbox, "unpriced", "--type", "gpu_1x_h100_pcie", "--force"))
    assert res.code == 0
    assert load_profile(Path("profiles/unpriced.yaml")).price_per_hour == 2.49
    # status shows the cost so far of a run on it
    Path("train.py").write_text("import time\nprint('step 1 loss 0.5', flush=True)\ntime.sleep(30)\n")
    assert gpuops("train", "-p", "priced", "--script", "train.py", "--force").code == 0
    r = gpuops("status", "-p", "priced", "--json")
    import json

    runs = json.loads(r.out)["runs"]
    assert runs and runs[0]["cost"] is not None and runs[0]["cost"] >= 0, runs
    r = gpuops("status", "-p", "priced")
    assert "COST" in r.out and "$0.0" in r.out, r.out
    gpuops("stop", "-p", "priced")


@pytest.fixture
def emulator(tmp_path, monkeypatch):
    from gpuops.cloud.emulator.server import Emulator

    emu = Emulator(tmp_path / "emu", api_key="secret_test_x.y", boot_seconds=0.3, terminate_seconds=0.2,
                   launch_window=0).start()
    for k, v in emu.env.items():
        monkeypatch.setenv(k, v)
    yield emu
    emu.close()


def test_new_with_type_takes_the_price_from_the_api_listing_with_a_key(sandbox, gpuops, emulator):
    res = gpuops(*args_for(sandbox, "listed", "--type", "gpu_1x_a100_sxm4"))
    assert res.code == 0, res.all
    text = Path("profiles/listed.yaml").read_text()
    assert "price_per_hour: 1.79   # USD, from Lambda's API listing" in text, text
    assert "secret_test" not in text
    # the API failing is said, and the price list answers
    emulator.fault("5xx", times=10)
    res = gpuops(*args_for(sandbox, "listed2", "--type", "gpu_1x_a100_sxm4"))
    assert res.code == 0, res.all
    assert "Lambda's API did not answer" in res.err
    assert "from Lambda's public price list" in Path("profiles/listed2.yaml").read_text()
