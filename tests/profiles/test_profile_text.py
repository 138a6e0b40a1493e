"""The pure half of `profiles new` / `pin`: text from values, a gpus.yaml row or recorded facts, always through the
hand-written profile's gate."""
from __future__ import annotations

from pathlib import Path

import pytest

from support.helpers import healthy_cuda, probe_doc, smi

from gpuops.verify import gpus
from gpuops.profiles import text as pt
from gpuops.verify.facts import from_probe
from gpuops.profiles.model import profile_from_text


def render(**over):
    kw = dict(host="203.0.113.7", user="ubuntu", port=22, key=None, remote_dir=None, python="python3",
              instance_type=None, expect=pt.Expectations(), written_by="gpuops profiles new")
    kw.update(over)
    return pt.render("box", **kw)


def load(text):
    return profile_from_text(text, Path("profiles/box.yaml"))


@pytest.mark.parametrize("row", gpus.load(), ids=lambda r: r.id)
def test_every_instance_type_of_the_table_renders_a_valid_profile(row):
    for itype in row.lambda_instance_types[:1]:
        got = gpus.for_instance_type(itype)
        prof = load(render(instance_type=itype, expect=pt.from_gpu_row(got[0], got[1], itype)))
        assert prof.expect.gpu_count == got[1]
        assert gpus.match(prof.expect.gpu).id == row.id  # the written name is the row's, for verify's identity check
        assert all(prof.expect.gpu.lower() in n.lower() for n in row.smi_names[:1])  # and a substring of nvidia-smi's
        assert prof.env_preset == row.preset


def test_facts_of_a_real_h100_become_expectations():
    doc = probe_doc(query=smi("h100_pcie_x1.csv"), table=smi("h100_legacy_header.txt"), python_version="3.10.12",
                    packages={"torch": "2.9.0+cu128", "torchvision": "0.24.0+cu128", "torchaudio": None,
                              "vllm": "0.12.0", "flash-attn": "2.8.3", "numpy": "2.1.2"}, cuda=healthy_cuda())
    e = pt.from_facts(from_probe(doc), match=gpus.match)
    assert e.values["gpu"] == "H100 PCIe" and e.values["gpu_count"] == 1
    assert e.values["driver"] == "570.148.08" and e.values["cuda"] == "12.8" and e.values["python"] == "3.10"
    assert e.values["packages"] == {"torch": "2.9.0+cu128", "torchvision": "0.24.0+cu128", "vllm": "0.12.0",
                                    "flash-attn": "2.8.3"}  # torchaudio absent, numpy not pinned
    assert e.preset == "h100" and not e.warnings
    prof = load(render(expect=e))
    assert prof.expect.packages["torch"] == "2.9.0+cu128"


def test_a_broken_nvidia_smi_writes_no_gpu_expectations_and_says_so():
    doc = probe_doc(query="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", query_rc=9,
                    table_rc=9)
    e = pt.from_facts(from_probe(doc))
    assert "gpu" not in e.values and "gpu_count" not in e.values and "driver" not in e.values
    assert any("nvidia-smi failed" in w for w in e.warnings)
    e = pt.from_facts(from_probe(probe_doc(smi_found=False)))
    assert "gpu_count" not in e.values and any("not found" in w for w in e.warnings)


def test_replace_expect_keeps_every_other_line():
    text = ("# header comment\nhost: 1.2.3.4   # inline\nexpect:\n  gpu: H100   # old note\n  packages: {torch: \"2.8\"}\n"
            "\n# about env\nenv_preset: h100\n")
    out = pt.replace_expect(text, {"gpu": "H100 PCIe", "packages": {"torch": "2.9.0"}}, {"gpu": "nvidia-smi: x"})
    assert out.startswith("# header comment\nhost: 1.2.3.4   # inline\nexpect:\n  gpu: \"H100 PCIe\"   # nvidia-smi: x\n")
    assert out.endswith('    torch: "2.9.0"\n\n# about env\nenv_preset: h100\n')
    assert load(out).expect.packages == {"torch": "2.9.0"}
    assert pt.replace_expect("host: a\n", {"gpu_count": 0}).endswith("expect:\n  gpu_count: 0\n")  # appended
    flow = pt.replace_expect("host: a\nexpect: {gpu: A}\nuser: me\n", {"gpu": "B"})
    assert flow == 'host: a\nexpect:\n  gpu: "B"\nuser: me\n'


def test_merge_keeps_thresholds_and_unpinned_packages():
    old = {"min_disk_gb": 100, "packages": {"torch": "2.8.0", "mylib": "1.0"}, "driver": "550.1", "imports": []}
    new = pt.Expectations(values={"driver": "570.148.08", "packages": {"torch": "2.9.0+cu128"}})
    assert pt.merge_expect(old, new) == {"min_disk_gb": 100, "driver": "570.148.08",
                                         "packages": {"torch": "2.9.0+cu128", "mylib": "1.0"}}


def test_values_are_quoted_so_yaml_cannot_reinterpret_them():
    prof = load(render(python="~/venv/bin/python -X dev", remote_dir="~/a: b # c", user="yes"))
    assert prof.python == "~/venv/bin/python -X dev" and prof.remote_dir == "~/a: b # c" and prof.user == "yes"


def test_the_default_python_is_left_out_so_setup_can_make_its_environment():
    from gpuops.setup.apply import with_environment

    prof = load(render())
    assert prof.python == "python3" and "python" not in prof.model_fields_set  # train uses the system python3
    assert with_environment(prof)[0].python == "~/.venvs/gpuops/bin/python"  # setup makes and records its own
    given = load(render(python="~/venv/bin/python"))
    assert with_environment(given) == (given, False)
