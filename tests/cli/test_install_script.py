"""Issue #36: scripts/install-system-deps.sh over an existing uv environment (GPUOPS_UV_VENV) that another python
made, or whose python is gone (run first from a pyenv python, then from a shell whose python3 is the system's, or
after `pyenv uninstall`): the environment is made anew, never Python's own `ensurepip` error; a folder there that is
no virtual environment is refused, naming it. The real script, run by bash, with a local wheel of a stand-in `uv`
(no network); two real Python installations: this one's, and an image interpreter built from it (sandbox/image.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from support import ROOT  # noqa: E402 - the repository
SCRIPT = ROOT / "scripts" / "install-system-deps.sh"


def _uv_wheel(folder: Path) -> None:
    """A wheel named uv whose only file is a `uv` script (as the real wheel's data/scripts/uv binary)."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = "uv-0.0.1.dist-info"
    files = {"uv-0.0.1.data/scripts/uv": "#!/bin/sh\necho 'uv 0.0.1 (stand-in)'\n",
             "uv-0.0.1.data/scripts/uvx": "#!/bin/sh\necho 'uvx 0.0.1 (stand-in)'\n",
             f"{dist}/METADATA": "Metadata-Version: 2.1\nName: uv\nVersion: 0.0.1\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: gpuops-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(folder / "uv-0.0.1-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            info = zipfile.ZipInfo(path)
            info.create_system = 3  # Unix: the mode below counts
            info.external_attr = (0o100000 | (0o755 if "/scripts/" in path else 0o644)) << 16  # S_IFREG  # pip keeps a script's x bit
            z.writestr(info, text)
        z.writestr(f"{dist}/RECORD", "".join(f"{p},,\n" for p in [*files, f"{dist}/RECORD"]))


def _python_bin(tmp: Path, name: str, python: Path) -> Path:
    """The folder of the installation's python3, first on PATH: the shell's python3 (`python3 -m venv` then names
    that folder as the environment's home, as pyenv's or /usr/bin would be)."""
    d = Path(python).parent
    assert (d / "python3").exists(), d
    return d


def _run(tmp: Path, python_bin: Path, venv: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    bin_dir.mkdir(parents=True, exist_ok=True)
    env = {"HOME": os.environ["HOME"], "PATH": f"{python_bin}:{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin",
           "GPUOPS_UV_VENV": str(venv), "GPUOPS_BIN_DIR": str(bin_dir), "PIP_NO_INDEX": "1",
           "PIP_FIND_LINKS": str(tmp / "wheels"), "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for tool in ("sshd", "ssh", "ssh-keygen", "rsync"):
        assert shutil.which(tool, path=env["PATH"]) or tool == "sshd", f"{tool} is missing: the script would apt-get it"
    assert not shutil.which("uv", path=env["PATH"])
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)


def _image(tmp: Path, name: str) -> Path:
    from gpuops.sandbox import image

    return image.build(tmp / name)


def test_an_environment_whose_python_is_gone_is_made_anew(tmp_path, dist_python):
    _uv_wheel(tmp_path / "wheels")
    first = _image(tmp_path, "pyenv-3.x")  # a python that is uninstalled afterwards
    venv = tmp_path / "gpuops-uv"
    r = _run(tmp_path, _python_bin(tmp_path, "first", first), venv, tmp_path / "bin1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert subprocess.run([str(tmp_path / "bin1" / "uv")], capture_output=True, text=True).stdout.startswith("uv 0.0.1")
    shutil.rmtree(tmp_path / "pyenv-3.x")  # `pyenv uninstall`: the environment's python is gone
    system = base_of(dist_python)
    r = _run(tmp_path, _python_bin(tmp_path, "second", system), venv, tmp_path / "bin2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ensurepip" not in r.stderr and "Errno" not in r.stderr, r.stderr
    assert f"{venv} does not work with this python3" in r.stdout + r.stderr and "making it anew" in r.stdout + r.stderr
    assert subprocess.run([str(tmp_path / "bin2" / "uv")], capture_output=True, text=True).stdout.startswith("uv 0.0.1")
    assert Path(os.path.realpath(venv / "bin" / "python3")).exists()


def test_an_environment_another_python_made_is_made_anew(tmp_path, dist_python):
    """The issue's case: a venv from one python installation, then `python3 -m venv` from another (different
    version) failed in ensurepip. The second installation is the system's python3 when it differs from this one."""
    _uv_wheel(tmp_path / "wheels")
    first = _image(tmp_path, "pyenv-python")
    second = _other_python(first, base_of(dist_python))
    venv = tmp_path / "gpuops-uv"
    assert _run(tmp_path, _python_bin(tmp_path, "first", first), venv, tmp_path / "bin1").returncode == 0
    (tmp_path / "bin1" / "uv").unlink()  # this shell does not find uv: the script runs again
    r = _run(tmp_path, _python_bin(tmp_path, "second", second), venv, tmp_path / "bin2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ensurepip" not in r.stderr, r.stderr
    assert subprocess.run([str(tmp_path / "bin2" / "uv")], capture_output=True, text=True).stdout.startswith("uv 0.0.1")


def test_a_folder_that_is_no_environment_is_refused_naming_it(tmp_path, dist_python):
    _uv_wheel(tmp_path / "wheels")
    venv = tmp_path / "gpuops-uv"
    venv.mkdir()
    (venv / "notes.txt").write_text("mine\n")
    r = _run(tmp_path, _python_bin(tmp_path, "p", base_of(dist_python)), venv, tmp_path / "bin")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{venv} exists and is not a virtual environment" in r.stderr and "GPUOPS_UV_VENV" in r.stderr, r.stderr
    assert (venv / "notes.txt").read_text() == "mine\n"  # never removed


def base_of(python: str) -> Path:
    """The Python installation a venv's python was made from (its real executable)."""
    out = subprocess.run([python, "-c", "import os, sys; print(os.path.realpath(sys._base_executable))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def _other_python(first: Path, also: Path) -> Path:
    import sys

    mine = subprocess.run([str(first), "-c", "import sys; print(sys.version)"], capture_output=True,
                          text=True).stdout
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", str(also), sys.executable):
        if Path(cand).exists():
            other = subprocess.run([cand, "-c", "import sys; print(sys.version)"], capture_output=True,
                                   text=True).stdout
            if other and other != mine:
                return Path(cand)
    raise AssertionError("this test needs a second Python installation of another version (the system's "
                         "/usr/bin/python3 beside uv's or pyenv's): install python3")
