"""Recorded facts of a host for the pure tests of setup (setup/plan.py) and of what runs before a launch."""
from __future__ import annotations

from pathlib import Path

from gpuops import knowledge as kb
from gpuops.profiles.model import Profile
from gpuops.setup import plan as sp


KNOW = kb.knowledge(Path("/nonexistent"))


def b64(text: str) -> str:
    import base64

    return base64.b64encode(text.encode()).decode()


def facts(files: dict[str, str], *, base_torch: str | None = "2.9.0+cu128", base_pip: bool = True,
          uv: str = "/home/ubuntu/.local/bin/uv", env: str | None = None, free_kb: int = 500_000_000):
    """Recorded facts of a Lambda Stack host with these project files ({name: text}) on it."""
    import hashlib

    lines = ["home=/home/ubuntu", "user=ubuntu", f"uv={uv}", "python3=/usr/bin/python3", "pip_user_ok=1"]
    for name, text in files.items():
        lines.append(f"@file {name} {hashlib.sha256(text.encode()).hexdigest()}")
        if name != "uv.lock":
            lines.append(f"@text {name} {b64(text)}")
    lines += ["base_python_version=3.10.12", "base_prefix=/usr", f"base_pip={int(base_pip)}", "arch=x86_64"]
    if base_torch:
        lines += [f"base_torch={base_torch}", "base_torch_path=/usr/lib/python3/dist-packages"]
    lines += [env or "env_python=0", "running=0", "@gpu 0, 570.148.08, 9.0", "cuda_driver=12.8",
              f"home_disk=/dev/vda1 {free_kb}"]
    return sp.parse_facts("\n".join(lines) + "\n")


def profile(**kw) -> Profile:
    base = {"host": "h", "python": "~/venv/bin/python", "expect": {"packages": {"torch": "2.9.0", "flash-attn": "*"}}}
    base.update(kw)
    return Profile(**base)
