"""A resolution of the project's requirements for an image (pure)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .images import Image


@dataclass(frozen=True)
class ResolveRequest:
    requirements: tuple[str, ...]      # PEP 508 strings, includes already followed, extras chosen, PEP 723 added
    index_lines: tuple[str, ...]       # --index-url / --extra-index-url / --find-links lines as the files gave them
    lock: Optional[str] = None         # path of a uv.lock to export instead of resolving (frozen)
    extras: tuple[str, ...] = ()       # for the lock/pyproject case


@dataclass
class Resolution:
    available: bool                    # False: no resolution (offline, timeout, uv missing): `why` says, fall back
    why: str = ""
    packages: dict[str, str] = field(default_factory=dict)   # normalized name -> version: what setup installs
    install_bytes: Optional[int] = None
    replaces_image: list[tuple[str, str, str]] = field(default_factory=list)  # (name, image version, new version)
    fixes: list[str] = field(default_factory=list)           # what the plan changed and why
    refusal: Optional[tuple[str, str]] = None                # (message, fix) when no fix exists
    builds: list[dict] = field(default_factory=list)         # packages that build against torch: name, how, why
    seconds: float = 0.0


def resolve(request: ResolveRequest, image: "Image", *, timeout_s: float = 20.0) -> Resolution:
    return Resolution(available=False, why="not built yet")
