"""Emulated instance images: a system Python that already holds packages, as Lambda Stack's `python3` holds a CUDA
build of torch (and pip).

A virtual environment made with `--system-site-packages` sees its BASE interpreter's site-packages, so an image
Python must be a base interpreter of its own, not a venv. `build` makes one cheaply from this machine's interpreter:
a folder laid out as a Python installation whose executable is a copy, whose standard library is symlinks to this
interpreter's, and whose site-packages is its own (pip linked in, the emulated CUDA torch of image_torch.py written
with its version). Python finds its prefix from the executable's real location, so `sys.prefix` is the image's.

Used by the sandbox host (`start(image_python=...)`: the image's python3 comes first on the session's PATH) and the
Lambda emulator's instance images.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

IMAGES = {
    # Lambda Stack on Ubuntu 22.04 (seeds/002: torch 2.9.0+cu128 in /usr/bin/python3, with pip)
    "lambda-stack": {"torch": "2.9.0+cu128", "cuda": "12.8"},
}


def _base() -> tuple[Path, str, Path]:
    """(this interpreter's base prefix, 'pythonX.Y', its real executable)."""
    ver = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    prefix = Path(sys.base_prefix)
    exe = Path(getattr(sys, "_base_executable", "") or sys.executable)
    cand = prefix / "bin" / ver
    if cand.exists():
        exe = cand
    return prefix, ver, Path(os.path.realpath(exe))


def build(dest: Path, name: str = "lambda-stack") -> Path:
    """Make (once) the image `name` in `dest`; returns the path of its python3. Idempotent."""
    spec = IMAGES[name]
    py3 = dest / "bin" / "python3"
    done = dest / ".complete"
    if done.exists() and py3.exists():
        return py3
    if dest.exists():
        shutil.rmtree(dest)
    prefix, ver, exe = _base()
    stdlib = Path(sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix),
                                            "installed_base": str(prefix)})["stdlib"])
    (dest / "bin").mkdir(parents=True)
    shutil.copy2(exe, dest / "bin" / ver)
    os.symlink(ver, dest / "bin" / "python3")
    os.symlink(ver, dest / "bin" / "python")
    lib = dest / "lib" / ver
    lib.mkdir(parents=True)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            os.symlink(entry, lib / entry.name)
    for so in (prefix / "lib").glob("libpython*"):
        os.symlink(so, dest / "lib" / so.name)
    site = lib / "site-packages"
    site.mkdir()
    base_site = Path(sysconfig.get_paths(vars={"base": str(prefix), "platbase": str(prefix)})["purelib"])
    for entry in list(base_site.glob("pip")) + list(base_site.glob("pip-*.dist-info")):
        os.symlink(entry, site / entry.name)
    _install_torch(site, spec["torch"], spec["cuda"])
    r = subprocess.run([str(py3), "-c", "import sys, torch; print(sys.prefix)"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
    if r.returncode != 0 or Path(r.stdout.strip()) != dest:
        raise RuntimeError(f"the emulated image's python did not start as its own installation: "
                           f"{(r.stderr or r.stdout).strip()[-300:]}")
    done.write_text("ok\n")
    return py3


def _install_torch(site: Path, version: str, cuda: str) -> None:
    src = (Path(__file__).parent / "image_torch.py").read_text()
    src = src.replace('__version__ = "2.9.0+cu128"', f"__version__ = {version!r}", 1)
    src = src.replace('CUDA = "12.8"', f"CUDA = {cuda!r}", 1)
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text(src)
    dist = site / f"torch-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n"
                                   "Summary: emulated CUDA build (gpuops sandbox image)\n")
    (dist / "INSTALLER").write_text("image\n")
    (dist / "RECORD").write_text("")
