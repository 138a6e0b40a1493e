"""A profile whose remote Python lives under ~ (a venv in the remote home) works for every command that runs it."""
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml


def test_tilde_python_for_verify_fetch_and_train(sandbox, gpuops):
    home = Path(sandbox["dir"]) / "home"
    venv = home / "venv-tilde"
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    data = yaml.safe_load(sandbox["profile"].read_text())
    data["python"] = "~/venv-tilde/bin/python"
    sandbox["profile"].write_text(yaml.safe_dump(data))

    r = gpuops("verify", "sandbox", "--json", "--no-save")
    doc = json.loads(r.out)
    assert doc["facts"]["python"]["executable"].endswith("venv-tilde/bin/python"), r.err

    project = home / Path.cwd().name
    (project / "checkpoints" / "global_step_3").mkdir(parents=True)
    (project / "checkpoints" / "global_step_3" / "w.bin").write_bytes(b"x" * 1000)
    r = gpuops("fetch", "checkpoints", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    assert (Path.cwd() / "checkpoints" / "global_step_3" / "w.bin").read_bytes() == b"x" * 1000

    Path("which.py").write_text("import sys\nprint('exe', sys.executable)\n")
    r = gpuops("train", "--script", "which.py", "--no-snapshot", "--json")
    assert r.code == 0, r.all
    rid = json.loads(r.out)["run_id"]
    log = project / ".gpuops" / "runs" / rid / "log"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "exe" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    assert "venv-tilde/bin/python" in log.read_text()
