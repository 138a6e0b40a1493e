"""A local package index of metadata-only wheels, so uv resolves OFFLINE in the tests as PyPI behaves for the packages
that matter (issue 34): each wheel has a name, a version, its Requires-Dist, and optionally modules and console
scripts, and nothing else (installing one gives an importable, empty module).

`index()` builds the folder once per machine (content-addressed under $GPUOPS_TEST_CACHE, ~/.cache/gpuops-tests),
so xdist workers and later sessions share it: `uv pip compile --no-index --find-links <folder>`. The same folder
served over HTTPS (support/indexes.TlsIndex) is what pip on a sandbox host installs from.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import zipfile
from pathlib import Path

# read at import, before the tests isolate HOME (tests/conftest.py imports this module first)
CACHE = Path(os.environ.get("GPUOPS_TEST_CACHE") or Path.home() / ".cache" / "gpuops-tests")

# (name, version, requires, modules, console scripts): the behaviours of PyPI the resolution must meet.
WHEELS = [
    # torch 2.9.0 is the image's; PyPI's builds require their CUDA runtime wheels (cu12 for 2.9/2.10, 13 for 2.14)
    ("torch", "2.9.0", ["nvidia-cuda-runtime-cu12==12.8.90"], ["torch"], {"torchrun": "torch.distributed.run:main"}),
    ("torch", "2.10.0", ["nvidia-cuda-runtime-cu12==12.8.90"], ["torch"], {"torchrun": "torch.distributed.run:main"}),
    ("torch", "2.14.1", ["nvidia-cuda-runtime==13.0.96"], ["torch"], {"torchrun": "torch.distributed.run:main"}),
    ("nvidia-cuda-runtime-cu12", "12.8.90", [], ["nvidia_cu12"], {}),
    ("nvidia-cuda-runtime", "13.0.96", [], ["nvidia_cu13"], {}),
    # each torchvision release pins its torch (pytorch/vision's compatibility table)
    ("torchvision", "0.24.0", ["torch==2.9.0", "numpy"], ["torchvision"], {}),
    ("torchvision", "0.25.0", ["torch==2.10.0", "numpy"], ["torchvision"], {}),
    ("torchvision", "0.29.2", ["torch==2.14.1", "numpy"], ["torchvision"], {}),
    # a trainer whose newest release needs a newer torch than the image's (axolotl's shape)
    ("bigtrainer", "1.0.0", ["torch>=2.9"], ["bigtrainer"], {"bigtrainer": "bigtrainer.cli:main"}),
    ("bigtrainer", "2.0.0", ["torch>=2.11"], ["bigtrainer"], {"bigtrainer": "bigtrainer.cli:main"}),
    # a package every release of which needs a newer torch (vllm pinning its own torch)
    ("newonly", "1.0.0", ["torch>=2.11"], ["newonly"], {}),
    ("tensordict", "0.10.0", ["torch", "orjson"], ["tensordict"], {}),
    ("orjson", "3.13.0", [], ["orjson"], {}),
    ("numpy", "1.21.5", [], ["numpy"], {}),
    ("numpy", "2.2.6", [], ["numpy"], {}),
    ("requests", "2.32.5", [], ["requests"], {}),
    ("tiktoken", "0.12.0", [], ["tiktoken"], {}),
    ("python-dotenv", "1.2.4", [], ["dotenv"], {}),
    # packages that build against torch: flash-attn resolves (static metadata) yet would build in isolation
    ("flash-attn", "2.8.3", ["torch", "einops"], ["flash_attn"], {}),
    ("einops", "0.8.1", [], ["einops"], {}),
    ("deepspeed", "0.19.5", ["torch", "numpy"], ["deepspeed"], {"deepspeed": "deepspeed.launcher.runner:main"}),
]


def metadata_wheel(folder: Path, name: str, version: str, requires=(), modules=(), scripts=None) -> Path:
    """One metadata-only wheel (py3-none-any), RECORD hashed as pip checks it."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = {f"{m}/__init__.py": f"__version__ = {version!r}\n".encode() for m in modules}
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: gpuops-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/top_level.txt"] = "".join(f"{m}\n" for m in modules).encode()
    if scripts:
        files[f"{info}/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())).encode()
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
              for k, v in files.items()]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def index(extra: list | None = None) -> Path:
    """The folder of WHEELS (+ extra rows), built once per content and kept; safe when xdist workers race."""
    rows = WHEELS + list(extra or [])
    key = hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:12]
    base = CACHE
    folder = base / f"wheels-{key}"
    if (folder / ".complete").exists():
        return folder
    tmp = base / f".wheels-{key}.{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    for row in rows:
        metadata_wheel(tmp, *row)
    (tmp / ".complete").write_text("ok\n")
    try:
        os.rename(tmp, folder)
    except OSError:  # another worker got there first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return folder
