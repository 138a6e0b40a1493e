"""What the local plan resolved, installed exactly (pure; issue 34): the pins setup installs with, and the steps of the
packages that build against torch.

The resolution (project/resolution.py, made on this machine before anything was launched) travels with the run as a
document (Resolution.to_dict(): `pins`, `builds`). Setup writes the pins into a constraints file on the host and
installs the project's files with `-c` it: pip and uv may then take no other version of anything the plan resolved
(torch stays the image's; an unpinned torchvision is the one that matches it), so the plan and the install cannot
disagree. A package that builds against torch is installed before the project's files, as the plan said: its
prebuilt wheel for the host's torch, CUDA, python and C++ ABI (the host's torch fills in the URL), else built with
--no-build-isolation against the environment's torch; the install of the files then finds it present.
"""
from __future__ import annotations

import shlex
from typing import Optional

PINS_FILE = "pins.txt"  # in setup's folder on the host ($D)
BUILD_HOWS = ("wheel", "no-build-isolation")

# run on the host by the environment's python: "cp310 2.9 12 TRUE x86_64" of its torch (nothing when it has none)
TORCH_FACTS = ("import sys, platform, torch; print('cp%d%d' % sys.version_info[:2], "
               "'.'.join(torch.__version__.split('+')[0].split('.')[:2]), (torch.version.cuda or '').split('.')[0], "
               "str(torch._C._GLIBCXX_USE_CXX11_ABI).upper(), platform.machine())")


def pins_text(resolution: Optional[dict], skip: tuple[str, ...] = ()) -> str:
    """The constraints file: `name==version` per resolved package (the public version: `torch==2.9.0` is met by the
    image's 2.9.0+cu128, and names a release an index has). `skip`: names the profile pins itself (expect.packages:
    its torch step installs them, and the plan resolved against them)."""
    pins = (resolution or {}).get("pins") or {}
    return "".join(f"{n}=={str(v).split('+', 1)[0]}\n" for n, v in sorted(pins.items())
                   if v and "://" not in str(v) and n not in skip)


def builds(resolution: Optional[dict], skip: tuple[str, ...] = ()) -> list[dict]:
    """The builds setup installs before the project's files (those the plan decided a wheel or a build for)."""
    return [b for b in (resolution or {}).get("builds") or []
            if isinstance(b, dict) and b.get("how") in BUILD_HOWS and b.get("name") not in skip]


def wheel_or_build(*, requirement: str, template: str, build_requires: list[str], env: dict[str, str],
                   arch_list: str, max_jobs: int, torch_first: str = "") -> str:
    """Shell text: the prebuilt wheel of `template` filled in from the environment's torch ({version} already in),
    else the build requirements and a --no-build-isolation build of `requirement` (MAX_JOBS, TORCH_CUDA_ARCH_LIST).
    `torch_first`: a torch requirement installed before (with the pins) when the image has none."""
    url = (template.replace("{cuda_major}", "$cu").replace("{torch_mm}", "$tmm").replace("{abi}", "$abi")
           .replace("{py}", "$py").replace("{machine}", "$machine"))
    variables = {"MAX_JOBS": str(max_jobs), "TORCH_CUDA_ARCH_LIST": arch_list, **env}
    settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in variables.items())
    lines = []
    if torch_first:
        lines.append(f'gpuops_install -c "$D/{PINS_FILE}" {shlex.quote(torch_first)}')
    lines.append(f'set -- $("$GPUOPS_PY" -c {shlex.quote(TORCH_FACTS)} 2>/dev/null); py=$1; tmm=$2; cu=$3; abi=$4; '
                 "machine=$5")
    if template:
        lines += [f'url="{url}"',
                  'if [ -n "$cu" ] && [ -n "$abi" ] && echo "trying the prebuilt wheel $url" && gpuops_install "$url"; '
                  "then :", "else"]
    lines.append(f'  echo "no prebuilt wheel for torch $tmm cu$cu $py abi=$abi: building {requirement} '
                 f'({settings}, --no-build-isolation)"')
    if build_requires:
        lines.append("  gpuops_install " + " ".join(shlex.quote(r) for r in build_requires))
    lines.append(f"  {settings} gpuops_install --no-build-isolation {shlex.quote(requirement)}")
    if template:
        lines.append("fi")
    return "\n".join(lines)


def build_step(build: dict, *, resolution: dict, arch_list: str, max_jobs: int) -> tuple[str, str, str, str]:
    """(id, title, reason, command) of one package that builds against torch."""
    name, version = str(build["name"]), str(build.get("version") or "")
    requirement = f"{name}=={version}" if version else name
    template = str(build.get("template") or "") if build.get("how") == "wheel" else ""
    template = template.replace("{version}", version)
    env = {str(k): str(v) for k, v in (build.get("env") or {}).items() if k not in ("MAX_JOBS",)}
    torch_first = "torch" if "torch" in ((resolution.get("packages") or {})) else ""
    cmd = wheel_or_build(requirement=requirement, template=template, build_requires=list(build.get("build_requires")
                                                                                           or []),
                         env=env, arch_list=arch_list, max_jobs=max_jobs, torch_first=torch_first)
    return (f"build-{name}", f"install {requirement} (builds against torch)",
            str(build.get("why") or "the plan said so"), cmd)
