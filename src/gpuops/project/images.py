"""What an instance image brings (pure): playbooks/images.yaml as `Image` rows."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Image:
    name: str                                   # the image family (Lambda's Image.family)
    python: str                                 # the version of its /usr/bin/python3
    platform: str = "x86_64-manylinux_2_28"     # uv's --python-platform for the instance
    packages: dict[str, str] = field(default_factory=dict)  # normalized name -> version, preinstalled
