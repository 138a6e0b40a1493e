"""Setup installs exactly what the local plan resolved (issue 34), on a host whose image is the emulated Lambda Stack
(its python3 carries images.yaml's packages as installed distributions), from a company index over HTTPS that holds
the same metadata-only wheels the local resolution used (tests/support/wheels.py).

`torchvision` unpinned in requirements.txt: pip alone takes torchvision 0.29.2 and, for it, torch 2.14.1 with its
CUDA 13 runtime over the image's torch; with the plan's pins, torchvision 0.24.0 and the image's torch stay."""
from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path

import pytest

from gpuops.console import Output
from gpuops.project import images
from gpuops.project.resolve import ResolveRequest, resolve
from gpuops.sandbox import host
from gpuops.sandbox import image as sandbox_image
from support.indexes import TlsIndex


@pytest.fixture(scope="session")
def lambda_stack(tmp_path_factory):
    """The emulated Lambda Stack image's python3, built once per session (worker)."""
    return sandbox_image.build(tmp_path_factory.mktemp("image") / "lambda-stack", "lambda-stack")


@pytest.fixture
def image_host(starts_hosts, wheel_index, lambda_stack):
    """A sandbox host whose python3 is the emulated Lambda Stack image, its pip.conf naming an HTTPS index (its own
    CA) that serves the local resolution's wheels."""
    index = TlsIndex(starts_hosts / "index")
    for whl in sorted(wheel_index.glob("*.whl")):
        index.add(whl, whl.name.split("-")[0].replace("_", "-").lower())
    py = lambda_stack
    st = host.start(starts_hosts / "host", address=host.AUTO, image_python=str(py), profile="lstack")
    conf = Path(st["dir"]) / "home" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"[global]\nindex-url = {index.url}\ncert = {index.ca}\ntimeout = 20\n")
    yield {"state": st, "python": py, "index": index}
    index.close()


def env_packages(st, python: str = "~/.venvs/gpuops/bin/python") -> dict[str, str]:
    home = Path(st["dir"]) / "home"
    py = str(home / python[2:]) if python.startswith("~/") else python
    r = subprocess.run([py, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True,
                       env={"HOME": str(home), "PATH": "/usr/bin:/bin", "PYTHONNOUSERSITE": "1"})
    assert r.returncode == 0, r.stderr
    return {p["name"].lower(): p["version"] for p in json.loads(r.stdout)}


def test_the_emulated_image_carries_images_yaml_packages(image_host):
    have = env_packages(image_host["state"], str(image_host["python"]))
    row = images.image_for(images.load(), "lambda-stack-22-04")
    for name, version in row.packages.items():
        assert have.get(name) == version, (name, have)


def run_setup(gpuops, resolution=None) -> dict:
    from gpuops.profiles import model
    from gpuops.setup.apply import setup

    assert gpuops("sync", "-p", "lstack").code == 0
    err = io.StringIO()
    doc = setup(model.resolve("lstack"), Output(stdout=io.StringIO(), stderr=err), Path.cwd(), verify=False,
                resolution=resolution)
    assert doc["rc"] == 0, err.getvalue()
    return doc


def test_setup_installs_the_resolved_pins_and_keeps_the_image_torch(image_host, gpuops, wheel_index):
    Path("requirements.txt").write_text("torchvision\n")
    st = image_host["state"]
    # the local plan: resolved here, offline, for the image
    row = images.image_for(images.load(), "lambda-stack-22-04")
    res = resolve(ResolveRequest(("torchvision",), ("--no-index", f"--find-links {wheel_index}")), row)
    assert res.packages == {"torchvision": "0.24.0"} and res.replaces_image == [("torch", "2.9.0+cu128", "2.14.1")]
    doc = run_setup(gpuops, res.to_dict())
    assert "torchvision==0.24.0" in doc["plan"]["pins"]
    have = env_packages(st)
    assert have["torchvision"] == "0.24.0"
    assert have["torch"] == "2.9.0+cu128"  # the image's: nothing installed over it
    assert "nvidia-cuda-runtime" not in have and "nvidia-cuda-runtime-cu12" not in have


def test_without_the_plan_pip_replaces_the_image_torch(image_host, gpuops):
    """The control: the same project, setup as before the plan (no pins): what the plan's fix is about."""
    Path("requirements.txt").write_text("torchvision\n")
    run_setup(gpuops)
    have = env_packages(image_host["state"])
    # a newer torchvision, and the torch it pins installed over the image's (which release depends on this
    # machine's own pip constraints, which the sandbox host shares: /etc/xdg/pip here caps torchvision)
    assert have["torchvision"] != "0.24.0" and have["torch"] not in ("2.9.0+cu128", "2.9.0")
    assert any(n.startswith("nvidia-cuda-runtime") for n in have)
