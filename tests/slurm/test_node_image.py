"""slurm/node_image.py (pure but for reading the saved reports): the nodes' saved verify reports -> the Image the local
plan judges a cluster's job against. The reports are made as `gpuops verify` on a cluster makes them: verify's own
build_report on the nodes' facts, named per node as verify_cluster.judge_nodes names them, saved by save_report."""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from gpuops.project.plan import Settings, build, tables
from gpuops.slurm import node_image as ni
from gpuops.verify.facts import Facts
from gpuops.verify.host import build_report, save_report

PROFILE = SimpleNamespace(name="clu", host="127.0.0.1", user="me", port=22, region=None, instance_type=None)
GLIBC = "Linux-6.1.0-x86_64-with-glibc2.36"


def saved(project: Path, node: str, rank: int, when: datetime, *, python: str = "3.11.7",
          packages: dict | None = None, name: str = "clu", distributions: dict | None = None) -> Path:
    """One node's report saved as `gpuops verify -p clu` saves it (logs/env_checks/<date>_clu-host<rank>.json)."""
    facts = Facts(host=node, os={"arch": "x86_64", "pretty": "Debian GNU/Linux 12 (bookworm)"},
                  python={"version": python, "platform": GLIBC, "implementation": "CPython"},
                  packages={"numpy": "2.4.6", "torch": None, "flash-attn": None, **(packages or {})},
                  distributions=distributions)
    rep = build_report(SimpleNamespace(**{**vars(PROFILE), "name": name}), facts, [], 1, 0.5, when)
    rep.update(host=node, node=rank, slurm_node=node)
    return save_report(rep, [], project, when)[0]


def at(minute: int) -> datetime:
    return datetime(2026, 12, 7, 10, minute, 5, tzinfo=timezone.utc)


def test_no_saved_verify_is_none(tmp_path):
    assert ni.node_image(tmp_path, "clu") is None
    saved(tmp_path, "n1", 0, at(1), name="other")  # another profile's nodes are not these
    assert ni.node_image(tmp_path, "clu") is None
    assert "run gpuops verify -p clu first" in ni.no_verify_warning("clu", "lambda-stack-22-04")


def test_two_nodes_alike_make_one_image(tmp_path):
    saved(tmp_path, "n1", 0, at(1), packages={"torch": "2.9.0+cu128"})
    saved(tmp_path, "n2", 1, at(1), packages={"torch": "2.9.0+cu128"})
    got = ni.node_image(tmp_path, "clu")
    assert got is not None and got.nodes == ("n1", "n2") and got.warnings == []
    img = got.image
    assert img.name.startswith("the nodes of clu, as verified 2026-12-07") and img.python == "3.11.7"
    assert img.packages == {"numpy": "2.4.6", "torch": "2.9.0+cu128"}  # measured absent: not the nodes'
    assert img.keep == {"torch"} and img.cuda == "12.8"
    assert img.platform == "x86_64-manylinux_2_36" and img.arch == "x86_64"
    assert img.sources["numpy"].startswith("gpuops verify of n1")


def test_the_newest_verify_only(tmp_path):
    """A later verify of one node: the older verify's second node is not one a job gets now."""
    saved(tmp_path, "n1", 0, at(1), packages={"torch": "2.8.0"})
    saved(tmp_path, "n2", 1, at(1), packages={"torch": "2.8.0"})
    saved(tmp_path, "n3", 0, at(9), packages={"torch": "2.9.0"})
    got = ni.node_image(tmp_path, "clu")
    assert got.nodes == ("n3",) and got.image.torch == "2.9.0" and len(got.reports) == 1


def test_nodes_that_differ_are_said_and_judged_on_what_they_share(tmp_path):
    saved(tmp_path, "n1", 0, at(2), packages={"torch": "2.9.0", "transformers": "4.57.0"})
    saved(tmp_path, "n2", 1, at(2), python="3.10.12", packages={"torch": "2.8.0"})
    got = ni.node_image(tmp_path, "clu")
    img = got.image
    assert img.python == "3.11.7" and img.torch == "2.9.0"  # the first node's
    assert "transformers" not in img.packages  # n2 lacks it: a job there stops at its import
    said = "\n".join(got.warnings)
    assert "pythons differ (n1: 3.11.7, n2: 3.10.12): judged against n1's (the first node's) 3.11.7" in said
    assert "transformers on n1 only" in said and "judged against what they share" in said
    assert "torch 2.9.0 on n1, 2.8.0 on n2" in said


def test_a_node_without_a_report_is_said(tmp_path):
    saved(tmp_path, "n1", 0, at(3))
    p = saved(tmp_path, "n2", 1, at(3))
    p.write_text('{"profile": "clu", "host": "n2", "node": 1, "slurm_node": "n2", "facts": {}}')  # no_report's shape
    got = ni.node_image(tmp_path, "clu")
    assert got.nodes == ("n1",) and "n2 gave no report" in got.warnings[0]


def test_the_plan_judges_against_the_nodes(tmp_path):
    """The Image and its images.yaml row as the plan reads them: what the nodes lack is refused, what they have is
    theirs; requires-python is the nodes' python's."""
    saved(tmp_path, "n1", 0, at(4))
    got = ni.node_image(tmp_path, "clu")
    (tmp_path / "train.py").write_text("import numpy\nimport nosuchmodule_xyz\n")
    doc = ni.images_doc({"project_tools": []}, got.image)
    plan = build(tmp_path, "train.py", image=got.image, settings=Settings(), tables=tables(), images_doc=doc)
    by = {m.module: m.status for m in plan.modules}
    assert by == {"numpy": "image", "nosuchmodule_xyz": "missing"}, by
    assert plan.image == got.image.name and plan.python == "3.11.7"
    assert [p for p, _ in plan.refusals] == [
        f"train.py imports nosuchmodule_xyz, which nothing setup installs provides (the plan resolved 0 package(s) "
        f"for {got.image.name}; none of them, nor the image, provides it)"]
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "p"\nversion = "0"\nrequires-python = ">=3.12"\n')
    plan = build(tmp_path, "train.py", image=got.image, settings=Settings(), tables=tables(), images_doc=doc)
    assert any("3.11.7" in p and "requires-python" in p for p, _ in plan.certain), plan.certain


def test_every_distribution_the_nodes_have_counts_not_only_those_verify_names(tmp_path):
    """verify on a cluster lists every distribution of the nodes' python (a report without that list, an older
    verify's, knows only the packages verify checks by name: the image says it is not complete)."""
    every = {"numpy": "2.4.6", "PyYAML": "6.0.3", "ray": "2.60.0"}
    saved(tmp_path, "n1", 0, at(1), distributions=every)
    saved(tmp_path, "n2", 1, at(1), distributions=every)
    got = ni.node_image(tmp_path, "clu")
    assert got.complete and {"pyyaml", "ray", "numpy"} <= set(got.image.packages), got.image.packages
    saved(tmp_path, "n1", 0, at(2))
    saved(tmp_path, "n2", 1, at(2))
    older = ni.node_image(tmp_path, "clu")
    assert not older.complete and "pyyaml" not in older.image.packages
