"""Packages that build against torch (pure): for each resolved package playbooks/builds.yaml names, how setup
installs it (a prebuilt wheel for the image's torch, CUDA, python and C++ ABI, else a build with
--no-build-isolation against the environment's torch; or an ordinary build), and the sentence the plan says."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Optional

from .images import norm

if TYPE_CHECKING:
    from .images import Image


def wheel_url(template: str, version: str, image: "Image", *, torch: Optional[str] = None,
              abi: str = "TRUE") -> Optional[str]:
    """A row's prebuilt wheel for the image (None when its torch or CUDA is not known here)."""
    torch = torch or image.torch
    cuda = image.cuda
    if not template or not torch or not cuda:
        return None
    mm = ".".join(torch.split("+")[0].split(".")[:2])
    py = "cp" + image.python_minor.replace(".", "")
    machine = "aarch64" if image.arch == "arm64" else "x86_64"
    return (template.replace("{version}", version).replace("{cuda_major}", cuda.split(".")[0])
            .replace("{torch_mm}", mm).replace("{abi}", abi).replace("{py}", py).replace("{machine}", machine))


def decide(resolved: dict[str, tuple[str, Optional[int], str]], image: "Image", rows: list[dict],
           torch: Optional[str] = None) -> list[dict]:
    """One entry per resolved package that builds against torch: name, version, how (wheel | no-build-isolation |
    isolated | index-wheel), url (the prebuilt wheel tried first), then (what follows when it is not published),
    build_requires, env, why, source. `torch`: the torch the environment will have (the image's, else resolved)."""
    by_name = {norm(r["name"]): r for r in rows}
    torch = torch or image.torch or (resolved.get("torch") or ("", None, ""))[0] or None
    out = []
    for name in sorted(resolved):
        row = by_name.get(name)
        if row is None:
            continue
        version, _, url = resolved[name]
        entry = {"name": name, "version": version, "build_requires": list(row.get("build_requires") or []),
                 "env": {str(k): str(v) for k, v in (row.get("env") or {}).items()},
                 "source": str(row.get("source") or ""), "url": None, "then": None,
                 "template": str(row.get("wheel") or "")}
        against = f"the image's torch {torch}" if torch and torch == image.torch else \
            f"torch {torch}" if torch else "the environment's torch"
        if row.get("index_wheels") and url.endswith(".whl"):
            entry.update(how="index-wheel", why=f"a wheel from the index built for its torch (the resolution "
                                                f"matched it to {against}): nothing to build")
        elif row.get("build") == "isolated":
            entry.update(how="isolated", why="its build does not need torch (installed as any other package); "
                                             + _first_clause(entry["source"]))
        else:
            wheel = wheel_url(str(row.get("wheel") or ""), version, image, torch=torch)
            build = f"built with --no-build-isolation against {against}" + (
                f" ({', '.join(f'{k}={v}' for k, v in entry['env'].items())})" if entry["env"] else "")
            if wheel:
                entry.update(how="wheel", url=wheel, then="no-build-isolation",
                             why=f"builds against torch: the prebuilt wheel {wheel.rsplit('/', 1)[-1]} (torch "
                                 f"{_mm(torch)}, CUDA {image.cuda}, {_py(image)}, the C++ ABI as the host's torch "
                                 f"says) where it is published, else {build}")
            else:
                entry.update(how="no-build-isolation", why=f"builds against torch: {build} (pip's isolated build has "
                                                           "no torch: No module named 'torch')")
        out.append(entry)
    return out


def _mm(torch: Optional[str]) -> str:
    return ".".join((torch or "").split("+")[0].split(".")[:2])


def _py(image: "Image") -> str:
    return "cp" + image.python_minor.replace(".", "")


def _first_clause(text: str) -> str:
    return re.split(r"[;(]", text, maxsplit=1)[0].strip()
