"""Recorded facts of the launch gate (a workstation with 2x RTX 6000 Ada, one GPU held) for the pure tests."""
from __future__ import annotations

from pathlib import Path

from gpuops import knowledge as kb
from gpuops.profiles.model import Profile
from support.helpers import fact, healthy_cuda, probe_doc, smi


KNOW = kb.knowledge(Path("/nonexistent"))


ADA0 = "GPU-7e1f4a2b-3c4d-5e6f-7a8b-9c0d1e2f3a4b"


ADA1 = "GPU-8f2a5b3c-4d5e-6f7a-8b9c-0d1e2f3a4b5c"


def profile(**kw) -> Profile:
    data = {"name": "ws", "host": "h", "python": "~/.venvs/gpuops/bin/python",
            "expect": {"gpu_count": 2, "packages": {"torch": "2.9.0"}}}
    data.update(kw)
    return Profile.model_validate(data)


def ada(apps: str = "", procs: dict | None = None, *, torch_sees: int = 2, env: dict | None = None) -> dict:
    """The runbook 000 workstation: 2x RTX 6000 Ada, GPU 0 with 21.5 GB used."""
    doc = probe_doc(query=smi("rtx6000ada_x2_busy.csv"), packages={"torch": "2.9.0+cu128"},
                    cuda=healthy_cuda(torch_sees, cap="8.9"), env=env)
    doc["gpu_apps"] = fact({"found": True, "rc": 0, "stdout": apps, "stderr": "", "procs": procs or {}})
    return doc
