"""Start-up stays light: help never imports the heavy libraries (timings live in benchmarks/, not here)."""
import os
import subprocess
import sys

import pytest

HEAVY = ("paramiko", "fabric", "wandb", "pydantic", "rich", "yaml", "invoke", "cryptography", "starlette", "uvicorn",
         "httpx", "anyio")


@pytest.mark.parametrize("args", [["--help"], ["verify", "--help"], ["train", "--help"], ["sandbox", "up", "--help"],
                                  ["snapshot", "--help"], ["fetch", "--help"],
                                  ["dashboard", "--help"]])
def test_help_imports_no_heavy_library(args):
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuops", *args], capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in p.stderr.splitlines() if line.startswith("import time:")}
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))
