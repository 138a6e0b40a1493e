"""Emulated instance images: a system Python that already holds packages, as Lambda Stack's `python3` holds a CUDA
build of torch (and pip).

A virtual environment made with `--system-site-packages` sees its BASE interpreter's site-packages, so an image
Python must be a base interpreter of its own, not a venv. `build` makes one cheaply from this machine's interpreter:
a folder laid out as a Python installation whose executable is a copy, whose standard library is symlinks to this
interpreter's, and whose site folder (where its site module looks: Debian's and Ubuntu's dist-packages included) is
its own (pip linked in, the emulated CUDA torch of image_torch.py written with its version). Python finds its prefix
from the executable's real location, so `sys.prefix` is the image's.

Used by the sandbox host (`start(image_python=...)`: the image's python3 comes first on the session's PATH) and the
Lambda emulator's instance images. The image's torch has a `torch.distributed.run` and the image a `bin/torchrun` run
by the image's python (sandbox/image_torchrun.py), as Lambda Stack's /usr/bin/torchrun is the system python's.

Its packages are playbooks/images.yaml's for the image family it stands for (issue 34): each installed as a
distribution pip and uv see (a dist-info with its version), torch as the emulated CUDA build, the others as an empty
module that says its version. So what the local plan resolves against is what a rehearsal's setup finds.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

IMAGES = {
    # Lambda Stack on Ubuntu 22.04 (seeds/002: torch 2.9.0+cu128 in /usr/bin/python3, with pip): its packages are
    # images.yaml's lambda-stack-22-04 row
    "lambda-stack": {"family": "lambda-stack-22-04", "torch": "2.9.0+cu128", "cuda": "12.8"},
}


def packages(name: str) -> dict[str, str]:
    """The packages the emulated image `name` carries: images.yaml's row of its family (torch at least)."""
    from ..project import images as known

    spec = IMAGES[name]
    row = known.image_for(known.load(), spec["family"]) if spec.get("family") else None
    found = dict(row.packages) if row is not None else {}
    found.setdefault("torch", spec["torch"])
    return found


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
    carried = packages(name)
    stamp = "ok " + " ".join(f"{k}=={v}" for k, v in sorted(carried.items())) + "\n"
    py3 = dest / "bin" / "python3"
    done = dest / ".complete"
    if done.exists() and py3.exists() and done.read_text() == stamp:
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
        # the image has its own site folders; Lambda Stack's Ubuntu 22.04 python is not externally managed
        if entry.name not in ("site-packages", "dist-packages", "EXTERNALLY-MANAGED"):
            os.symlink(entry, lib / entry.name)
    for so in (prefix / "lib").glob("libpython*"):
        os.symlink(so, dest / "lib" / so.name)
    site = _site_dir(py3, dest)
    site.mkdir(parents=True, exist_ok=True)
    pip_home = _pip_home(exe)
    for entry in list(pip_home.glob("pip")) + list(pip_home.glob("pip-*.dist-info")):
        os.symlink(entry, site / entry.name)
    _install_torch(site, carried["torch"], spec["cuda"])
    _install_torchrun(site, dest / "bin")
    for pkg, version in sorted(carried.items()):
        if pkg != "torch":
            _install_package(site, pkg, version)
    r = subprocess.run([str(py3), "-c", "import sys, torch, pip; print(sys.prefix)"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})
    if r.returncode != 0 or Path(r.stdout.strip()) != dest:
        raise RuntimeError(f"the emulated image's python did not start as its own installation: "
                           f"{(r.stderr or r.stdout).strip()[-300:]}")
    done.write_text(stamp)
    return py3


def _run_py(py: Path | str, code: str) -> str:
    r = subprocess.run([str(py), "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**os.environ, "PYTHONNOUSERSITE": "1"})
    if r.returncode != 0:
        raise RuntimeError(f"the emulated image could not be built: {py}: {(r.stderr or r.stdout).strip()[-300:]}")
    return r.stdout.strip()


def _site_dir(py3: Path, dest: Path) -> Path:
    """Where the image's own python looks for packages, as its site module says: `lib/pythonX.Y/site-packages` for a
    python.org or pyenv build, `lib/python3/dist-packages` on Debian and Ubuntu (where Lambda Stack puts torch)."""
    dirs = [Path(d) for d in _run_py(py3, "import site; print('\\n'.join(site.getsitepackages()))").splitlines()]
    mine = [d for d in dirs if dest in d.parents]
    if not mine:
        raise RuntimeError(f"the emulated image's python looks for packages outside {dest}: {dirs}")
    return next((d for d in mine if d.parts[-2:] == ("python3", "dist-packages")), mine[0])


def _pip_home(exe: Path) -> Path:
    """The folder holding the base interpreter's pip (site-packages, or Debian's /usr/lib/python3/dist-packages)."""
    return Path(_run_py(exe, "import os, pip; print(os.path.dirname(os.path.dirname(pip.__file__)))"))


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


def _install_package(site: Path, name: str, version: str) -> None:
    """A package of the image as pip and uv see it installed (dist-info with its version, INSTALLER `image`) and
    as an import finds it: a module that says its version, and that it is the emulated image's."""
    module = name.replace("-", "_")
    (site / module).mkdir(exist_ok=True)
    (site / module / "__init__.py").write_text(f"__version__ = {version!r}\nEMULATED = True  # gpuops sandbox image\n")
    dist = site / f"{module}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                   "Summary: emulated (gpuops sandbox image)\n")
    (dist / "INSTALLER").write_text("image\n")
    (dist / "top_level.txt").write_text(module + "\n")
    (dist / "RECORD").write_text("")


def _install_torchrun(site: Path, bin_dir: Path) -> None:
    """torch.distributed.run (sandbox/image_torchrun.py) and the image's own `torchrun`, run by the image's python."""
    dist = site / "torch" / "distributed"
    dist.mkdir()
    (dist / "__init__.py").write_text("")
    (dist / "run.py").write_text((Path(__file__).parent / "image_torchrun.py").read_text())
    script = bin_dir / "torchrun"
    script.write_text(f"#!{bin_dir / 'python3'}\nfrom torch.distributed.run import main\nmain()\n")
    script.chmod(0o755)
