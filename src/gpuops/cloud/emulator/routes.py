"""The API's paths (a mixin of the Emulator): `handle(method, path, body)` answers a request as Lambda's API does
(OpenAPI 1.8.3: fields, status codes, error codes), on the account's state; the key check (`authorized`)."""
from __future__ import annotations

import base64
import binascii
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from .faults import ApiError, _Delayed, _Drop
from . import catalog


FS_NAME = re.compile(r"^[a-zA-Z]+[0-9a-zA-Z-]*$")
LIVE_MOUNT = ("booting", "active", "unhealthy", "terminating")  # these hold their filesystems mounted (terminating: until it ends)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _bytes_used(folder: Path) -> int:
    """What the files under a folder take (their sizes, symlinks not followed): Lambda's `bytes_used`, measured
    at each listing (Lambda's own figure is an estimate updated every few hours)."""
    total = 0
    for root, dirs, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _field(body, name):
    return body.get(name) if isinstance(body, dict) else None


def _images() -> list:
    t = _iso(1730419200)  # 2024-11-01
    return [{"id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"lambda-image/{n}/{r}")), "created_time": t,
             "updated_time": t, "name": n, "description": desc, "family": fam, "version": ver, "architecture": arch,
             "region": {"name": r, "description": catalog.REGIONS[r]}}
            for n, desc, fam, ver, arch in catalog.IMAGES for r in catalog.DEFAULT_REGIONS]


class Routes:
    """The Emulator's API (server.py)."""

    # -- the API -------------------------------------------------------------------------------------------------
    def handle(self, method: str, path: str, body) -> tuple[int, object]:
        """One API request -> (status, JSON document). Raises ApiError / _Drop."""
        path = path.split("?", 1)[0].rstrip("/")
        if not path.startswith("/api/v1/"):
            raise ApiError("not-found")
        p = path[len("/api/v1"):]
        if self._take_fault("account-inactive"):
            raise ApiError("account-inactive")
        revoked = self._take_fault("revoked-key", p)
        if revoked is not None:
            if int(revoked.get("after") or 0) <= 0:
                raise ApiError("invalid-api-key")
            revoked["after"] = int(revoked["after"]) - 1
            self._save()
        f = self._take_fault("5xx", p)
        if f:
            raise ApiError(f.get("error") or "internal-error")
        if self._take_fault("null-data", p):
            return 200, {"data": None}
        self._arrive()
        m = method
        if m == "GET" and p == "/instance-types":
            return 200, {"data": {t: {"instance_type": self._type_view(t), "regions_with_capacity_available": [
                {"name": r, "description": catalog.REGIONS[r]} for r in catalog.REGIONS
                if self._capacity.get(t, {}).get(r, 0) > 0 or [t, r] in self._failing]}
                for t in catalog.available_types()}}
        if m == "GET" and p == "/instances":
            return 200, {"data": [self._view(i) for i in self._instances.values()]}
        if p.startswith("/instances/") and p.count("/") == 2:
            inst = self._get(p.rsplit("/", 1)[1])
            if m == "GET":
                return 200, {"data": self._view(inst)}
            if m == "POST":
                name = (body or {}).get("name") if isinstance(body, dict) else None
                if not isinstance(name, str) or len(name) > 64:
                    raise ApiError("invalid-parameters", "name must be a string of at most 64 characters.")
                inst["name"] = name
                return 200, {"data": self._view(inst)}
        if m == "POST" and p == "/instance-operations/launch":
            return self._launch_request(body)
        if m == "POST" and p == "/instance-operations/terminate":
            return 200, {"data": {"terminated_instances": self._terminate(_field(body, "instance_ids"))}}
        if m == "POST" and p == "/instance-operations/restart":
            return 200, {"data": {"restarted_instances": self._restart(_field(body, "instance_ids"))}}
        if p == "/ssh-keys" and m == "GET":
            return 200, {"data": self._keys}
        if p == "/ssh-keys" and m == "POST":
            return 200, {"data": self._add_key(body)}
        if p.startswith("/ssh-keys/") and m == "DELETE":
            kid = p.rsplit("/", 1)[1]
            if not any(k["id"] == kid for k in self._keys):
                raise ApiError("invalid-parameters", "The SSH key does not exist.")
            self._keys = [k for k in self._keys if k["id"] != kid]
            return 200, {"data": {}}
        if p == "/images" and m == "GET":
            return 200, {"data": _images()}
        if p == "/file-systems" and m == "GET":
            return 200, {"data": [self._fs_view(f) for f in self._filesystems]}
        if p == "/filesystems" and m == "POST":
            return 200, {"data": self._fs_view(self._add_fs(body))}
        if p.startswith("/filesystems/") and m == "DELETE":
            return 200, {"data": self._delete_fs(p.rsplit("/", 1)[1])}
        if p == "/firewall-rules" and m == "GET":
            return 200, {"data": self._firewall_rules}
        if p == "/firewall-rules" and m == "PUT":
            rules = _field(body, "data")
            if not isinstance(rules, list) or any(not isinstance(r, dict) or r.get("protocol") not in
                                                  ("tcp", "udp", "icmp", "all") or "source_network" not in r
                                                  for r in rules):
                raise ApiError("invalid-parameters", "Invalid firewall rules.")
            self._firewall_rules = rules
            return 200, {"data": rules}
        raise ApiError("not-found")

    def _launch_request(self, body) -> tuple[int, object]:
        now = time.monotonic()
        self._launches += 1  # every launch request, refused ones too
        wait = self._last_launch + self._clock["launch_window"] - now
        if wait > 0:
            raise ApiError("too-many-requests", headers={"Retry-After": str(max(1, int(wait + 0.999)))})
        self._last_launch = now
        if not isinstance(body, dict):
            raise ApiError("invalid-parameters")
        iid = self._launch(body)
        if self._take_fault("drop-launch-response"):
            raise _Drop()
        if self._take_fault("launch-5xx-after-create"):
            raise ApiError("internal-error")
        slow = self._take_fault("slow-launch-answer")
        if slow:
            raise _Delayed(200, {"data": {"instance_ids": [iid]}}, float(slow.get("seconds", 10)))
        return 200, {"data": {"instance_ids": [iid]}}

    def _add_key(self, body) -> dict:
        if not isinstance(body, dict):
            raise ApiError("invalid-parameters")
        name, pub = body.get("name"), body.get("public_key")
        if not isinstance(name, str) or not 1 <= len(name) <= 64:
            raise ApiError("invalid-parameters", "name must be 1 to 64 characters.")
        if self._take_fault("key-added-elsewhere") and isinstance(pub, str):
            self._keys.append({"id": uuid.uuid4().hex, "name": name, "public_key": pub.strip()})
        if any(k["name"] == name for k in self._keys):
            raise ApiError("invalid-parameters", f"An SSH key named {name!r} already exists.")
        private = None
        if pub is None:
            with tempfile.TemporaryDirectory() as t:
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", f"{t}/k"],
                               check=True, stdout=subprocess.DEVNULL)
                private, pub = Path(f"{t}/k").read_text(), Path(f"{t}/k.pub").read_text().strip()
        if (not isinstance(pub, str) or not 1 <= len(pub) <= 4096 or len(pub.split()) < 2
                or not pub.split()[0].startswith(("ssh-", "ecdsa-", "sk-"))):
            raise ApiError("invalid-parameters", "Invalid public key.")
        try:
            base64.b64decode(pub.split()[1], validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("invalid-parameters", "Invalid public key.") from None
        key = {"id": uuid.uuid4().hex, "name": name, "public_key": pub.strip()}
        self._keys.append(key)
        return dict(key, private_key=private) if private else key

    def _add_fs(self, body) -> dict:
        if not isinstance(body, dict):
            raise ApiError("invalid-parameters")
        name, region = body.get("name"), body.get("region")
        if not isinstance(name, str) or len(name) > 60 or not FS_NAME.match(name) or region not in catalog.REGIONS:
            raise ApiError("invalid-parameters", "Invalid filesystem name or region.")
        if any(f["name"] == name for f in self._filesystems):
            raise ApiError("duplicate")
        fid = uuid.uuid4().hex
        d = self.dir / "filesystems" / fid
        d.mkdir(parents=True, exist_ok=True)
        fs = {"id": fid, "name": name, "region": region, "created": self.now(), "_dir": str(d)}
        fs["_mount"] = self._default_mount(fs)
        self._mount(fs, fs["_mount"])  # the default mount point: the folder every `file_system_names` mount sees
        self._filesystems.append(fs)
        return fs

    def _delete_fs(self, fid: str) -> dict:
        fs = next((f for f in self._filesystems if f["id"] == fid), None)
        if fs is None:
            raise ApiError("filesystem-not-found")
        users = self._fs_users(fs)
        if users:
            raise ApiError("filesystem-in-use", f"Filesystem {fs['name']!r} is in use by instance {users[0]}.")
        self._filesystems.remove(fs)
        for inst in self._instances.values():
            for m in inst.get("file_system_mounts") or []:
                if m["file_system_id"] == fid and Path(m["mount_point"]).is_symlink():
                    Path(m["mount_point"]).unlink(missing_ok=True)
        if Path(fs["_mount"]).is_symlink():
            Path(fs["_mount"]).unlink(missing_ok=True)
        shutil.rmtree(fs["_dir"], ignore_errors=True)  # the user asked: the data goes with it, as on Lambda
        return {"deleted_ids": [fid]}

    def _fs_users(self, fs: dict) -> list:
        """The instances that hold the filesystem mounted now."""
        return [i["id"] for i in self._instances.values()
                if any(m["file_system_id"] == fs["id"] for m in i.get("file_system_mounts") or [])
                and self._view(i)["status"] in LIVE_MOUNT]

    def _fs_view(self, fs: dict) -> dict:
        return {"id": fs["id"], "name": fs["name"], "mount_point": fs["_mount"],
                "created": _iso(fs["created"]),
                "created_by": {"id": "0" * 32, "email": "emulator@localhost", "status": "active"},
                "is_in_use": bool(self._fs_users(fs)),
                "region": {"name": fs["region"], "description": catalog.REGIONS[fs["region"]]},
                "bytes_used": _bytes_used(Path(fs["_dir"]))}

    def authorized(self, header: str | None) -> bool:
        """Bearer KEY (recommended), Basic base64(KEY:), or the raw key, as Lambda accepts."""
        if not header:
            return False
        given = header.strip()
        if given.lower().startswith("bearer "):
            given = given[7:].strip()
        elif given.lower().startswith("basic "):
            try:
                given = base64.b64decode(given[6:].strip()).decode().split(":", 1)[0]
            except (binascii.Error, ValueError):
                return False
        return secrets.compare_digest(given.encode(), self.api_key.encode())
