"""What an instance image brings (pure): playbooks/images.yaml as `Image` rows.

An image's python version and platform (uv's --python-platform for the machine it runs on) say for which python and
which wheels a resolution is made; its packages are what its /usr/bin/python3 already holds: `keep` ones (its CUDA
torch) are the resolution's constraints, the others its preferences (pip keeps an installed version that satisfies a
requirement). A package not confirmed on an instance is never the ground of a refusal.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

DEFAULT_PLATFORM = {"x86_64": "x86_64-manylinux_2_28", "arm64": "aarch64-manylinux_2_28"}
ARCH_NAMES = {"x86_64": "x86_64", "amd64": "x86_64", "arm64": "arm64", "aarch64": "arm64"}


def norm(name: str) -> str:
    """A distribution name as PEP 503 compares them (Flash_Attn -> flash-attn)."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


@dataclass(frozen=True)
class Image:
    name: str                                   # the image family (Lambda's Image.family)
    python: str                                 # the version of its /usr/bin/python3
    platform: str = "x86_64-manylinux_2_28"     # uv's --python-platform for the instance
    packages: dict[str, str] = field(default_factory=dict)  # normalized name -> version, preinstalled
    keep: frozenset = frozenset()               # names the resolution must not replace (constraints)
    unconfirmed: frozenset = frozenset()        # names not seen on an instance yet (never refused on)
    sources: dict[str, str] = field(default_factory=dict)   # name -> where the row comes from
    arch: str = "x86_64"

    @property
    def python_minor(self) -> str:
        """3.10 of 3.10.12 (uv's --python-version takes either)."""
        return ".".join(self.python.split(".")[:2])

    @property
    def torch(self) -> Optional[str]:
        return self.packages.get("torch")

    @property
    def cuda(self) -> Optional[str]:
        """The CUDA its torch is built for, from the local version (2.9.0+cu128 -> 12.8)."""
        m = re.search(r"\+cu(\d+)(\d)$", self.torch or "")
        return f"{m.group(1)}.{m.group(2)}" if m else None

    @property
    def label(self) -> str:
        return self.name if self.arch == "x86_64" else f"{self.name} ({self.arch})"

    def with_packages(self, changed: dict[str, str], keep: bool = True) -> "Image":
        """The image with some packages replaced (a profile's expect.packages pins torch on purpose: setup installs
        it, and the resolution keeps that one instead)."""
        packages = dict(self.packages)
        packages.update({norm(k): v for k, v in changed.items()})
        kept = set(self.keep) | ({norm(k) for k in changed} if keep else set())
        return Image(self.name, self.python, self.platform, packages, frozenset(kept),
                     frozenset(self.unconfirmed - {norm(k) for k in changed}),
                     {**self.sources, **{norm(k): "the profile" for k in changed}}, self.arch)


def from_row(row: dict, arch: str = "x86_64") -> Image:
    """One images.yaml row as the Image for one machine (x86_64, or arm64 for GH200)."""
    arch = ARCH_NAMES.get(str(arch).lower(), str(arch))
    platforms = row.get("platforms") or {}
    packages, keep, unconfirmed, sources = {}, set(), set(), {}
    for p in row.get("packages") or []:
        if not isinstance(p, dict) or not p.get("name") or not p.get("version"):
            continue
        name = norm(p["name"])
        packages[name] = str(p["version"])
        sources[name] = str(p.get("source") or "")
        if p.get("keep"):
            keep.add(name)
        if p.get("confirmed") is False:
            unconfirmed.add(name)
    if row.get("torch") and "torch" not in packages:  # a row written before packages were: its torch is kept
        packages["torch"], sources["torch"] = str(row["torch"]), str(row.get("source") or "")
        keep.add("torch")
    return Image(str(row.get("family")), str(row.get("python") or ""),
                 str(platforms.get(arch) or DEFAULT_PLATFORM.get(arch, DEFAULT_PLATFORM["x86_64"])), packages,
                 frozenset(keep), frozenset(unconfirmed), sources, arch)


def images(doc: dict, arch: Optional[str] = None) -> list[Image]:
    """Every image of an images.yaml document (for `arch`, or each machine its platforms name)."""
    out = []
    for row in doc.get("images") or []:
        if not isinstance(row, dict) or not row.get("family"):
            continue
        arches = [arch] if arch else list((row.get("platforms") or {"x86_64": None}).keys())
        out += [from_row(row, a) for a in arches]
    return out


def image_for(doc: dict, family: str, arch: str = "x86_64") -> Optional[Image]:
    """The image of `family` for `arch`, or None when images.yaml has no such family."""
    row = next((r for r in doc.get("images") or [] if isinstance(r, dict) and r.get("family") == family), None)
    return from_row(row, arch) if row else None


def launched(doc: dict, arch: str = "x86_64") -> list[Image]:
    """The images a launch that names none may boot (images.yaml `launched`)."""
    return [i for i in (image_for(doc, f, arch) for f in doc.get("launched") or []) if i is not None]


def load(project_dir=None) -> dict:
    """images.yaml (./playbooks/images.yaml of the project overrides the packaged one)."""
    from ..knowledge import load_playbook

    return load_playbook("images", project_dir)
