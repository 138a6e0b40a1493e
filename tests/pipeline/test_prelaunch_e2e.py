"""Issue #28, "Before anything is billed", end to end: `run` refuses on this machine, with nothing launched and no
run record, what cannot run on the image it would boot; `train` refuses a script no host can run before it syncs;
setup refuses, before it installs anything, a requires-python the instance's python misses, and inside `run` its hint
does not send the user to a `gpuops setup` on the instance the run terminates."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cloud import TYPE
from support.runs import remote_project
from support.envs import file_index


PROJECT = '[project]\nname = "rl"\nversion = "0.1"\nrequires-python = "{spec}"\ndependencies = []\n'
POETRY1 = '[tool.poetry]\nname = "rl"\nversion = "0.1.0"\n\n[tool.poetry.dependencies]\npython = "^3.10"\n'


def _live(cloud):
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


CASES = {
    "requires-python": ({"pyproject.toml": PROJECT.format(spec=">=3.13"), "train.py": "print('hi')\n"}, "train.py",
                        ['requires-python = ">=3.13"', "lambda-stack-22-04: 3.10.12"]),
    "crlf": ({"job.sh": b"#!/bin/bash\r\nset -e\r\npython train.py\r\n", "train.py": "print('hi')\n"}, "job.sh",
             ["job.sh has Windows line endings (CRLF", "sed -i"]),
    "poetry": ({"pyproject.toml": POETRY1, "poetry.lock": "# poetry\n", "train.py": "print('hi')\n"}, "train.py",
               ["this is a poetry project (poetry.lock)", "poetry export -f requirements.txt"]),
    "conda": ({"job.sh": "#!/bin/bash\nset -e\nconda activate rl\npython train.py\n", "train.py": "print('hi')\n",
               "requirements.txt": ""}, "job.sh", ["job.sh runs `conda activate`"]),
    "relative-imports": ({"pkg/__init__.py": "", "pkg/model.py": "N = 1\n",
                          "pkg/train.py": "from .model import N\nprint(N)\n"}, "pkg/train.py",
                         ["relative imports (from .model import ...)", "-m pkg.train"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_refuses_before_anything_is_launched(cloud, gpuops, case):
    files, script, said = CASES[case]
    for rel, text in files.items():
        Path(rel).parent.mkdir(parents=True, exist_ok=True)
        (Path(rel).write_bytes if isinstance(text, bytes) else Path(rel).write_text)(text)
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", script)
    assert r.code == 1 and "nothing was launched" in r.err, r.all
    for words in said:
        assert words in r.err, r.all
    assert "Traceback" not in r.all
    assert cloud.launch_requests() == 0  # nothing billed
    assert not list(Path("runs/pipelines").glob("*")) if Path("runs/pipelines").exists() else True


def test_a_requires_python_the_instance_misses_ends_the_run_at_setup_with_a_hint_for_this_machine(cloud, gpuops):
    """The knowledge says a launched image meets requires-python (a project's own playbooks/images.yaml here), the
    instance's python does not: setup refuses before installing, the run terminates the instance, and the hint
    names what to change in the project, not `gpuops setup` on an instance that no longer exists."""
    cloud.image("lambda-stack")
    Path("playbooks").mkdir()
    Path("playbooks/images.yaml").write_text(
        "launched: [future]\nimages:\n  - {family: future, python: '9.9.9', source: a test}\nproject_tools: []\n")
    Path("pyproject.toml").write_text(PROJECT.format(spec=">=9"))
    Path("train.py").write_text("print('hi')\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py")
    assert r.code == 1, r.all
    assert 'setup failed: setup cannot install the project on' in r.err
    assert 'pyproject.toml says requires-python = ">=9", and the python the environment is made from' in r.err
    hint = r.err.split("setup failed:", 1)[1]
    assert "Lower requires-python" in hint and "gpuops setup" not in hint
    assert json.loads(r.out)["outcome"] == "failed"
    assert not _live(cloud)


def test_train_refuses_a_crlf_script_before_it_syncs(sandbox, gpuops):
    Path("job.sh").write_bytes(b"#!/bin/bash\r\nset -e\r\necho hi\r\n")
    r = gpuops("train", "--script", "job.sh")
    assert r.code == 1 and "job.sh has Windows line endings" in r.err and "nothing was synced or launched" in r.err
    assert not (remote_project(sandbox) / "job.sh").exists()


def test_train_before_setup_says_run_setup_not_does_not_compile(sandbox, gpuops):
    from support.envs import fresh_env, set_profile

    set_profile(sandbox, python=fresh_env(sandbox, "never-made-env"))
    Path("train.py").write_text("import os\nprint('hi')\n")
    r = gpuops("train", "--script", "train.py", "--no-snapshot")
    assert r.code == 1, r.all
    assert "the profile's python ~/never-made-env/bin/python does not exist on the host yet" in r.err
    assert "run `gpuops setup`" in r.err and "does not compile" not in r.err


def test_two_extra_indexes_of_the_hosts_pip_config_are_searched_as_pip_does(sandbox, gpuops, tmp_path):
    """extra-index-url names two indexes, the first lacking the pinned version: pip finds it (it considers every
    index), uv by default stops at the first index that has the package ("no version of pinpkg==1.0"). setup gives
    uv pip's semantics for pip's settings (UV_INDEX_STRATEGY=unsafe-best-match)."""
    from support.envs import LOCAL_INDEX, fresh_env, home, set_profile

    first = file_index(tmp_path / "first", "pinpkg", "1.1")
    second = file_index(tmp_path / "second", "pinpkg", "1.0")
    conf = home(sandbox) / ".config" / "pip" / "pip.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"[global]\nindex-url = {LOCAL_INDEX}\nextra-index-url = {first} {second}\n")
    try:
        set_profile(sandbox, python=fresh_env(sandbox, "senv-two-indexes"), expect={"packages": {"pinpkg": "1.0"}})
        Path("requirements.txt").write_text("pinpkg==1.0\n")
        assert gpuops("sync", "-p", "sandbox").code == 0
        r = gpuops("setup", "sandbox")
        assert r.code == 0, r.all
        assert "installer: uv" in r.out and "PASS  pinpkg: 1.0" in r.out
    finally:
        conf.unlink(missing_ok=True)


def test_setups_summary_quotes_the_cause_of_a_failed_install(cloud, gpuops):
    """On Lambda Stack setup installs with pip, whose output ends "See above for output." and "note: This error
    originates from a subprocess": the summary quotes git's own line (the host it could not reach)."""
    cloud.image("lambda-stack")
    Path("requirements.txt").write_text("git+https://127.0.0.1:1/acme/tools.git\n")
    Path("train.py").write_text("print('hi')\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py")
    assert r.code == 1, r.all
    summary = next(ln for ln in r.err.splitlines() if "setup failed: setup failed on" in ln)
    assert "at step deps (exit 1): fatal: unable to access 'https://127.0.0.1:1/acme/tools.git/': Failed to connect " \
           "to 127.0.0.1 port 1" in summary, r.err
    assert not _live(cloud)


# -- launchers in a .sh job -------------------------------------------------------------------------------------------
def test_torchrun_in_a_sh_job_runs_with_the_job_environments_python(cloud, gpuops, tmp_path):
    """Lambda Stack's torchrun is the system python's (/usr/bin/torchrun): from a .sh job it ran train.py without the
    project's packages, which setup installed into the run's environment. launch.sh puts a torchrun that runs the
    environment's python next on PATH, before the system's."""
    from support.indexes import make_wheel

    cloud.image("lambda-stack")
    whl = make_wheel(tmp_path / "wheels", "pinpkg", "1.0", "VALUE = 'one'\n")
    Path("requirements.txt").write_text(f"{whl}\n")
    # one write per line: the two ranks share the log, and with PYTHONUNBUFFERED (the h100 preset) a print of several
    # values is several writes, which interleaved once under eight workers ("rankrank 1 of 2 ...")
    Path("train.py").write_text("import os, sys, torch, pinpkg\nsys.stdout.write(f\"rank {os.environ['RANK']} of "
                                "{os.environ['WORLD_SIZE']} pinpkg {pinpkg.VALUE} python {sys.executable}\\n\")\n"
                                "sys.stdout.flush()\n")
    Path("job.sh").write_text("#!/bin/bash\nset -e\necho \"torchrun is $(command -v torchrun)\"\n"
                              "torchrun --standalone --nproc_per_node 2 train.py\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "job.sh")
    assert r.code == 0, r.all
    log = (Path.cwd() / json.loads(r.out)["fetched"]["log"]).read_text()
    assert "rank 0 of 2 pinpkg one python" in log and "rank 1 of 2 pinpkg one python" in log, log
    assert "/.venvs/gpuops/bin/python" in log and "/bin/torchrun" in log
    assert not _live(cloud)


def test_setup_names_poetry_instead_of_nothing_to_do(sandbox, gpuops):
    """The facts script reports poetry.lock from the host: setup refuses before any step, naming poetry and its
    export, where it used to say "nothing to do" (and the gate then refused after the instance billed)."""
    from support.envs import fresh_env, set_profile

    set_profile(sandbox, python=fresh_env(sandbox, "senv-poetry"))
    Path("pyproject.toml").write_text(POETRY1)
    Path("poetry.lock").write_text("# poetry\n")
    Path("train.py").write_text("print('hi')\n")
    assert gpuops("sync", "-p", "sandbox").code == 0
    r = gpuops("setup", "sandbox")
    assert r.code == 1, r.all
    assert "setup cannot install the project on sandbox: this is a poetry project (poetry.lock)" in r.err
    assert "poetry export -f requirements.txt --output requirements.txt --without-hashes" in r.err
    assert "nothing to do" not in r.all
    assert not (Path(sandbox["dir"]) / "home" / "senv-poetry").exists()  # nothing was made or installed
