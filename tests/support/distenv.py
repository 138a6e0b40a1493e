"""A real Python with CPU torch and Ray for the fleet tests, built once per machine and kept between runs.

Where: $GPUOPS_TEST_CACHE (default ~/.cache/gpuops-tests, read before the tests isolate HOME). The first test that
needs it builds it (`python tests/support/distenv.py` builds it ahead); xdist workers asking at once wait on one flock
while one of them builds, so a machine that ran the suite before installs nothing. pip takes
torch 2.13.0 from the CPU wheel this machine kind keeps on disk (its find-links), Ray from PyPI.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"
RAY = "ray==2.60.0"
CACHE = Path(os.environ.get("GPUOPS_TEST_CACHE") or Path.home() / ".cache" / "gpuops-tests")
VENV = CACHE / f"dist-py{sys.version_info[0]}{sys.version_info[1]}-torch2.13.0-ray2.60.0"


def python() -> Path:
    """The venv's python, building the venv if it is not there yet (or was left half-built)."""
    import fcntl

    py = VENV / "bin" / "python"
    done = VENV / ".complete"
    if done.exists() and py.exists():
        return py
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be building it right now
        if not (done.exists() and py.exists()):
            _build(py, done)
    return py


def _build(py: Path, done: Path) -> None:
    base = sys._base_executable if hasattr(sys, "_base_executable") else sys.executable
    subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", TORCH, RAY], check=True)
    subprocess.run([str(py), "-c", "import torch, ray, torch.distributed as d; assert d.is_gloo_available()"],
                   check=True)
    done.write_text("ok\n")


if __name__ == "__main__":
    print(python())
