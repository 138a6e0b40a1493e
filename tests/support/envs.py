"""The sandbox host set up for a test: its home, its profile changed, Python environments made or removed on it,
package indexes (a local folder, a slow HTTP one) its pip and uv install from."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from support.indexes import make_wheel


LOCAL_INDEX = "file:///opt/pypi/simple"  # this machine kind's local package index (pip config: extra-index-url)


def home(sandbox) -> Path:
    return Path(sandbox["dir"]) / "home"


def set_profile(sandbox, **changes) -> dict:
    data = yaml.safe_load(sandbox["profile"].read_text())
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(data.get(k), dict):
            data[k].update(v)
        else:
            data[k] = v
    sandbox["profile"].write_text(yaml.safe_dump(data))
    return data


def fresh_env(sandbox, name: str) -> str:
    shutil.rmtree(home(sandbox) / name, ignore_errors=True)
    return f"~/{name}/bin/python"


class SlowIndex:
    """A PEP 503 index on 127.0.0.1 whose wheel downloads take `delay` seconds: a long install step."""

    def __init__(self, folder: Path, delay: float):
        import http.server
        import socketserver

        self.folder, self.delay = folder, delay
        index = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *a, **kw):
                super().__init__(*a, directory=str(index.folder), **kw)

            def do_GET(self):
                if self.path.endswith(".whl"):
                    time.sleep(index.delay)
                super().do_GET()

            def log_message(self, *a):
                pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, whl: Path, project: str) -> None:
        d = self.folder / "simple" / project
        d.mkdir(parents=True, exist_ok=True)
        (self.folder / "files").mkdir(exist_ok=True)
        shutil.copy(whl, self.folder / "files" / whl.name)
        (d / "index.html").write_text(f'<html><body><a href="../../files/{whl.name}">{whl.name}</a></body></html>\n')

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


# -- setup: the host's several indexes through uv, and the cause of a failure in its summary -------------------------
def file_index(folder: Path, name: str, version: str) -> str:
    """A PEP 503 simple index in a folder (file://), holding one version of one package."""
    whl = make_wheel(folder / "files", name, version, f"VALUE = {version!r}\n")
    page = folder / "simple" / name
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<html><body><a href="../../files/{whl.name}">{whl.name}</a></body></html>\n')
    return f"file://{folder}/simple"


def crafted_python(sandbox, name: str, packages: dict[str, str], modules: dict[str, str] | None = None) -> str:
    """A venv on the sandbox host (no pip) whose installed packages are dist-info metadata only."""
    venv = Path(sandbox["dir"]) / "home" / name
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    for pkg, version in packages.items():
        d = site / f"{pkg.replace('-', '_')}-{version}.dist-info"
        d.mkdir()
        (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {pkg}\nVersion: {version}\n")
    for mod, text in (modules or {}).items():
        (site / f"{mod}.py").write_text(text)
    return str(venv / "bin" / "python")


def profile_from_sandbox(sandbox, name: str, **over) -> Path:
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.update(over)
    path = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
