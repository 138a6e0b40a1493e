"""The talking part of a resolution: runs uv on this machine (project/uvcmd.py says what to run and reads what it
says), with a cache of gpuops' own, never downloading a python, offline first, every run bounded by the time left.

Nothing here decides: a run that did not finish in time is an Outcome without an exit code, and project/resolution.py
judges. The image's kept packages are handed to uv as the image's own distributions: metadata-only wheels of their
name and version, without dependencies, written once into the cache folder.
"""
from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from .uvcmd import UV_ENV, Outcome, Run

if TYPE_CHECKING:
    from .images import Image


def find_uv() -> Optional[str]:
    """The uv gpuops runs ($GPUOPS_UV, else uv on PATH, else ~/.local/bin/uv), or None."""
    named = os.environ.get("GPUOPS_UV")
    if named:
        return named if os.access(named, os.X_OK) else None
    found = shutil.which("uv")
    if found:
        return found
    local = Path.home() / ".local" / "bin" / "uv"
    return str(local) if os.access(local, os.X_OK) else None


def cache_dir() -> Path:
    """gpuops' own uv cache ($GPUOPS_UV_CACHE_DIR, else $XDG_CACHE_HOME/gpuops/uv): never the user's (a `uv cache
    clean` there holds its lock for minutes)."""
    if os.environ.get("GPUOPS_UV_CACHE_DIR"):
        return Path(os.environ["GPUOPS_UV_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "gpuops" / "uv"


def image_stubs(image: "Image", folder: Optional[Path] = None) -> dict[str, str]:
    """name -> file:// URL of a metadata-only wheel for each kept package of the image (made once)."""
    folder = folder or cache_dir().parent / "image-packages"
    out = {}
    for name in sorted(image.keep):
        version = image.packages.get(name)
        if version:
            out[name] = stub_wheel(folder, name, version).as_uri()
    return out


def stub_wheel(folder: Path, name: str, version: str) -> Path:
    """A wheel that says only `name version` (no files, no dependencies): what uv needs to count it present."""
    dist = name.replace("-", "_")
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    if path.is_file():
        return path
    info = f"{dist}-{version}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: gpuops\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for k, v in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b"=").decode()
        record.append(f"{k},sha256={digest},{len(v)}")
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    os.replace(tmp, path)
    return path


def run_all(uv: str, runs: list[Run], work: Path, *, timeout_s: float, offline: bool) -> dict[str, Outcome]:
    """Run every uv command at once (each in its own folder with its files), each given until `timeout_s`; a run
    still going then is stopped (its whole process group) and reported without an exit code."""
    env = {**os.environ, **UV_ENV, "UV_CACHE_DIR": str(cache_dir())}
    env.pop("UV_OFFLINE", None)
    started = {}
    for r in runs:
        folder = work / r.key
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in r.files.items():
            (folder / name).write_text(text, encoding="utf-8")
        argv = [uv, *r.argv] + (["--offline"] if offline else [])
        proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        started[r.key] = (r, proc, time.monotonic())
    deadline = time.monotonic() + max(0.1, timeout_s)
    out = {}
    for key, (r, proc, t0) in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=max(0.05, deadline - time.monotonic()))
            rc: Optional[int] = proc.returncode
        except subprocess.TimeoutExpired:
            _stop(proc)
            stdout, stderr = proc.communicate()
            rc = None
        text = None
        if r.output and rc == 0:
            try:
                text = (work / key / r.output).read_text(encoding="utf-8")
            except OSError:
                text = None
        out[key] = Outcome(rc, stdout or "", stderr or "", text, time.monotonic() - t0, online=not offline,
                           sizes=local_sizes(text or ""))
    return out


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=2)
    except (ProcessLookupError, PermissionError):
        return
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def local_sizes(text: str) -> dict[str, int]:
    """Bytes of each local wheel (file:// URL) a pylock.toml names: uv writes no size for them."""
    import re
    from urllib.parse import unquote, urlparse

    out = {}
    for url in set(re.findall(r'url = "(file://[^"]+)"', text)):
        try:
            out[url] = os.path.getsize(unquote(urlparse(url).path))
        except OSError:
            continue
    return out
