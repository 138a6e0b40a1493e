"""Lambda persistent filesystems, the pure part: names, which filesystem a launch attaches and in which region, where
an instance mounts it, what it costs per month, and the rows `gpuops fs ls` and `gpuops ls` show.

The talking part is `cloud/api.py` (list, create, delete, launch with `file_system_names`) and `cloud/up.py`
(`up` and `gpuops run` attach through `UpSpec.file_systems`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable, Optional

from ..errors import ExitCode, GpuopsError, UsageError

NAME_RE = re.compile(r"^[a-zA-Z]+[0-9a-zA-Z-]*$")  # FilesystemCreateRequest.name
NAME_MAX = 60
GIB = 1024 ** 3
# an instance in these states holds its filesystems mounted (terminating: until it has ended, Lambda refuses to delete
# the filesystem meanwhile: `fs rm` waits for it, cloud.fs_actions._after_terminating)
LIVE = ("booting", "active", "unhealthy", "terminating")
NO_PRICE = ("Lambda publishes no filesystem price gpuops can cite (its billing page gives one only as an example); "
            "put the price Lambda showed at creation in ./playbooks/filesystems.yaml to see costs")
CACHE_DIR = "gpuops/cache"  # under the mount point: setup's caches (uv, pip) shared by every instance attaching it
DATA_DIR = "gpuops/data"  # under the mount point: `run --data`'s copies, one folder per source


def check_name(name: str) -> str:
    """A filesystem name as Lambda accepts it (letters first, then letters, digits and '-'; at most 60)."""
    if not name or len(name) > NAME_MAX or not NAME_RE.match(name):
        raise UsageError(f"not a usable filesystem name: {name!r}",
                         hint=f"a letter first, then letters, digits and '-', at most {NAME_MAX} characters "
                              "(Lambda's rule)")
    return name


def find(filesystems: Iterable, name: str):
    return next((f for f in filesystems if f.name == name), None)


def users(fs, instances: Iterable) -> list:
    """The live instances that mount the filesystem (by name or by id), in the API's order."""
    return [i for i in instances if i.status in LIVE
            and (fs.name in i.file_system_names or any(fid == fs.id for fid, _ in i.file_system_mounts))]


def mount_point(fs, instance=None) -> str:
    """Where an instance sees the filesystem: its record's mount for the filesystem, else the filesystem's default."""
    if instance is not None:
        for fid, mp in instance.file_system_mounts:
            if fid == fs.id:
                return mp
    return fs.mount_point


def prices(project_dir: Optional[Path] = None) -> dict:
    """playbooks/filesystems.yaml's `price` block ({usd_per_gib_month, source, regions})."""
    from ..knowledge import load_playbook

    doc = load_playbook("filesystems", project_dir).get("price") or {}
    return doc if isinstance(doc, dict) else {}


def price_per_gib_month(region: str, price: dict) -> Optional[float]:
    """USD per GiB per month in a region, or None when no citable price is known."""
    regional = price.get("regions") or {}
    value = regional.get(region) if isinstance(regional, dict) and region in regional else price.get(
        "usd_per_gib_month")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def monthly_cost(bytes_used: Optional[int], region: str, price: dict) -> Optional[float]:
    """What a month of the filesystem at its present size costs (USD), or None (size or price unknown)."""
    rate = price_per_gib_month(region, price)
    if rate is None or bytes_used is None:
        return None
    return bytes_used / GIB * rate


def rows(filesystems: Iterable, instances: Iterable, price: dict) -> list[dict]:
    """One row per filesystem for `gpuops fs ls` and `gpuops ls`: name, region, mount point (as the API reports
    it), bytes used, the instances that mount it, the cost per month (None: not known)."""
    insts = list(instances)
    out = []
    for fs in filesystems:
        mounted = users(fs, insts)
        out.append({"name": fs.name, "id": fs.id, "region": fs.region, "mount_point": fs.mount_point,
                    "bytes_used": fs.bytes_used, "is_in_use": fs.is_in_use or bool(mounted),
                    "instances": [{"id": i.id, "name": i.name, "mount_point": mount_point(fs, i)} for i in mounted],
                    "usd_per_gib_month": price_per_gib_month(fs.region, price),
                    "cost_per_month": monthly_cost(fs.bytes_used, fs.region, price), "created": fs.created})
    return out


def total_per_month(fs_rows: list[dict]) -> Optional[float]:
    """The sum of the known monthly costs, None when none is known."""
    known = [r["cost_per_month"] for r in fs_rows if r["cost_per_month"] is not None]
    return sum(known) if known else None


def human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def launch_region(fs_names: list[str], filesystems: Iterable, regions_asked: Iterable[str]) -> Optional[str]:
    """The one region a launch attaching `fs_names` can use (a filesystem attaches only in its region), or None when
    one is missing (the caller creates it in the region asked). Raises when they lie in different regions or the
    --region asked excludes theirs."""
    fss = list(filesystems)
    found = [find(fss, n) for n in fs_names]
    regions = sorted({f.region for f in found if f is not None})
    asked = list(regions_asked)
    if len(regions) > 1:
        where = ", ".join(f"{f.name} in {f.region}" for f in found if f is not None)
        raise UsageError(f"the filesystems asked lie in different regions ({where}); an instance attaches only "
                         "filesystems of its own region", hint="give filesystems of one region")
    if regions and asked and regions[0] not in asked:
        name = next(f.name for f in found if f is not None)
        raise UsageError(f"filesystem {name!r} is in {regions[0]}, not in {', '.join(asked)}: an instance attaches "
                         "only a filesystem of its own region",
                         hint=f"leave out --region (the filesystem's region is used), or --region {regions[0]}")
    return regions[0] if regions else None


def fs_error(exc, name: str = ""):
    """A LambdaError of a filesystem call as one clear gpuops error (message, hint, exit code)."""
    code = getattr(exc, "api_code", "")
    what = f"filesystem {name!r}" if name else "the filesystem"
    if code == "global/duplicate":
        return UsageError(f"{what} exists already (Lambda's names are unique per account)",
                          hint="`gpuops fs ls` shows it; pick another NAME")
    if code == "filesystems/filesystem-in-use":
        return GpuopsError(f"{what} is mounted by an instance: Lambda refuses to delete it ({exc.api_message})",
                           hint="end the instance first (`gpuops ls` shows it, `gpuops down NAME` ends it)",
                           code=ExitCode.FAILED)
    if code == "global/object-does-not-exist":
        return UsageError(f"{what} does not exist", hint="`gpuops fs ls` lists the filesystems")
    if code == "instance-operations/launch/file-system-in-wrong-region":
        return UsageError(f"{what} is in another region than the instance: {exc.api_message}",
                          hint="with --fs gpuops launches only in the filesystem's region; leave out --region")
    if code == "global/quota-exceeded":
        return GpuopsError(f"Lambda refused to create {what}: quota exceeded", hint=exc.suggestion or
                           "contact Lambda's support to raise the quota", code=ExitCode.FAILED)
    if code == "global/invalid-parameters":
        return UsageError(f"Lambda refused {what}: {exc.api_message}",
                          hint="a name is a letter, then letters, digits and '-'; `gpuops cloud types` lists regions")
    return exc
