"""What a Slurm cluster's nodes hold, as the local plan judges against it (pure but for reading the saved reports):
the newest `gpuops verify` of the profile's nodes, saved here (logs/env_checks/<date>_<profile>-host<i>.json, one
per node, verify/host.py save_report) -> a project.images.Image: the python the nodes' python reported, its
platform (the glibc it runs on), the packages verify measured with their versions (their torch kept, as an image's).

Where the nodes differ, the plan judges against what they share: a package some nodes lack is left out (the job
would stop at its import there), a version or a python that differs is the first node's; each said as a warning.
No saved report: None (the plan then judges against the image a launch boots and says so)."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..project.images import ARCH_NAMES, DEFAULT_PLATFORM, Image, norm

KEEP = ("torch",)  # built for the cluster's CUDA and driver: the resolution must not replace it
MANYLINUX = (17, 40)  # the manylinux_2_N platforms uv's --python-platform knows


@dataclass(frozen=True)
class Nodes:
    """The nodes' Image, which verify it comes from and what the plan should say of it."""
    image: Image
    nodes: tuple[str, ...]  # the nodes judged, in rank order
    checked_at: str  # the first node's report's checked_at
    reports: tuple[str, ...]  # the report files read
    warnings: list[str] = field(default_factory=list)
    complete: bool = False  # every node's report lists every distribution (not only those verify measures)


def report_files(project_dir: Path, profile: str) -> list[Path]:
    """The newest verify's node reports of `profile` saved in this project, in rank order: the newest host0 report,
    then each next rank's newest one saved with it or after it (an older verify's node, asked then and not since, is
    not the nodes a job gets now)."""
    folder = Path(project_dir) / "logs" / "env_checks"
    pat = re.compile(r"^(\d{4}-\d\d-\d\d_\d{6})_" + re.escape(profile) + r"-host(\d+)\.json$")
    newest: dict[int, tuple[str, Path]] = {}
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for p in entries:
        m = pat.match(p.name)
        if m:
            rank, stamp = int(m.group(2)), m.group(1)
            if rank not in newest or stamp > newest[rank][0]:
                newest[rank] = (stamp, p)
    if 0 not in newest:
        return []
    first, out, rank = newest[0][0], [], 0
    while rank in newest and newest[rank][0] >= first:
        out.append(newest[rank][1])
        rank += 1
    return out


def read_reports(paths: list[Path]) -> list[dict]:
    """The reports' JSON ({} for one that cannot be read)."""
    out = []
    for p in paths:
        try:
            doc = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            doc = {}
        out.append(doc if isinstance(doc, dict) else {})
    return out


def platform_of(facts: dict, arch: str) -> str:
    """uv's --python-platform for the nodes: the glibc their python reported (`...-with-glibc2.36`), else the
    default for the machine."""
    m = re.search(r"glibc(\d+)\.(\d+)", str((facts.get("python") or {}).get("platform") or ""))
    prefix = "aarch64" if arch == "arm64" else "x86_64"
    if m and m.group(1) == "2":
        minor = min(max(int(m.group(2)), MANYLINUX[0]), MANYLINUX[1])
        return f"{prefix}-manylinux_2_{minor}"
    return DEFAULT_PLATFORM.get(arch, DEFAULT_PLATFORM["x86_64"])


def _python(rep: dict) -> Optional[str]:
    facts = rep.get("facts") or {}
    py = facts.get("python") or {}
    return str(py["version"]) if facts.get("python_ok", True) and py.get("version") else None


def _node(rep: dict, rank: int) -> str:
    return str(rep.get("slurm_node") or rep.get("host") or f"node {rank}")


def _day(checked_at: str) -> str:
    """2026-12-07T00:00:09+00:00 -> 2026-12-07 00:00."""
    return checked_at[:16].replace("T", " ") if checked_at else "at an unknown time"


def _packages(rep: dict) -> dict[str, str]:
    """Every distribution the node's python has (verify on a cluster gathers them all), else the packages verify
    measured (an older report: a package it did not measure is not known to be there)."""
    facts = rep.get("facts") or {}
    every = {norm(k): str(v) for k, v in (facts.get("distributions") or {}).items() if v}
    return {**every, **{norm(k): str(v) for k, v in (facts.get("packages") or {}).items() if v}}


def image_of(profile: str, reports: list[dict], files: tuple[str, ...] = ()) -> Optional[Nodes]:
    """The Image the plan judges a job on these nodes against (see the module's docstring); None when no node's
    report holds its python (none saved, or every node's probe failed)."""
    usable = [(rank, rep) for rank, rep in enumerate(reports) if _python(rep)]
    if not usable:
        return None
    warnings: list[str] = []
    names = [_node(rep, rank) for rank, rep in usable]
    missing = [_node(rep, rank) for rank, rep in enumerate(reports) if not _python(rep)]
    first_rank, first = usable[0]
    first_name = names[0]
    checked = str(first.get("checked_at") or "")
    label = f"the nodes of {profile}, as verified {_day(checked)}"
    if missing:
        warnings.append(f"{label}: {', '.join(missing)} gave no report (their python's packages are not known "
                        f"here): judged against {', '.join(names)}")
    pythons = {n: _python(rep) for n, (_, rep) in zip(names, usable)}
    python = pythons[first_name]
    if len(set(pythons.values())) > 1:
        warnings.append(f"{label}: their pythons differ ({', '.join(f'{n}: {v}' for n, v in pythons.items())}): "
                        f"judged against {first_name}'s (the first node's) {python}")
    per_node = [_packages(rep) for _, rep in usable]
    shared = {k: v for k, v in per_node[0].items() if all(k in p for p in per_node[1:])}
    only_some = sorted({k for p in per_node for k in p} - set(shared))
    if only_some:
        said = "; ".join(f"{k} on {', '.join(n for n, p in zip(names, per_node) if k in p)} only"
                         for k in only_some)
        warnings.append(f"{label}: not every node has the same packages ({said}): judged against what they share "
                        "(a job on a node that lacks one stops at its import)")
    differ = sorted(k for k in shared if len({p[k] for p in per_node}) > 1)
    if differ:
        said = "; ".join(f"{k} " + ", ".join(f"{p[k]} on {n}" for n, p in zip(names, per_node)) for k in differ)
        warnings.append(f"{label}: their versions differ ({said}): judged against {first_name}'s (the first node's)")
    facts = first.get("facts") or {}
    arch = ARCH_NAMES.get(str((facts.get("os") or {}).get("arch") or "x86_64").lower(), "x86_64")
    source = f"gpuops verify of {first_name}, {_day(checked)}"
    image = Image(name=label, python=python, platform=platform_of(facts, arch), packages=shared,
                  keep=frozenset(k for k in KEEP if k in shared), sources={k: source for k in shared}, arch=arch)
    complete = all((rep.get("facts") or {}).get("distributions") for _, rep in usable)
    return Nodes(image, tuple(names), checked, tuple(str(f) for f in files), warnings, complete)


def node_image(project_dir: Path, profile: str) -> Optional[Nodes]:
    """The nodes' Image from the newest verify of `profile` saved under the project's logs/env_checks/; None when
    there is none."""
    files = report_files(project_dir, profile)
    return image_of(profile, read_reports(files), tuple(str(f) for f in files)) if files else None


def images_doc(doc: dict, image: Image) -> dict:
    """images.yaml as the plan reads it for the nodes: their image the only one a job boots (requires-python is
    judged against the nodes' python, and the packages verify measured are the image's, known), the rest (project
    tools) kept."""
    row = {"family": image.name, "python": image.python, "conda": False,
           "packages": [{"name": k, "version": v, "keep": k in image.keep, "source": image.sources.get(k, "")}
                        for k, v in sorted(image.packages.items())]}
    return {**doc, "launched": [image.name], "images": [row]}


def no_verify_warning(profile: str, default: Optional[str]) -> str:
    """What the plan says when no verify of the cluster is saved here (a warning, never a refusal)."""
    return (f"no `gpuops verify` of this cluster saved here: judged against {default or 'no image'}; run "
            f"gpuops verify -p {profile} first")
