"""The tests' handle on a Lambda API emulator: a real HTTP server in formats of OpenAPI 1.8.3 (`{"data": ...}`,
`{"error": {"code", "message", "suggestion"}}`, the documented codes and HTTP statuses), stateful, whose instances are
real sshd hosts on 127.0.0.N:22 (host key from cloud-init user_data, the registered key authorised, the sandbox's
emulated nvidia-smi through its session wrapper).

Knobs: capacity(type, regions, failing=[...]) (listed-but-failing regions), fault(name) (drop-launch-response,
ignore-user-data-host-key, quota-exceeded, preempt-while-booting), boot_seconds(s), launch_window(s) (429 when launches come faster), launch_requests(),
instances(), reset().
"""
from __future__ import annotations

import getpass
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

TYPES = {
    "gpu_1x_h100_pcie": {"name": "gpu_1x_h100_pcie", "description": "1x H100 (80 GB PCIe)",
                         "gpu_description": "H100 (80 GB PCIe)", "price_cents_per_hour": 249,
                         "specs": {"vcpus": 26, "memory_gib": 200, "storage_gib": 1024, "gpus": 1}},
    "gpu_1x_a10": {"name": "gpu_1x_a10", "description": "1x A10 (24 GB PCIe)", "gpu_description": "A10 (24 GB PCIe)",
                   "price_cents_per_hour": 75, "specs": {"vcpus": 30, "memory_gib": 200, "storage_gib": 1400, "gpus": 1}},
}
REGIONS = {"us-east-1": "Virginia, USA", "us-west-2": "Arizona, USA", "us-west-1": "California, USA"}
ERR = {
    "capacity": (400, "instance-operations/launch/insufficient-capacity", "Not enough capacity to fulfill launch request.", None),
    "auth": (401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
             "Check your API key or create a new one, then try again."),
    "missing": (404, "global/object-does-not-exist", "Specified instance does not exist.", None),
    "invalid": (400, "global/invalid-parameters", "Invalid request data.", None),
    "quota": (400, "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."),
}


class Emulator:
    def __init__(self, base: Path, session: Path, api_key: str | None = None):
        self.base = base
        self.session = session  # the sandbox's ForceCommand wrapper (emulated GPU tools on PATH)
        self.api_key = api_key
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"
        self.env = {"GPUOPS_CLOUD_SSH_USER": getpass.getuser()}
        self.key = None
        self._next_ip = 20
        self.reset()
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    # -- knobs ---------------------------------------------------------------------------------------------------
    def reset(self) -> None:
        with self.lock:
            for inst in getattr(self, "_instances", {}).values():
                self._stop_host(inst)
            self._instances: dict = {}
            self._keys: list = []
            self._capacity = {t: list(REGIONS) for t in TYPES}
            self._failing: set = set()
            self._faults: set = set()
            self._boot = 0.5
            self._window = 0.0
            self._last_launch = 0.0
            self._launches = 0

    def capacity(self, type_name: str, regions: list, failing: list = ()) -> None:
        self._capacity[type_name] = list(regions)
        self._failing = set(failing)

    def fault(self, name: str) -> None:
        self._faults.add(name)

    def boot_seconds(self, s: float) -> None:
        self._boot = s

    def launch_window(self, s: float) -> None:
        self._window = s

    def launch_requests(self) -> int:
        return self._launches

    def instances(self) -> list:
        with self.lock:
            return [self._view(i) for i in self._instances.values()]

    def close(self) -> None:
        self.reset()
        self.server.shutdown()

    # -- instances -----------------------------------------------------------------------------------------------
    def _view(self, inst: dict) -> dict:
        now = time.time()
        if inst["status"] == "booting" and inst.get("_preempt") is not None and now - inst["_t"] >= inst["_preempt"]:
            inst["status"] = "preempted"
            self._stop_host(inst)
        if inst["status"] == "booting" and now - inst["_t"] >= self._boot_of(inst):
            inst["status"] = "active"
            inst["ip"] = inst["_ip"]
        if inst["status"] == "terminating" and now - inst["_ended"] >= 0.5:
            inst["status"] = "terminated"
        return {k: v for k, v in inst.items() if not k.startswith("_")}

    def _boot_of(self, inst: dict) -> float:
        return inst["_boot"]

    def _start_host(self, inst: dict, user_data: str, public_key: str) -> None:
        d = self.base / inst["_ip"]
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        hk = d / "host_ed25519_key"
        doc = yaml.safe_load(user_data) if user_data else None
        keys = (doc or {}).get("ssh_keys") or {}
        if keys.get("ed25519_private") and "ignore-user-data-host-key" not in self._faults:
            fd = os.open(hk, os.O_WRONLY | os.O_CREAT, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(keys["ed25519_private"])
        else:
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hk)], check=True)
        (d / "authorized_keys").write_text(public_key + "\n")
        session = self._machine(d / "box")
        (d / "sshd_config").write_text(
            f"Port 22\nListenAddress {inst['_ip']}\nHostKey {hk}\nPidFile {d / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {d / 'authorized_keys'}\nAllowUsers {getpass.getuser()}\nPubkeyAuthentication yes\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nUsePAM no\n"
            f"StrictModes no\nPrintMotd no\nMaxStartups 64:30:128\nForceCommand {session}\n"
            "Subsystem sftp internal-sftp\n")
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True) if os.geteuid() == 0 else None
        subprocess.run([sshd, "-f", str(d / "sshd_config"), "-E", str(d / "sshd.log")], check=True)
        inst["_dir"] = d

    def _machine(self, box: Path) -> Path:
        """The instance's own machine: a home, GPU state and emulated tools, through a copy of the sandbox's session
        wrapper pointed at them (so one instance's runs and GPU load are not another's)."""
        sandbox = self.session.parent.parent
        (box / "bin").mkdir(parents=True)
        (box / "home").mkdir()
        shutil.copy2(sandbox / "bin" / "nvidia-smi", box / "bin" / "nvidia-smi")
        shutil.copy2(sandbox / "gpu.json", box / "gpu.json")
        session = box / "bin" / "session"
        session.write_text(self.session.read_text().replace(str(sandbox), str(box)))
        session.chmod(0o755)
        return session

    def home(self, instance_id: str) -> Path:
        return self.base / self._instances[instance_id]["_ip"] / "box" / "home"

    def _stop_host(self, inst: dict) -> None:
        d = inst.get("_dir")
        if not d:
            return
        try:
            os.kill(int((d / "sshd.pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        mark = f"GPUOPS_SANDBOX_DIR={d / 'box'}".encode()  # the machine is gone: so are its processes
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and mark in (entry / "environ").read_bytes().split(b"\0"):
                    os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                pass
        inst["_dir"] = None

    # -- HTTP ----------------------------------------------------------------------------------------------------
    def _handler(self):
        emu = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _send(self, status, doc, headers=()):
                body = json.dumps(doc).encode()
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _err(self, kind, headers=()):
                status, code, message, suggestion = ERR[kind]
                e = {"code": code, "message": message}
                if suggestion:
                    e["suggestion"] = suggestion
                self._send(status, {"error": e}, headers)

            def _authorized(self) -> bool:
                if emu.api_key and self.headers.get("Authorization") != f"Bearer {emu.api_key}":
                    self._err("auth")
                    return False
                return True

            def do_GET(self):
                if not self._authorized():
                    return
                p = self.path.split("/api/v1", 1)[-1]
                with emu.lock:
                    if p == "/instance-types":
                        return self._send(200, {"data": {t: {"instance_type": spec, "regions_with_capacity_available":
                                                             [{"name": r, "description": REGIONS[r]} for r in emu._capacity.get(t, [])]}
                                                         for t, spec in TYPES.items()}})
                    if p == "/instances":
                        return self._send(200, {"data": [emu._view(i) for i in emu._instances.values()]})
                    if p.startswith("/instances/"):
                        inst = emu._instances.get(p.rsplit("/", 1)[-1])
                        return self._send(200, {"data": emu._view(inst)}) if inst else self._err("missing")
                    if p == "/ssh-keys":
                        return self._send(200, {"data": emu._keys})
                self._send(404, {"error": {"code": "global/object-does-not-exist", "message": "Not found."}})

            def do_POST(self):
                if not self._authorized():
                    return
                p = self.path.split("/api/v1", 1)[-1]
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                drop = False
                with emu.lock:
                    if p == "/ssh-keys":
                        k = {"id": uuid.uuid4().hex, "name": body["name"], "public_key": body["public_key"]}
                        emu._keys.append(k)
                        return self._send(200, {"data": k})
                    if p == "/instance-operations/launch":
                        now = time.time()
                        if now - emu._last_launch < emu._window:
                            return self._send(429, {"error": {"code": "global/too-many-requests",
                                                              "message": "Too many requests."}}, [("Retry-After", "1")])
                        emu._last_launch = now
                        emu._launches += 1
                        region, t = body.get("region_name"), body.get("instance_type_name")
                        keys = [k for k in emu._keys if k["name"] in (body.get("ssh_key_names") or [])]
                        if t not in TYPES or region not in REGIONS or len(body.get("ssh_key_names") or []) != 1 or not keys:
                            return self._err("invalid")
                        if "quota-exceeded" in emu._faults:
                            return self._err("quota")
                        if region not in emu._capacity.get(t, []) or region in emu._failing:
                            return self._err("capacity")
                        iid = uuid.uuid4().hex
                        emu._next_ip += 1
                        inst = {"id": iid, "name": body.get("name"), "status": "booting",
                                "ssh_key_names": body["ssh_key_names"], "file_system_names": [],
                                "region": {"name": region, "description": REGIONS[region]}, "instance_type": TYPES[t],
                                "tags": body.get("tags") or [], "hostname": f"ip-127-0-0-{emu._next_ip}",
                                "actions": {a: {"available": True} for a in ("migrate", "rebuild", "restart",
                                                                             "cold_reboot", "terminate")},
                                "_ip": f"127.0.0.{emu._next_ip}", "_t": now, "_boot": emu._boot,
                                "_preempt": 0.3 if "preempt-while-booting" in emu._faults else None}
                        emu._start_host(inst, body.get("user_data") or "", keys[0]["public_key"])
                        emu._instances[iid] = inst
                        if "drop-launch-response" in emu._faults:
                            emu._faults.discard("drop-launch-response")
                            drop = True
                        else:
                            return self._send(200, {"data": {"instance_ids": [iid]}})
                    elif p == "/instance-operations/terminate":
                        ids = body.get("instance_ids") or []
                        if any(i not in emu._instances for i in ids):
                            return self._err("missing")
                        out = []
                        for i in ids:
                            inst = emu._instances[i]
                            if inst["status"] not in ("terminating", "terminated"):
                                inst["status"], inst["_ended"] = "terminating", time.time()
                                emu._stop_host(inst)
                            out.append(emu._view(inst))
                        return self._send(200, {"data": {"terminated_instances": out}})
                    else:
                        return self._send(404, {"error": {"code": "global/object-does-not-exist", "message": "Not found."}})
                if drop:  # the instance exists, the answer never arrives
                    self.close_connection = True
                    self.connection.shutdown(2)

        return H
