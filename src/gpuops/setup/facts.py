"""The host's facts as setup's facts script (setup/scripts.py) prints them, parsed (pure): what the plan
(setup/plan.py) decides from. One line per fact: `key=value`, or a tagged line (`@pkg`, `@file`, `@text`, ...)."""
from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from typing import Optional


# -- the facts -----------------------------------------------------------------------------------------------------
@dataclass
class HostFacts:
    """What the facts script (setup/scripts.py) reports, parsed."""
    home: str = "~"
    user: str = ""
    uv: Optional[str] = None
    python3: Optional[str] = None  # the base python (python3, or setup.base_python) on the host
    pip_user_ok: bool = False  # python3 has pip and is not an externally managed (PEP 668) interpreter
    base_python_version: Optional[str] = None
    base_pip: bool = False  # the base python has pip (a venv that sees its packages can run it)
    base_torch: Optional[str] = None  # the image's torch (in the base python), e.g. 2.9.0+cu128
    base_torch_path: Optional[str] = None
    arch: Optional[str] = None
    env_python: bool = False  # the profile's python exists
    env_python_version: Optional[str] = None
    env_pip: bool = False
    env_venv: bool = False  # the profile's python is a virtual environment's (pyvenv.cfg)
    env_system_site: bool = False  # ... made with --system-site-packages
    env_torch_path: Optional[str] = None
    env_stale: Optional[str] = None  # the profile's python does not run, and its folder holds: "venv" (pyvenv.cfg), "other"
    packages: dict[str, Optional[str]] = field(default_factory=dict)  # in the profile's python
    flash_attn_import: Optional[str] = None  # "ok" or the import error; None when not checked
    files: dict[str, str] = field(default_factory=dict)  # dependency file (and includes) -> sha256, remote project
    texts: dict[str, str] = field(default_factory=dict)  # the small ones' text (requirements, pyproject.toml)
    missing: list[str] = field(default_factory=list)  # files a requirements file includes that do not exist
    pipconf: dict = field(default_factory=dict)  # pip's configuration on the host (credentials removed)
    stamp: Optional[dict] = None  # done.json of the last successful setup
    running: bool = False  # a setup is running on the host now
    last_rc: Optional[int] = None
    driver: Optional[str] = None
    cuda_driver: Optional[str] = None  # "CUDA Version" of nvidia-smi's header: the newest CUDA the driver runs
    capabilities: list[str] = field(default_factory=list)
    gpu_count: int = 0
    home_free_mb: Optional[int] = None
    home_fs: Optional[str] = None
    disks: list[tuple[str, str, int]] = field(default_factory=list)  # (writable folder, filesystem, free MB)


_FLAGS = {"pip_user_ok", "env_python", "base_pip", "env_pip", "env_venv", "env_system_site", "running"}
_TEXT = {"home", "user", "uv", "python3", "env_python_version", "base_python_version", "base_torch",
         "base_torch_path", "arch", "env_torch_path", "cuda_driver", "env_stale"}


def parse_facts(text: str) -> HostFacts:
    """Lines `key=value`, `@pkg name=version`, `@file name sha256`, `@text name base64`, `@missing name`,
    `@script name base64`, `@pipconf {json}`, `@disk folder fs free_kb`, `@stamp {json}`,
    `@gpu index, driver, capability`."""
    f = HostFacts()
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "@pkg":
            name, _, ver = rest.partition("=")
            f.packages[name.strip()] = ver.strip() or None
        elif tag in ("@file", "@text", "@script"):
            parts = rest.split()
            if len(parts) >= 2:
                name = parts[0].replace("%20", " ")
                if tag == "@file":
                    f.files[name] = parts[1]
                elif tag == "@script":  # a script's text (its `# /// script` block): no dependency file
                    f.texts[name] = base64.b64decode(parts[1]).decode("utf-8", "replace")
                else:
                    f.texts[name] = base64.b64decode(parts[1]).decode("utf-8", "replace")
        elif tag == "@missing":
            f.missing.append(rest.strip().replace("%20", " "))
        elif tag in ("@pipconf", "@stamp"):
            try:
                doc = json.loads(rest)
            except ValueError:
                doc = None
            if tag == "@pipconf":
                f.pipconf = doc if isinstance(doc, dict) else {}
            else:
                f.stamp = doc
        elif tag == "@disk":
            parts = rest.split()
            if len(parts) >= 3 and parts[2].isdigit():
                f.disks.append((parts[0], parts[1], int(parts[2]) // 1024))
        elif tag == "@gpu":
            parts = [p.strip() for p in rest.split(",")]
            if parts and parts[0]:
                f.gpu_count += 1
                if len(parts) > 1 and parts[1] and not f.driver:
                    f.driver = parts[1]
                if len(parts) > 2 and re.match(r"\d+\.\d+$", parts[2]):
                    f.capabilities.append(parts[2])
        elif "=" in line and not line.startswith("@"):
            k, _, v = line.partition("=")
            v = v.strip()
            if k in _FLAGS:
                setattr(f, k, v == "1")
            elif k in _TEXT:
                setattr(f, k, v or (None if k not in ("home", "user") else getattr(f, k)))
            elif k == "flash_attn":
                f.flash_attn_import = v or None
            elif k == "last_rc":
                f.last_rc = int(v) if v.lstrip("-").isdigit() else None
            elif k == "home_disk":
                parts = v.split()
                if len(parts) == 2 and parts[1].isdigit():
                    f.home_fs, f.home_free_mb = parts[0], int(parts[1]) // 1024
    return f
