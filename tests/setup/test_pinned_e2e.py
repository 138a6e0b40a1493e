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
from gpuops.project.resolution import resolve
from gpuops.project.uvcmd import ResolveRequest
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


# -- a package that builds against torch (OpenRLHF's flash-attn==2.8.3 in requirements.txt) --------------------------
BACKEND = '''"""An in-tree build backend that imports torch to build, as flash-attn's setup.py does."""
import base64, hashlib, os, zipfile


def _torch():
    import torch
    return torch.__version__


def get_requires_for_build_wheel(config_settings=None):
    _torch()
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    built = _torch()
    name = "flash_attn-2.8.3-py3-none-any.whl"
    info = "flash_attn-2.8.3.dist-info"
    files = {"flash_attn/__init__.py": ("BUILT_AGAINST = %r\\n" % built).encode(),
             info + "/METADATA": b"Metadata-Version: 2.1\\nName: flash-attn\\nVersion: 2.8.3\\n",
             info + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    rec = ["%s,sha256=%s,%d" % (k, base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b"=").decode(), len(v))
           for k, v in files.items()] + [info + "/RECORD,,"]
    files[info + "/RECORD"] = ("\\n".join(rec) + "\\n").encode()
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return name
'''


def flash_attn_sdist(folder: Path) -> Path:
    """flash_attn-2.8.3.tar.gz: static metadata (a resolution reads it without building), a build that needs torch."""
    import tarfile

    src = folder / "flash_attn-2.8.3"
    src.mkdir(parents=True)
    (src / "PKG-INFO").write_text("Metadata-Version: 2.2\nName: flash-attn\nVersion: 2.8.3\n")
    (src / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                        'backend-path = ["."]\n')
    (src / "backend.py").write_text(BACKEND)
    out = folder / "flash_attn-2.8.3.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=src.name)
    return out


@pytest.fixture
def sdist_host(starts_hosts, lambda_stack):
    """The image host, its pip.conf naming an index that has flash-attn 2.8.3 as an sdist only."""
    index = TlsIndex(starts_hosts / "sdist-index")
    sdist = flash_attn_sdist(starts_hosts / "src")
    index.add(sdist, "flash-attn")
    st = host.start(starts_hosts / "host", address=host.AUTO, image_python=str(lambda_stack), profile="lstack")
    conf = Path(st["dir"]) / "home" / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"[global]\nindex-url = {index.url}\ncert = {index.ca}\ntimeout = 20\n")
    yield {"state": st, "index": index, "sdist": sdist}
    index.close()


def test_flash_attn_in_requirements_builds_against_the_image_torch_as_the_plan_said(sdist_host, gpuops):
    Path("requirements.txt").write_text("flash-attn==2.8.3\n")
    # this project's builds.yaml: flash-attn's prebuilt wheel URL on the test index (not published there: the
    # fallback is taken), so nothing reaches the internet
    Path("playbooks").mkdir()
    Path("playbooks/builds.yaml").write_text(
        "builds:\n  - name: flash-attn\n    build: no-build-isolation\n    build_requires: []\n"
        f"    wheel: \"{sdist_host['index'].url.replace('/simple/', '/files/')}flash_attn-{{version}}+cu{{cuda_major}}"
        "torch{torch_mm}cxx11abi{abi}-{py}-{py}-linux_{machine}.whl\"\n    source: test\n")
    row = images.image_for(images.load(), "lambda-stack-22-04")
    res = resolve(ResolveRequest(("flash-attn==2.8.3",), ("--no-index", f"--find-links {sdist_host['sdist'].parent}")),
                  row)
    assert res.packages == {"flash-attn": "2.8.3"}, res.why
    (build,) = res.builds
    assert build["how"] == "wheel" and "else built with --no-build-isolation against the image's torch" in build["why"]
    doc = run_setup(gpuops, res.to_dict())
    assert [s["id"] for s in doc["plan"]["steps"]][-2:] == ["build-flash-attn", "deps"]
    log = (Path(sdist_host["state"]["dir"]) / "home" / Path.cwd().name / ".gpuops" / "setup" / "log").read_text()
    assert "trying the prebuilt wheel https://127.0.0.1" in log
    assert "no prebuilt wheel for torch 2.9 cu12" in log and "abi=TRUE: building flash-attn==2.8.3" in log
    have = env_packages(sdist_host["state"])
    assert have["flash-attn"] == "2.8.3" and have["torch"] == "2.9.0+cu128"


def test_flash_attn_built_in_isolation_fails_and_the_summary_names_it(sdist_host, gpuops):
    """The control, setup as before the plan: pip builds the sdist in an isolated environment without torch."""
    from gpuops.errors import ChecksFailed

    Path("requirements.txt").write_text("flash-attn==2.8.3\n")
    with pytest.raises(ChecksFailed) as got:
        run_setup(gpuops)
    assert "at step deps (exit 1): flash-attn builds against torch, and the installer built it in an isolated " \
           "environment that has no torch" in got.value.message
    assert got.value.hint.startswith("install flash-attn after torch with --no-build-isolation")
