"""Issue 42: setup installs exactly what the local plan said it would, whatever file the plan read it from: a
script's `# /// script` block (PEP 723), pyproject's extras chosen by setup.extras, a requirements file's -r
include, setup.py's install_requires (installed by `-e .`). Through `gpuops run` on the Lambda emulator, as a user
meets it: the plan's list (the run record's `plan.requirements`) against what the instance's environment holds after
setup (the job prints its python's distributions). The packages are real wheels of this machine's local index."""
from __future__ import annotations

import json
import re
from pathlib import Path

from support.cloud import TYPE

# the job: every distribution its python sees, one line the test finds in the run's output
# the first of a name on sys.path is the one the job imports (a venv with --system-site-packages lists its own
# argcomplete 3.7.2 and then the image's 2.0.0, Debian's python3-argcomplete: a dict that kept the last said 2.0.0)
SHOW_ENV = ("import json\nfrom importlib import metadata\nseen = {}\n"
            "for d in metadata.distributions():\n"
            "    seen.setdefault(d.metadata['Name'].lower().replace('_', '-'), d.version)\n"
            "print('ENV ' + json.dumps(seen), flush=True)\n")
BLOCK = '# /// script\n# dependencies = ["argcomplete==3.7.2"]\n# ///\n'


def write(files: dict) -> None:
    for rel, text in files.items():
        Path(rel).parent.mkdir(parents=True, exist_ok=True)
        Path(rel).write_text(text)


def planned_and_held(r) -> tuple[list[str], dict]:
    """(the requirements the plan says setup installs, the job's environment after setup)."""
    doc = record()  # the run's record: the local plan it carried
    env = next((json.loads(m.group(1)) for m in re.finditer(r"(?m)^.*?ENV (\{.*\})\s*$", r.all)), None)
    assert env is not None, r.all
    return doc["plan"]["requirements"], env


def record() -> dict:
    return json.loads(next((Path.cwd() / "runs" / "pipelines").glob("*.json")).read_text())


def missing(planned: list[str], env: dict) -> list[str]:
    from packaging.requirements import Requirement

    out = []
    for line in planned:
        req = Requirement(line)
        have = env.get(req.name.lower().replace("_", "-"))
        if have is None or not req.specifier.contains(have, prereleases=True):
            out.append(f"{line}: the environment has {have or 'none'}")
    return out


def test_a_script_block_alone_is_installed_as_the_plan_says(cloud, gpuops):
    """The issue's reproduction: train.py's block names argcomplete (the issue's six is in this machine's python,
    which the instance's environment sees) and imports it; no other dependency file."""
    write({"train.py": BLOCK + "import argcomplete\n" + SHOW_ENV})
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--script", "train.py")
    assert r.code == 0, r.all
    planned, env = planned_and_held(r)
    assert planned == ["argcomplete==3.7.2"], planned
    assert missing(planned, env) == [], (missing(planned, env), r.all)
    assert record()["plan"]["installs"] == [{"requirement": "argcomplete==3.7.2", "from": "train.py's script block"}]
    assert "setup installs no project dependencies" not in r.all, r.all


def test_every_source_the_plan_reads_is_installed_by_setup(cloud, gpuops):
    """One project with every source at once: the block, a -r include, `-e .` whose setup.py names install_requires
    and whose pyproject's extra setup.extras chooses (the line itself names no extra)."""
    write({"train.py": BLOCK + SHOW_ENV,
           "requirements.txt": "-r reqs/base.txt\n-e .\n",
           "reqs/base.txt": "asn1crypto==1.5.1\n",
           "pyproject.toml": '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
                             '[project]\nname = "keptproj"\nversion = "0.1.0"\ndynamic = ["dependencies"]\n\n'
                             '[project.optional-dependencies]\nextra = ["appdirs==1.4.4"]\n\n'
                             '[tool.setuptools]\npy-modules = []\n',
           "setup.py": "from setuptools import setup\nsetup(install_requires=['aenum==3.1.17'])\n",
           "profiles/extras.yaml": "host: 203.0.113.9\nsetup:\n  extras: [extra]\n"})
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--from", "extras", "--script", "train.py",
)
    assert r.code == 0, r.all
    planned, env = planned_and_held(r)
    assert sorted(planned) == ["aenum==3.1.17", "appdirs==1.4.4", "argcomplete==3.7.2", "asn1crypto==1.5.1"], planned
    assert missing(planned, env) == [], (missing(planned, env), r.all)
    named = {i["requirement"]: i["from"] for i in record()["plan"]["installs"]}
    assert named == {"argcomplete==3.7.2": "train.py's script block", "asn1crypto==1.5.1": "reqs/base.txt",
                     "aenum==3.1.17": "setup.py", "appdirs==1.4.4": "pyproject.toml"}, named
