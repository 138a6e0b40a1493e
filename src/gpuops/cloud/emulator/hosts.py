"""The account's instances (a mixin of the Emulator): each launch a real sandbox host (sshd on its own 127.0.0.N:22)
with the key and host key it was given, its status advanced by the emulated clock, its filesystems mounted,
terminated or restarted."""
from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import uuid
from pathlib import Path

from .faults import ApiError
from . import catalog


HOSTNAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")
TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")
MOUNT_POINT = re.compile(r"^(/home|/lambda/nfs|/data)[//a-zA-Z0-9-]*$")  # RequestedFilesystemMountEntry's pattern
ACTIONS = ("migrate", "rebuild", "restart", "cold_reboot", "terminate")


def _user_data_host_key(user_data: str) -> str | None:
    """cloud-config's `ssh_keys: {ed25519_private: ...}` (what gpuops up sends), or None."""
    if not user_data.lstrip().startswith("#cloud-config"):
        return None
    import yaml

    try:
        doc = yaml.safe_load(user_data)
    except yaml.YAMLError:
        return None
    keys = (doc or {}).get("ssh_keys") if isinstance(doc, dict) else None
    key = keys.get("ed25519_private") if isinstance(keys, dict) else None
    return key if isinstance(key, str) and "PRIVATE KEY" in key else None


class InstanceHosts:
    """The Emulator's instances (server.py): self.state, self._lock held by the caller."""

    # -- instances -----------------------------------------------------------------------------------------------
    def _advance(self, inst: dict) -> None:
        now = self.now()
        st = inst["status"]
        if st == "booting" and inst.get("_preempt_at") is not None and now >= inst["_preempt_at"]:
            inst["status"], inst["_ended"] = "preempted", now
            self._stop_host(inst)
        elif st == "booting" and now >= inst["_active_at"]:
            inst["status"] = "unhealthy" if inst.get("_unhealthy") else "active"
        elif st == "terminating" and now >= inst["_ended"] + self._clock["terminate_seconds"]:
            inst["status"] = "terminated"

    def _view(self, inst: dict) -> dict:
        self._advance(inst)
        st = inst["status"]
        v = {k: val for k, val in inst.items() if not k.startswith("_")}
        if st in ("active", "unhealthy"):
            v["ip"] = v["private_ip"] = inst["_address"]
            v["jupyter_token"] = inst["_jupyter_token"]
            v["jupyter_url"] = f"https://jupyter-{inst['id'][:12]}.lambdaspaces.com/?token={inst['_jupyter_token']}"
        v["instance_type"] = catalog.instance_type(inst["_type"])
        if st == "booting":
            v["actions"] = {a: ({"available": True} if a == "terminate" else
                                {"available": False, "reason_code": "vm-has-not-launched",
                                 "reason_description": "The instance has not launched yet."}) for a in ACTIONS}
        elif st in ("active", "unhealthy"):
            v["actions"] = {a: {"available": True} for a in ACTIONS}
        else:
            v["actions"] = {a: {"available": False, "reason_code": "vm-is-terminating",
                                "reason_description": "The instance is terminating or terminated."} for a in ACTIONS}
        return v

    def _type_view(self, t: str) -> dict:
        view = catalog.instance_type(t)
        f = self._faults.get("no-price")
        if f is not None and f.get("type") in (None, t):
            del view["price_cents_per_hour"]
        return view

    def _get(self, iid: str) -> dict:
        inst = self._instances.get(iid)
        if inst is None:
            raise ApiError("instance-not-found")
        return inst

    def _launch(self, body: dict) -> str:
        region, tname, keys = body.get("region_name"), body.get("instance_type_name"), body.get("ssh_key_names")
        if region not in catalog.REGIONS:
            raise ApiError("invalid-parameters", f"Invalid region_name: {region!r}." if region else
                           "region_name is required.")
        if not isinstance(tname, str) or tname not in catalog.TYPES or tname not in catalog.available_types():
            raise ApiError("invalid-parameters", f"Invalid instance_type_name: {tname!r}." if tname else
                           "instance_type_name is required.")
        if not isinstance(keys, list) or len(keys) != 1 or not isinstance(keys[0], str):
            raise ApiError("invalid-parameters", "Exactly one SSH key name must be specified in ssh_key_names.")
        quantity = body.get("quantity", 1)  # not in the schema; the live service refuses more than one (skypilot #7084)
        if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
            raise ApiError("invalid-parameters", "quantity must be a positive integer.")
        if quantity > 1:
            raise ApiError("invalid-parameters", "Requested too many instances.")
        name, hostname, tags = body.get("name"), body.get("hostname"), body.get("tags") or []
        if name is not None and (not isinstance(name, str) or len(name) > 64):
            raise ApiError("invalid-parameters", "name must be at most 64 characters.")
        if hostname is not None and (not isinstance(hostname, str) or not HOSTNAME.match(hostname)):
            raise ApiError("invalid-parameters", "Invalid hostname.")
        if not isinstance(tags, list) or any(not isinstance(t, dict) or not TAG_KEY.match(str(t.get("key", "")))
                                             or len(str(t.get("key"))) > 55 or len(str(t.get("value", ""))) > 128
                                             for t in tags):
            raise ApiError("invalid-parameters", "Invalid tags.")
        user_data = body.get("user_data")
        if user_data is not None and (not isinstance(user_data, str) or len(user_data.encode()) > 1024 * 1024):
            raise ApiError("invalid-parameters", "user_data must be text of at most 1 MB.")
        key = next((k for k in self._keys if k["name"] == keys[0]), None)
        if key is None:
            raise ApiError("launch-resource-not-found", f"SSH key {keys[0]!r} does not exist.")
        mounts = self._launch_mounts(body, region)
        if self._take_fault("quota-exceeded"):
            raise ApiError("quota-exceeded")
        slots = self._capacity.get(tname, {}).get(region, 0)
        if slots <= 0 or [tname, region] in self._failing:
            raise ApiError("insufficient-capacity")
        now = self.now()
        iid = uuid.uuid4().hex
        slow = self._take_fault("slow-boot")
        preempt = self._take_fault("preempt-while-booting")
        inst = {"id": iid, "status": "booting", "ssh_key_names": [keys[0]],
                "file_system_names": list(dict.fromkeys(fs["name"] for fs, _ in mounts)),
                "file_system_mounts": [{"mount_point": mp, "file_system_id": fs["id"]} for fs, mp in mounts],
                "region": {"name": region, "description": catalog.REGIONS[region]},
                "_type": tname, "_launched": now, "_jupyter_token": secrets.token_hex(16),
                "_active_at": now + (float(slow.get("seconds", 60)) if slow else self._clock["boot_seconds"]),
                "_preempt_at": now + float(preempt.get("seconds", 0.3)) if preempt else None,
                "_unhealthy": bool(self._take_fault("unhealthy"))}
        if name is not None:
            inst["name"] = name
        if tags:
            inst["tags"] = [{"key": t["key"], "value": t.get("value", "")} for t in tags]
        self._start_host(inst, user_data or "", key["public_key"], hostname)
        # the boot counts from the launch's answer (the host's start here takes its own time, more on a loaded
        # machine: counted from before it, an instance could be `active` at the first look)
        up = self.now()
        inst["_active_at"] += up - now
        if inst["_preempt_at"] is not None:
            inst["_preempt_at"] += up - now
        for fs, mp in mounts:
            self._mount(fs, mp)
        self._capacity[tname][region] = slots - 1
        self._instances[iid] = inst
        return iid

    def _launch_mounts(self, body: dict, region: str) -> list:
        """The launch's filesystems, checked as Lambda checks them: [(filesystem, mount point as the API reports it)].
        `file_system_names` mount at the filesystem's default mount point, `file_system_mounts` at the one asked
        (the spec's pattern); each must exist and be in the instance's region."""
        names, entries = body.get("file_system_names") or [], body.get("file_system_mounts") or []
        if not isinstance(names, list) or any(not isinstance(n, str) for n in names):
            raise ApiError("invalid-parameters", "file_system_names must be a list of names.")
        if not isinstance(entries, list) or any(
                not isinstance(e, dict) or not isinstance(e.get("file_system_id"), str)
                or not isinstance(e.get("mount_point"), str) or len(e["mount_point"]) > 256
                or not MOUNT_POINT.match(e["mount_point"]) for e in entries):
            raise ApiError("invalid-parameters", "Invalid file_system_mounts: each needs a file_system_id and a "
                                                 "mount_point under /home, /lambda/nfs or /data.")
        out = []
        for n in names:
            fs = next((f for f in self._filesystems if f["name"] == n), None)
            if fs is None:
                raise ApiError("launch-fs-not-found", f"Filesystem {n!r} does not exist.")
            out.append((fs, self._default_mount(fs)))
        for e in entries:
            fs = next((f for f in self._filesystems if f["id"] == e["file_system_id"]), None)
            if fs is None:
                raise ApiError("launch-fs-not-found", f"Filesystem {e['file_system_id']!r} does not exist.")
            out.append((fs, self._rooted(e["mount_point"])))
        for fs, _ in out:
            if fs["region"] != region:
                raise ApiError("fs-wrong-region", f"File system {fs['name']!r} is in region {fs['region']}, but the "
                                                  f"instance is being launched in {region}.")
        return out

    def _rooted(self, mount_point: str) -> str:
        return mount_point if self._mount_root == "/" else self._mount_root.rstrip("/") + mount_point

    def _default_mount(self, fs: dict) -> str:
        return fs.get("_mount") or self._rooted(f"/lambda/nfs/{fs['name']}")

    def _mount(self, fs: dict, mount_point: str) -> None:
        """The filesystem's folder appears at the mount point (a symlink: every instance on this machine sees it)."""
        link = Path(mount_point)
        if link.is_symlink() or link.exists():
            if link.is_symlink() and os.readlink(link) == fs["_dir"]:
                return
            if link.is_symlink():
                link.unlink()
            else:
                raise ApiError("invalid-parameters", f"Mount point {mount_point} is in use.")
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(fs["_dir"], target_is_directory=True)

    def _start_host(self, inst: dict, user_data: str, public_key: str, hostname: str | None) -> None:
        from ...sandbox import host

        gpu, count = catalog.gpu_of(inst["_type"])
        host_key = None
        if user_data and not self._take_fault("ignore-user-data-host-key"):
            host_key = _user_data_host_key(user_data)
        d = self.dir / "hosts" / inst["id"]
        old = self._take_fault("old-driver")
        stack = {"driver": str(old.get("version", "535.183.01")), "cuda": str(old.get("cuda", "12.2"))} if old else {}
        recycle = self._take_fault("recycle-ip")
        address = host.AUTO
        if recycle:
            ended = sorted((i for i in self._instances.values() if i.get("_ended") and i.get("_address")),
                           key=lambda i: i["_ended"])
            address = recycle.get("address") or (ended[-1]["_address"] if ended else host.AUTO)
        try:
            image_python = None
            if self._image.get("python"):
                from ...sandbox import image

                image_python = str(image.build(self.dir / "images" / self._image["python"], self._image["python"]))
            st = host.start(d, address=address, port=22, gpu=gpu, gpus=count, host_key=host_key,
                            authorized_keys=[public_key], python=self.python, image_python=image_python, **stack)
            for rel, text in (self._image.get("files") or {}).items():
                f = d / "home" / rel
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(text)
        except Exception as e:  # noqa: BLE001 - the API answers 500, as a provider failing to start a VM would
            shutil.rmtree(d, ignore_errors=True)
            raise ApiError("internal-error", f"The instance could not be started: {e}") from None
        inst["_dir"], inst["_address"] = str(d), st["address"]
        inst["hostname"] = hostname or "ip-" + st["address"].replace(".", "-")

    def _stop_host(self, inst: dict) -> None:
        from ...sandbox import host

        if inst.get("_dir") and inst.get("_host_up", True):
            host.stop(Path(inst["_dir"]))
            shutil.rmtree(Path(inst["_dir"]) / "home", ignore_errors=True)  # termination wipes the disk
            inst["_host_up"] = False

    def _release(self, inst: dict) -> None:
        cap = self._capacity.setdefault(inst["_type"], {})
        cap[inst["region"]["name"]] = cap.get(inst["region"]["name"], 0) + 1

    def _terminate(self, ids) -> list:
        if not isinstance(ids, list) or not ids:
            raise ApiError("instance-not-found", "instance_ids must name at least one instance.")
        insts = [self._get(i) for i in ids]
        out = []
        for inst in insts:
            self._advance(inst)
            if inst["status"] not in ("terminating", "terminated", "preempted"):
                self._stop_host(inst)
                inst["status"], inst["_ended"] = "terminating", self.now()
                self._release(inst)
            out.append(self._view(inst))
        return out

    def _restart(self, ids) -> list:
        from ...sandbox import host

        if not isinstance(ids, list) or not ids:
            raise ApiError("instance-not-found", "instance_ids must name at least one instance.")
        insts = [self._get(i) for i in ids]
        for inst in insts:
            self._advance(inst)
            if inst["status"] in ("active", "unhealthy"):
                for pid in host.session_processes(Path(inst["_dir"])):  # a reboot ends every job
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                inst["status"] = "booting"
                inst["_active_at"] = self.now() + self._clock["boot_seconds"]
        return [self._view(i) for i in insts]
