"""The local plan on the data a job reads (project/dataread.py, issue 38) and on modules only an extra provides that the
job imports lazily (judge.lazy_hints): warnings and hints, never a refusal. Minimal projects of the shapes of
nanoGPT (a configurator's exec, np.memmap of os.path.join('data', dataset)), a data-prep repository (a prepare
script writing data/train.bin, a run.sh that runs it first, another writing under ~/data) and verl (vllm imported in
a function, provided only by setup.py's extra vllm)."""
from __future__ import annotations

from pathlib import Path

from gpuops import knowledge as kb
from gpuops.project import dataread
from gpuops.project import plan as pp
from gpuops.project.resolution import Resolution
from gpuops.project.verdict import Plan

IMAGES = kb.load_playbook("images", Path("/nonexistent"))
TABLES = pp.tables(Path("/nonexistent"))
IMAGE = pp.image_of(IMAGES)


def write(root: Path, files: dict) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def resolved(*names):
    def resolver(request, image, *, timeout_s):
        return Resolution(available=True, packages={n: "1.0" for n in names}, install_bytes=1, seconds=0.1)
    return resolver


def plan(root: Path, script: str, resolver=None, settings=None, **run) -> Plan:
    return pp.build(root, script, image=IMAGE, settings=settings or pp.Settings(), tables=TABLES, images_doc=IMAGES,
                    resolver=resolver or resolved("numpy"), run=pp.RunOptions(**run))


def data_warnings(p: Plan) -> list[str]:
    return [w for w in p.warnings if "FileNotFoundError" in w]


DATA_PREP = {
    "requirements.txt": "numpy\n",
    "prepare.py": "import os\nimport numpy as np\nout = os.path.join(os.path.dirname(__file__), 'data')\n"
                  "os.makedirs(out, exist_ok=True)\nnp.arange(3, dtype=np.uint16).tofile(os.path.join(out, 'train.bin'))\n",
    "prep_home.py": "import os\nimport numpy as np\nd = os.path.expanduser('~/data/toy')\nos.makedirs(d, exist_ok=True)\n"
                    "np.save(os.path.join(d, 'train.npy'), np.arange(4))\n",
    "train.py": "import sys\nimport numpy as np\n"
                "print(np.load(sys.argv[1]) if len(sys.argv) > 1 else np.fromfile('data/train.bin', dtype=np.uint16))\n",
    "run.sh": "#!/bin/bash\nset -e\npython prepare.py\ntorchrun --standalone --nproc_per_node=8 train.py\n",
    "run_home.sh": "#!/bin/bash\nset -e\npython3 prep_home.py\npython3 train.py $HOME/data/toy/train.npy\n",
}


def test_a_read_of_data_the_project_lacks_is_said_with_the_prep_that_makes_it(tmp_path):
    write(tmp_path, DATA_PREP)
    p = plan(tmp_path, "train.py")
    (w,) = data_warnings(p)
    assert w.startswith("train.py (line 3) reads data/train.bin, which the project does not have, nothing before it "
                        "in the launch line makes and no --prep-out names"), w
    assert "gpuops run --prep 'python prepare.py' --prep-out data/train.bin --fs NAME" in w, w
    assert "docs/run.md#a-preparation-first---prep-cmd" in w and "--data SOURCE" in w, w
    assert not p.refused  # a warning, never a refusal: a path may be made at run time
    # made earlier in the launch line, under ~ (never a project path), kept by --prep-out, or in the project: quiet
    assert not data_warnings(plan(tmp_path, "run.sh"))
    assert not data_warnings(plan(tmp_path, "run_home.sh"))
    assert not data_warnings(plan(tmp_path, "train.py", prep="python prepare.py", prep_outs=("data/train.bin",)))
    assert not data_warnings(plan(tmp_path, "train.py", prep="python prepare.py", prep_outs=("data",)))
    write(tmp_path, {"data/train.bin": "xx"})
    assert not data_warnings(plan(tmp_path, "train.py"))


def test_a_host_already_up_has_its_own_files(tmp_path):
    """train/setup on a host whose image is not known here (and run's train stage, after its --prep-out were linked
    there): the data is the host's; only a fresh instance's plan says it (said once, by run before the launch)."""
    write(tmp_path, DATA_PREP)
    p = pp.build(tmp_path, "train.py", image=None, settings=pp.Settings(), tables=TABLES, images_doc=IMAGES)
    assert not data_warnings(p) and not p.refused


def test_the_preparation_on_another_instance_reaches_the_job_only_through_prep_out(tmp_path):
    """--prep runs on its own instance: what it writes and --prep-out does not name is not there for the job."""
    write(tmp_path, {**DATA_PREP, "train.py": "import numpy as np\nnp.fromfile('data/train.bin')\n"
                                              "np.fromfile('data/val.bin')\n"})
    (w,) = data_warnings(plan(tmp_path, "train.py", prep="python prepare.py", prep_outs=("data/train.bin",)))
    assert w.startswith("train.py (line 3) reads data/val.bin, which the project does not have"), w
    # the preparation's own reads: its own sequence
    write(tmp_path, {"prepare.py": "import numpy as np\nnp.load('corpus/raw.npy')\n"})
    ws = data_warnings(plan(tmp_path, "train.py", prep="python prepare.py", prep_outs=("data",)))
    assert ws == [ws[0]] and ws[0].startswith("the preparation (--prep python prepare.py): prepare.py (line 2) reads "
                                              "corpus/raw.npy, which the project does not have"), ws


NANOGPT = {
    "requirements.txt": "numpy\n",
    "configurator.py": "import sys\nfor arg in sys.argv[1:]:\n    if '=' not in arg:\n"
                       "        exec(open(arg).read())\n",
    "train.py": "import os\nimport pickle\nimport numpy as np\n"
                "out_dir = 'out'\ndataset = 'openwebtext'\ninit_from = 'scratch'\n"
                "exec(open('configurator.py').read())\n"
                "data_dir = os.path.join('data', dataset)\n"
                "def get_batch(split):\n"
                "    if split == 'train':\n"
                "        data = np.memmap(os.path.join(data_dir, 'train.bin'), dtype=np.uint16, mode='r')\n"
                "    else:\n"
                "        data = np.memmap(os.path.join(data_dir, 'val.bin'), dtype=np.uint16, mode='r')\n"
                "    return data\n"
                "meta_path = os.path.join(data_dir, 'meta.pkl')\n"
                "if os.path.exists(meta_path):\n"
                "    with open(meta_path, 'rb') as f:\n"
                "        meta = pickle.load(f)\n"
                "if init_from == 'resume':\n"
                "    import torch\n"
                "    checkpoint = torch.load(os.path.join(out_dir, 'ckpt.pt'))\n"
                "try:\n    open('data/extra.jsonl')\nexcept FileNotFoundError:\n    pass\n"
                "X = get_batch('train')\n",
    "config/train_shakespeare_char.py": "out_dir = 'out-shakespeare-char'\ndataset = 'shakespeare_char'\n",
    "data/shakespeare_char/prepare.py": "import numpy as np\n",
    "data/openwebtext/prepare.py": "import numpy as np\n",
}


def test_nanogpts_memmap_through_its_configurator(tmp_path):
    write(tmp_path, NANOGPT)
    (w,) = data_warnings(plan(tmp_path, "train.py"))
    assert w.startswith("train.py (lines 11, 13) reads data/openwebtext/train.bin and data/openwebtext/val.bin"), w
    assert "--prep 'python data/openwebtext/prepare.py' --prep-out data/openwebtext/train.bin --prep-out " \
           "data/openwebtext/val.bin" in w, w
    # the config file given after -- assigns dataset: another folder; the checkpoint of `init_from == 'resume'` is
    # not read (init_from is 'scratch'), meta.pkl is checked first, extra.jsonl's read is caught
    (w,) = data_warnings(plan(tmp_path, "train.py", args=("config/train_shakespeare_char.py",)))
    assert "reads data/shakespeare_char/train.bin and data/shakespeare_char/val.bin" in w, w
    assert "--prep 'python data/shakespeare_char/prepare.py'" in w
    (w,) = data_warnings(plan(tmp_path, "train.py", args=("--dataset=shakespeare_char",)))
    assert "data/shakespeare_char/train.bin" in w
    w = data_warnings(plan(tmp_path, "train.py", args=("--init_from=resume",)))
    assert any("out/ckpt.pt" in x for x in w), w  # resuming reads the checkpoint: said (the project has none)
    # nanoGPT's own launch line: the prepare script first, then train.py: quiet
    write(tmp_path, {"run.sh": "#!/bin/bash\nset -e\npython data/shakespeare_char/prepare.py\n"
                               "torchrun --standalone --nproc_per_node=8 train.py config/train_shakespeare_char.py\n",
                     "data/shakespeare_char/prepare.py": "import numpy as np\nnp.arange(3).tofile('x.bin')\n"})
    assert not data_warnings(plan(tmp_path, "run.sh"))
    # a launch script passing its arguments on ("$@", $1) to a child script and to train.py: the run's words count
    write(tmp_path, {"go.sh": "#!/bin/bash\nset -e\nbash scripts/train.sh config/train_shakespeare_char.py \"$@\"\n",
                     "scripts/train.sh": "#!/bin/bash\ntorchrun --standalone train.py $1 \"$@\"\n"})
    (w,) = data_warnings(plan(tmp_path, "go.sh"))
    assert "reads data/shakespeare_char/train.bin" in w, w
    (w,) = data_warnings(plan(tmp_path, "go.sh", args=("--dataset=openwebtext",)))
    assert "reads data/openwebtext/train.bin" in w, w


def test_reads_of_known_shapes_and_what_is_never_said(tmp_path):
    write(tmp_path, {"requirements.txt": "numpy\n", "train.py": (
        "import json\nimport pandas as pd\nfrom pathlib import Path\nfrom datasets import load_dataset, load_from_disk\n"
        "ROOT = Path(__file__).parent\n"
        "df = pd.read_parquet('shards/train-00000.parquet')\n"
        "ds = load_dataset('json', data_files={'train': 'sft/train.jsonl'})\n"
        "tok = load_from_disk(str(ROOT / 'tokenized'))\n"
        "cfg = json.load(open('config.json'))\n"  # in the project
        "notes = open('README.md').read()\n"  # not data
        "hub = load_dataset('openwebtext')\n"  # a Hub name, not a file
        "remote = pd.read_parquet('hf://datasets/org/name/x.parquet')\n"
        "home = pd.read_csv(Path.home() / 'x.csv')\n"
        "env = pd.read_csv(__import__('os').environ['DATA'] + '/x.csv')\n"
        "absolute = open('/data/train.bin', 'rb')\n"
        "with open('out/metrics.jsonl', 'w') as f:\n    f.write('{}')\n"
        "again = open('out/metrics.jsonl').read()\n"), "config.json": "{}"})
    ws = data_warnings(plan(tmp_path, "train.py"))  # one warning per folder (each may have its own preparation)
    assert [w.split(", which")[0] for w in ws] == ["train.py (line 6) reads shards/train-00000.parquet",
                                                   "train.py (line 7) reads sft/train.jsonl",
                                                   "train.py (line 8) reads tokenized"], ws
    w = "\n".join(ws)
    for quiet in ("config.json", "README.md", "openwebtext", "hf://", "x.csv", "/data/train.bin", "metrics"):
        assert quiet not in w, (quiet, w)


def test_a_data_folder_of_the_project_is_not_where_the_job_reads_it(tmp_path):
    """--data data: the folder is left out of the project's upload and put at $GPUOPS_DATA; a job reading
    data/train.bin finds nothing there."""
    write(tmp_path, {**DATA_PREP, "data/train.bin": "xx"})
    (w,) = data_warnings(plan(tmp_path, "train.py", data_dir="data", data_given=True))
    assert w.startswith("train.py (line 3) reads data/train.bin, inside the --data folder data: the instance has that "
                        "folder at $GPUOPS_DATA, not at data"), w
    assert "os.environ['GPUOPS_DATA']" in w


def test_the_scan_of_one_file():
    s = dataread.scan_file("import numpy as np\nimport os\nD = os.path.join(os.path.dirname(__file__), 'd')\n"
                           "np.memmap(os.path.join(D, 'a.bin'), mode='w+')\nnp.load(f'{D}/b.npy')\n", "pkg/x.py",
                           main=True)
    assert [r.path for r in s.reads] == ["/@project/pkg/d/b.npy"]
    assert s.writes == ["/@project/pkg/d/a.bin"]


SETUP_EXTRAS = {
    "pyproject.toml": "[build-system]\nrequires = ['setuptools>=61']\nbuild-backend = 'setuptools.build_meta'\n"
                      "[project]\nname = 'pkg'\nversion = '0.1'\ndynamic = ['dependencies', 'optional-dependencies']\n",
    "setup.py": "from setuptools import setup\nsetup(install_requires=['numpy'], extras_require={'vllm': ['vllm'], "
                "'test': ['pytest']})\n",
    "pkg/__init__.py": "",
    "pkg/main.py": "import numpy\nfrom pkg import rollout\n",
    "pkg/rollout.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pytest\n"
                      "def make(name):\n    if name == 'vllm':\n        from vllm import LLM\n        return LLM\n"
                      "    try:\n        import sglang\n    except ImportError:\n        sglang = None\n",
    "run.sh": "#!/bin/bash\nset -e\npython3 -m pkg.main \"$@\"\n",
    "run_vllm.sh": "#!/bin/bash\nset -e\npython3 -m pkg.main rollout.name=vllm\n",
}


def test_a_lazy_import_only_an_extra_provides_names_the_extra(tmp_path):
    """verl: vllm imported inside a function (optional by rule: never refused), in setup.py's extra vllm only."""
    write(tmp_path, SETUP_EXTRAS)
    res = resolved("pkg", "numpy")
    p = plan(tmp_path, "run.sh", res)
    assert not p.refused, p.to_json()
    (h,) = [h for h in p.hints if "only inside a function" in h]
    assert "vllm (pkg/rollout.py line 6): setup.extras [vllm]" in h and "extra of setup.py" in h, h
    assert "pytest" not in h and "sglang" not in h  # under TYPE_CHECKING, or with an ImportError fallback
    # the launch line says vllm: a warning naming the word and the fix
    p = plan(tmp_path, "run_vllm.sh", res)
    (w,) = [w for w in p.warnings if "vllm" in w]
    assert w.startswith("the launch line says `rollout.name=vllm` (run_vllm.sh), and pkg/rollout.py line 6 imports "
                        "vllm only when it takes that path; only the project's extra vllm (setup.py) provides vllm"), w
    assert w.endswith("fix: setup.extras [vllm] (in the profile given with --from)") and not p.refused
    # with the extra chosen, nothing is said
    p = plan(tmp_path, "run_vllm.sh", resolved("pkg", "numpy", "vllm"), settings=pp.Settings(extras=["vllm"]))
    assert not [x for x in p.warnings + p.hints if "vllm" in x], p.to_json()
