"""The resolution for an image through the real uv, offline against a local index of metadata-only wheels
(tests/support/wheels.py), which behaves as PyPI does for the packages that matter: each torchvision pins its torch,
torch's PyPI builds pull their CUDA runtime wheels, a trainer's newest release needs a newer torch."""
from __future__ import annotations

import socket
import subprocess
import time

import pytest

from gpuops.project import images
from gpuops.project.resolution import resolve
from gpuops.project.uvcmd import ResolveRequest


@pytest.fixture
def image():
    return images.image_for(images.load(), "lambda-stack-22-04")


@pytest.fixture
def local(wheel_index):
    """Index lines as a requirements file gives them: only the local folder, never the internet."""
    return ("--no-index", f"--find-links {wheel_index}")


def test_unpinned_torchvision_is_fixed_to_the_image_torch_and_said(image, local):
    r = resolve(ResolveRequest(("torch>=2.6", "torchvision"), local), image)
    assert r.available and r.refusal is None, r.why
    # setup installs torchvision 0.24.0 only: torch and numpy are the image's
    assert r.packages == {"torchvision": "0.24.0"}
    assert r.replaces_image == [("torch", "2.9.0+cu128", "2.14.1")]
    said = " ".join(r.fixes)
    assert "torchvision 0.24.0 matches the image's torch 2.9.0+cu128" in said
    assert "pip alone would take torchvision 0.29.2, which comes with torch 2.14.1" in said
    assert "CUDA 13.0 libraries" in said and "CUDA 13.0 needs driver 580 or newer" in said
    # what setup installs with: every resolved version, the image's torch among them
    pins = r.pins().splitlines()
    assert "torchvision==0.24.0" in pins and "torch==2.9.0+cu128" in pins and "numpy==1.21.5" in pins
    assert r.install_bytes and r.install_bytes < 10_000  # one metadata-only wheel
    assert r.seconds < 10


def test_a_direct_torch_pin_is_refused_without_uv_or_network(image, monkeypatch):
    monkeypatch.setenv("GPUOPS_UV", "/nonexistent/uv")  # no resolver at all: the files decide
    r = resolve(ResolveRequest(("torch==2.10", "numpy"), ("--index-url https://pypi.org/simple",)), image)
    assert r.refusal is not None
    message, fix = r.refusal
    assert "`torch==2.10`" in message and "2.9.0+cu128" in message
    assert "drop the pin" in fix and 'expect.packages: {torch: "2.10"}' in fix


def test_a_package_whose_newest_release_needs_a_newer_torch_is_refused_with_the_pin_that_works(image, local):
    r = resolve(ResolveRequest(("bigtrainer>=2",), local), image)
    assert r.available and r.refusal is not None and not r.packages
    message, fix = r.refusal
    assert "no resolution of the project's requirements keeps the image's torch 2.9.0+cu128" in message
    assert "bigtrainer>=2.0.0 depends on torch>=2.11" in message
    assert "pip alone would install torch 2.14.1" in message
    assert fix == "pin bigtrainer==1.0.0 (its newest release that works with the image's torch 2.9.0+cu128)"


def test_an_unpinned_package_held_back_is_said(image, local):
    r = resolve(ResolveRequest(("bigtrainer",), local), image)
    assert r.refusal is None and r.packages == {"bigtrainer": "1.0.0"}
    assert any("bigtrainer 1.0.0 works with the image's torch" in f and "bigtrainer 2.0.0" in f for f in r.fixes)


def test_no_release_fits_the_image_torch(image, local):
    r = resolve(ResolveRequest(("newonly", "numpy"), local), image)
    assert r.refusal is not None
    assert r.refusal[1].startswith("no release of newonly works with the image's torch 2.9.0+cu128")
    assert 'expect.packages: {torch: "2.14.1"}' in r.refusal[1]


def test_a_transitive_torch_requirement_is_kept_quietly(image, local):
    """tensordict requires `torch` (any) and orjson: the image's torch satisfies it; orjson comes with it."""
    r = resolve(ResolveRequest(("tensordict",), local), image)
    assert r.packages == {"tensordict": "0.10.0", "orjson": "3.13.0"}
    assert r.replaces_image == [] and r.fixes == [] and r.refusal is None
    assert r.resolved["orjson"] == "3.13.0" and r.resolved["torch"] == "2.9.0+cu128"


def test_packages_that_build_against_torch_get_a_wheel_or_a_plain_build(image, local):
    r = resolve(ResolveRequest(("torch", "flash-attn==2.8.3", "deepspeed==0.19.5"), local), image)
    assert r.refusal is None, r.refusal
    builds = {b["name"]: b for b in r.builds}
    fa = builds["flash-attn"]
    assert fa["how"] == "wheel" and fa["then"] == "no-build-isolation"
    assert fa["url"].endswith("/v2.8.3/flash_attn-2.8.3+cu12torch2.9cxx11abiTRUE-cp310-cp310-linux_x86_64.whl")
    assert "--no-build-isolation against the image's torch 2.9.0+cu128" in fa["why"]
    assert builds["deepspeed"]["how"] == "isolated"
    assert "einops" in r.packages and "flash-attn" in r.packages


def test_a_package_the_local_indexes_lack_falls_back_never_refuses(image, local):
    """The instance may have an index of its own (its pip.conf): not finding a package here is no refusal."""
    r = resolve(ResolveRequest(("company-internal-lib==1.0", "torch"), local), image)
    assert not r.available and r.refusal is None
    assert "company-internal-lib is not on the package indexes this machine uses" in r.why


def test_an_unreachable_index_falls_back_quickly(image):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    t0 = time.monotonic()
    r = resolve(ResolveRequest(("orjson",), (f"--index-url http://127.0.0.1:{port}/simple",)), image, timeout_s=15)
    assert not r.available and r.refusal is None
    assert "cannot reach the package index" in r.why and "Connection refused" in r.why
    assert time.monotonic() - t0 < 15


def test_an_index_that_never_answers_is_bounded_by_the_timeout(image):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)  # accepts connections, answers nothing
        port = s.getsockname()[1]
        t0 = time.monotonic()
        r = resolve(ResolveRequest(("orjson",), (f"--index-url http://127.0.0.1:{port}/simple",)), image,
                    timeout_s=3)
        took = time.monotonic() - t0
    assert not r.available and "did not finish within" in r.why
    assert took < 6


def test_no_uv_falls_back(image, local, monkeypatch):
    monkeypatch.setenv("GPUOPS_UV", "/nonexistent/uv")
    r = resolve(ResolveRequest(("orjson",), local), image)
    assert not r.available and "uv is not on this machine" in r.why


def test_a_uv_lock_is_exported_not_resolved(image, wheel_index, tmp_path):
    """The lock decides torch (open-instruct's shape): said, never refused."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text(
        '[project]\nname = "p"\nversion = "0.1"\nrequires-python = ">=3.10"\n'
        'dependencies = ["torch==2.10.0", "orjson"]\n'
        f'[tool.uv]\nno-index = true\nfind-links = ["{wheel_index}"]\n')
    env = {"UV_PYTHON_DOWNLOADS": "never", "UV_CACHE_DIR": str(tmp_path / "uvc"), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    import os
    import shutil

    env["PATH"] = os.path.dirname(shutil.which("uv")) + ":" + env["PATH"]
    subprocess.run(["uv", "lock", "--offline", "--python", __import__("sys").executable], cwd=proj, env=env,
                   check=True, capture_output=True)
    r = resolve(ResolveRequest((), (), lock=str(proj / "uv.lock")), image)
    assert r.available and r.refusal is None, r.why
    assert r.packages["torch"] == "2.10.0" and r.packages["orjson"] == "3.13.0"
    assert r.replaces_image == [("torch", "2.9.0+cu128", "2.10.0")]
    assert "uv.lock pins torch 2.10.0" in r.fixes[0]


def test_gh200_resolves_for_aarch64(wheel_index):
    gh = images.image_for(images.load(), "lambda-stack-24-04", "arm64")
    assert gh.platform == "aarch64-manylinux_2_39" and gh.python == "3.12.3"
    r = resolve(ResolveRequest(("tensordict",), ("--no-index", f"--find-links {wheel_index}")), gh)
    assert r.available and r.packages["tensordict"] == "0.10.0"
    # no torch recorded for this image: nothing is kept, so torch is resolved like any requirement
    assert r.packages["torch"] == "2.14.1"
