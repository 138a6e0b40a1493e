"""Built-in playbooks and example profiles work from an installed wheel, not only from the repository."""
import shutil
import subprocess
import sys
import zipfile
from support import ROOT


def test_wheel_carries_playbooks_profiles_and_probe(tmp_path):
    uv = shutil.which("uv")
    assert uv, "uv is needed to build the wheel (scripts/install-system-deps.sh installs it)"
    subprocess.run([uv, "build", "--wheel", "-o", str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("gpuops-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in ("gpuops/_data/playbooks/verify.yaml", "gpuops/_data/playbooks/knowledge.yaml",
                   "gpuops/_data/playbooks/presets.yaml", "gpuops/_data/playbooks/rules.yaml",
                   "gpuops/_data/playbooks/signals.yaml", "gpuops/_data/profiles/lambda-h100.yaml",
                   "gpuops/remote/probe.py", "gpuops/sandbox/nvidia_smi.py"):
        assert needed in names, needed
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import gpuops, sys; from gpuops import knowledge; from gpuops.profiles import model as profiles;"
            "assert gpuops.__file__.startswith(sys.argv[1]), gpuops.__file__;"
            "p = profiles.resolve('lambda-h100'); assert '_data' in str(p.source), p.source;"
            "assert knowledge.preset_env('h100')['NVIDIA_TF32_OVERRIDE'] == '1';"
            "assert knowledge.knowledge()['torch_companions'];"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code, str(site)], cwd=elsewhere, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
