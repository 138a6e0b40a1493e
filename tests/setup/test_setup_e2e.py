"""gpuops setup end to end through the sandbox: from no environment to a passing verify, idempotence, re-attach."""
from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import yaml

from support.indexes import make_wheel
from support.proxy import Proxy
from support.runs import remote_project
from support.envs import LOCAL_INDEX, SlowIndex, fresh_env, home, set_profile


def test_setup_from_nothing_to_verify_then_nothing_to_do(sandbox, gpuops):
    py = fresh_env(sandbox, "senv-req")
    set_profile(sandbox, python=py, expect={"packages": {"six": "1.17.0"}},
                setup={"index_url": LOCAL_INDEX, "install_uv": False})
    Path("requirements.txt").write_text("six==1.17.0\n")
    Path("train.py").write_text("import six\nprint('six', six.__version__)\n")
    assert gpuops("sync", "-p", "sandbox").code == 0

    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 0, r.all
    assert "1. create the environment ~/senv-req" in r.out and "2. install -r requirements.txt (uv)" in r.out
    assert ("does not exist (uv venv --system-site-packages)" in r.out) or \
        ("does not exist (python3 -m venv --system-site-packages)" in r.out)
    assert "project index: file:///opt/pypi/simple" in r.out and "disk: about" in r.out
    assert not (home(sandbox) / "senv-req").exists()  # a dry run changes nothing

    r = gpuops("setup", "sandbox")
    assert r.code == 0, r.all
    assert "create the environment" in r.err and "every step done" in r.err
    assert "PASS  six: 1.17.0" in r.out  # verify ran after the steps
    assert (home(sandbox) / "senv-req" / "bin" / "python").exists()
    assert (remote_project(sandbox) / ".gpuops" / "setup" / "done.json").is_file()

    r = gpuops("setup", "sandbox", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert doc["plan"]["nothing_to_do"] and doc["executions"] == 1 and not doc["ran"]
    r = gpuops("setup", "sandbox")
    assert "already matches the profile: nothing installed (1 remote execution)" in r.err

    # the project's requirements change: only that step runs again
    Path("requirements.txt").write_text("six==1.17.0\nidna\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--dry-run", "--json")
    steps = [s["id"] for s in json.loads(r.out)["plan"]["steps"]]
    assert steps == ["deps"], steps

    # the job's python is the environment's
    r = gpuops("train", "--script", "train.py", "--no-sync", "--no-snapshot")
    assert r.code == 0, r.all


def test_a_system_python_is_a_profile_error_and_no_python_gets_setups_environment(sandbox, gpuops):
    set_profile(sandbox, python="python3")
    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 2 and "installs nothing into a system Python" in r.err, r.all
    assert "python: ~/.venvs/gpuops/bin/python" in r.err  # the fix names the environment setup would make
    # no python: at all (what `gpuops up` writes): setup makes ~/.venvs/gpuops and records it in the profile
    data = yaml.safe_load(sandbox["profile"].read_text())
    data.pop("python")
    data["setup"] = {"index_url": LOCAL_INDEX}
    sandbox["profile"].write_text(yaml.safe_dump(data))
    shutil.rmtree(home(sandbox) / ".venvs" / "gpuops", ignore_errors=True)
    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 0 and "1. create the environment ~/.venvs/gpuops" in r.out, r.all
    assert "python" not in yaml.safe_load(sandbox["profile"].read_text())  # a dry run writes nothing
    r = gpuops("setup", "sandbox", "--no-verify")
    assert r.code == 0, r.all
    assert yaml.safe_load(sandbox["profile"].read_text())["python"] == "~/.venvs/gpuops/bin/python"
    assert (home(sandbox) / ".venvs" / "gpuops" / "pyvenv.cfg").read_text().count("include-system-site-packages = true")


def test_a_base_python_the_host_lacks_is_refused_and_does_not_hide_the_project(sandbox, gpuops):
    """setup.base_python naming an interpreter the host does not have (or a host without python3) used to make the
    environment from whatever uv found, skip the project's requirements ("sync the project first", though it was
    synced: the files are read by the base python) and end with `ok`."""
    py = fresh_env(sandbox, "senv-nobase")
    set_profile(sandbox, python=py, setup={"index_url": LOCAL_INDEX, "base_python": "python3.99"})
    Path("requirements.txt").write_text("six==1.17.0\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox", "--dry-run")
    assert r.code == 0 and "CANNOT START: python3.99 is not on the host" in r.out, r.all
    assert "setup installs no project dependencies" not in r.all  # it was synced: no python there could read it
    r = gpuops("setup", "sandbox")
    assert r.code == 1, r.all
    assert "setup cannot start on sandbox: python3.99 is not on the host" in r.err and "nothing was installed" in r.err
    assert "setup.base_python" in r.err  # the hint names the key to fix
    assert not (home(sandbox) / "senv-nobase").exists()
    # the environment exists: the project's files are still read (by the environment's python) and installed
    set_profile(sandbox, setup={"index_url": LOCAL_INDEX, "base_python": "python3"})
    assert gpuops("setup", "sandbox", "--no-verify").code == 0
    Path("requirements.txt").write_text("six==1.17.0\nidna\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    set_profile(sandbox, setup={"index_url": LOCAL_INDEX, "base_python": "python3.99"})
    r = gpuops("setup", "sandbox", "--dry-run", "--json")
    assert [s["id"] for s in json.loads(r.out)["plan"]["steps"]] == ["deps"], r.all


def test_dropped_connection_during_a_long_step_is_reattached(sandbox, gpuops, tmp_path):
    index = SlowIndex(tmp_path / "index", delay=6)
    proxy = Proxy(sandbox["port"])
    try:
        index.add(make_wheel(tmp_path, "gpuops-slowpkg", "1.0", "VALUE = 42\n"), "gpuops-slowpkg")
        py = fresh_env(sandbox, "senv-slow")
        data = set_profile(sandbox, python=py, expect={"packages": {"gpuops-slowpkg": "1.0"}},
                           setup={"index_url": index.url, "install_uv": False})
        Path(sandbox["profile"]).with_name("viaproxy.yaml").write_text(yaml.safe_dump(dict(data, port=proxy.port)))
        Path("requirements.txt").write_text("gpuops-slowpkg==1.0\n")
        assert gpuops("sync", "-p", "sandbox").code == 0
        log = remote_project(sandbox) / ".gpuops" / "setup" / "log"

        def cut_when_installing():
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if log.exists() and "deps install -r requirements.txt" in log.read_text():
                    time.sleep(1.0)
                    proxy.cut_all()
                    return
                time.sleep(0.1)

        cutter = threading.Thread(target=cut_when_installing)
        cutter.start()
        r = gpuops("setup", "-p", "viaproxy")
        cutter.join()
        assert r.code == 3, r.all
        assert "setup goes on running on the host" in r.err and "run `gpuops setup` again to re-attach" in r.err
        assert "@@done" not in log.read_text()  # the step was still running when the connection dropped

        r = gpuops("setup", "-p", "sandbox")
        assert r.code == 0, r.all
        assert "a setup is already running on sandbox: re-attaching" in r.err
        assert "every step done" in r.err and "PASS  gpuops-slowpkg: 1.0" in r.out
        assert "@@done" in log.read_text()
        assert gpuops("setup", "-p", "sandbox", "--json").code == 0  # and now it matches
    finally:
        proxy.close()
        index.close()


FAKE_TORCH = '''"""A tiny real package named torch: a CPU-only build as far as gpuops can tell."""
__version__ = "2.13.0+cpu"


class version:
    cuda = None


class cuda:
    @staticmethod
    def is_available():
        return False

    @staticmethod
    def device_count():
        return 0

    @staticmethod
    def init():
        raise RuntimeError("Torch not compiled with CUDA enabled")

    @staticmethod
    def is_bf16_supported():
        return False


class backends:
    class cudnn:
        @staticmethod
        def version():
            return None
'''


def test_torch_pinned_from_the_profiles_cpu_index_and_verify_names_the_cpu_build(sandbox, gpuops, tmp_path):
    """setup.torch_index (a file:// CPU index) is where torch comes from, pinned by expect.packages; verify then
    fails honestly: a CPU-only torch on a host whose nvidia-smi lists a GPU; train refuses it, --force launches."""
    idx = tmp_path / "cpu"
    for version in ("2.12.0+cpu", "2.13.0+cpu"):
        whl = make_wheel(tmp_path, "torch", version, FAKE_TORCH.replace("2.13.0+cpu", version))
        d = idx / "simple" / "torch"
        d.mkdir(parents=True, exist_ok=True)
        (idx / "files").mkdir(exist_ok=True)
        shutil.copy(whl, idx / "files" / whl.name)
    (idx / "simple" / "torch" / "index.html").write_text("".join(
        f'<a href="../../files/{p.name}">{p.name}</a>\n' for p in sorted((idx / "files").iterdir())))
    py = fresh_env(sandbox, "senv-torch")
    set_profile(sandbox, python=py, expect={"packages": {"torch": "2.12.0"}},
                setup={"torch_index": f"file://{idx}/simple", "install_uv": False})
    r = gpuops("setup", "sandbox", "--dry-run", "--json")
    plan = json.loads(r.out)["plan"]
    assert [s["id"] for s in plan["steps"]] == ["environment", "torch"]
    assert plan["torch_index"] == f"file://{idx}/simple" and "torch==2.12.0" in plan["steps"][1]["command"]

    r = gpuops("setup", "sandbox")
    assert r.code == 1, r.all  # the steps ran; verify fails
    assert "every step done" in r.err
    assert "FAIL  torch CUDA build: torch 2.12.0+cpu is a CPU-only build" in r.out
    assert "PASS  torch: 2.12.0+cpu" in r.out  # the pinned version, not the newest on the index (2.13.0+cpu)
    assert gpuops("setup", "sandbox", "--json").code == 0  # a CPU index is what the profile asked for: nothing to do

    Path("t.py").write_text("import torch\nprint('torch', torch.__version__)\n")
    r = gpuops("train", "--script", "t.py", "--no-snapshot")
    assert r.code == 1 and "torch CUDA build: torch 2.12.0+cpu is a CPU-only build" in r.err, r.all
    r = gpuops("train", "--script", "t.py", "--no-snapshot", "--force")
    assert r.code == 0, r.all
