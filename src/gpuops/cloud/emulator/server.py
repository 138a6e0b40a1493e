"""A local Lambda Cloud API (OpenAPI 1.8.3) on 127.0.0.1: real HTTP, the documented paths, fields, status codes and
error codes, Bearer auth, and instances that are real sandbox hosts (sshd on their own 127.0.0.N:22).

In-process:   emu = Emulator(state_dir, api_key="..."); emu.start(); emu.url -> "http://127.0.0.1:PORT/api/v1"
              knobs: capacity(), set_capacity(), capacity_later(), fault(), clear_faults(), boot_seconds(),
              terminate_seconds(), launch_window(), advance(), clock_rate(), preempt(), set_status(),
              drop_connections(), gpu_fault(), unreachable(), mount_root(), fs_dir(), instances(), launch_requests(),
              reset(), close()
Other processes: the same knobs under POST /_emulator/<knob> with a JSON object of keyword arguments, GET
              /_emulator/state (Bearer key required, like the API). `gpuops sandbox up --cloud` runs it as a daemon.

Filesystems: each is one folder (<state_dir>/filesystems/<id>) that every instance attaching it sees at its mount
point, a symlink under the mount root (mount_root(); the API reports the rooted path, so the path the API reports is
the path the job sees). State (instances, keys, capacity and capacity to come, faults, clock) is saved to <state_dir>/state.json after every change and read back
on start, so a restarted daemon knows its instances. Instance hosts live in <state_dir>/hosts/<instance id>/.
"""
from __future__ import annotations

import base64
import binascii
import getpass
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ...paths import write_private
from . import catalog

LAUNCH_WINDOW_S = 12.0  # Lambda: one launch request per 12 s

# (HTTP status, code, message, suggestion) as in the OpenAPI file's ApiError* schemas (their defaults)
ERRORS = {
    "invalid-api-key": (401, "global/invalid-api-key", "API key was invalid, expired, or deleted.",
                        "Check your API key or create a new one, then try again."),
    "account-inactive": (403, "global/account-inactive", "Your account is inactive.",
                         "Make sure you have verified your email address and have a valid payment method. "
                         "Contact Support if problems continue."),
    "instance-not-found": (404, "global/object-does-not-exist", "Specified instance does not exist.", None),
    "invalid-parameters": (400, "global/invalid-parameters", "Invalid request data.", None),
    "insufficient-capacity": (400, "instance-operations/launch/insufficient-capacity",
                              "Not enough capacity to fulfill launch request.", None),
    "quota-exceeded": (400, "global/quota-exceeded", "Quota exceeded.", "Contact Support to increase your quota."),
    "launch-resource-not-found": (404, "global/object-does-not-exist", "Specified SSH key does not exist.",
                                  "Check the name of the SSH key, or add it first."),
    "launch-fs-not-found": (404, "global/object-does-not-exist", "Specified filesystem does not exist.",
                            "Check the name or id of the filesystem, or create it first."),
    "filesystem-not-found": (404, "global/object-does-not-exist", "Filesystem was not found.", None),
    "filesystem-in-use": (400, "filesystems/filesystem-in-use", "Filesystem is in use by an instance.", None),
    "duplicate": (400, "global/duplicate", "A filesystem with this name already exists.", None),
    "fs-wrong-region": (400, "instance-operations/launch/file-system-in-wrong-region",
                        "File system is in a different region than the instance.",
                        "Launch the instance in the filesystem's region, or attach a filesystem in the instance's "
                        "region."),
    "internal-error": (500, "global/internal-error", "An internal server error occurred.",
                       "Try again later. Contact Support if the problem persists."),
    "unknown": (500, "global/unknown", "An unknown error occurred.", "Try again later."),  # seen live on terminate
    "not-found": (404, "global/object-does-not-exist", "Not found.", None),
    "too-many-requests": (429, "global/too-many-requests", "Too many requests.", "Wait and try again."),
}

# faults: name -> what it does (a fault with times=N fires N times, then clears; times=None: until cleared)
FAULTS = {
    "5xx": "the next matching request (path= substring, default every API path) answers 500 global/internal-error "
           "(error=unknown: global/unknown, as seen live on terminate)",
    "slow-answer": "matching requests (path= substring) wait seconds= (default 3) before they are carried out",
    "slow-launch-answer": "a launch creates the instance, then answers only after seconds= (default 10)",
    "null-data": "matching requests (path= substring) answer 200 with {\"data\": null}",
    "no-price": "GET /instance-types lists type= (default every type) without price_cents_per_hour",
    "key-added-elsewhere": "the next POST /ssh-keys meets the same key, registered under the same name a moment "
                           "before by another client (refused as a duplicate)",
    "recycle-ip": "the next instance launched gets the address of the instance that ended last (address= to choose "
                  "it): Lambda hands a freed IP to a new machine",
    "launch-5xx-after-create": "a launch creates the instance, then answers 500 (an ambiguous failure)",
    "drop-launch-response": "a launch creates the instance, then closes the connection without an answer",
    "slow-boot": "instances launched while set boot in seconds= (default 60) instead of boot_seconds",
    "preempt-while-booting": "instances launched while set become `preempted` after seconds= (default 0.3)",
    "quota-exceeded": "launches answer 400 global/quota-exceeded",
    "account-inactive": "every API request answers 403 global/account-inactive",
    "revoked-key": "the key is revoked: after= (default 0) requests answered as usual, every later request (path= "
                   "substring) answers 401 global/invalid-api-key",
    "ignore-user-data-host-key": "instance hosts present a generated host key instead of user_data's",
    "unhealthy": "instances launched while set become `unhealthy` instead of `active`",
    "old-driver": "instances launched while set run NVIDIA driver version= (default 535.183.01, CUDA 12.2), as an "
                  "instance from an older image does",
    "proxy-page": "the next matching request (path= substring) is answered by a proxy in front of the API, before the "
                  "key is checked: HTTP status= (default 502) with nginx's HTML error page, not Lambda's JSON",
}
ONCE_BY_DEFAULT = {"5xx", "launch-5xx-after-create", "drop-launch-response", "proxy-page", "slow-launch-answer",
                   "key-added-elsewhere", "recycle-ip"}
# the titles of nginx's own error pages (what a reverse proxy in front of an API answers)
NGINX_TITLES = {401: "401 Authorization Required", 403: "403 Forbidden", 404: "404 Not Found", 407: "407 Proxy "
                "Authentication Required", 502: "502 Bad Gateway", 503: "503 Service Temporarily Unavailable",
                504: "504 Gateway Time-out"}
HOSTNAME = re.compile(r"^[a-z0-9][0-9a-z-]{0,62}$")
TAG_KEY = re.compile(r"^[a-z][a-z0-9-:]+$")
FS_NAME = re.compile(r"^[a-zA-Z]+[0-9a-zA-Z-]*$")
MOUNT_POINT = re.compile(r"^(/home|/lambda/nfs|/data)[//a-zA-Z0-9-]*$")  # RequestedFilesystemMountEntry's pattern
LIVE_MOUNT = ("booting", "active", "unhealthy")  # an instance in these states holds its filesystems mounted
ACTIONS = ("migrate", "rebuild", "restart", "cold_reboot", "terminate")


class ApiError(Exception):
    def __init__(self, kind: str, message: str | None = None, headers: dict | None = None):
        status, code, default, suggestion = ERRORS[kind]
        self.status = status
        self.body = {"code": code, "message": message or default}
        if suggestion:
            self.body["suggestion"] = suggestion
        self.headers = headers or {}
        super().__init__(code)


class _Drop(Exception):
    """Close the connection without an answer."""


class _Delayed(Exception):
    """The request was carried out; its answer leaves only after `seconds` (slept outside the emulator's lock)."""

    def __init__(self, status: int, doc, seconds: float):
        super().__init__("delayed")
        self.status, self.doc, self.seconds = status, doc, seconds


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def new_api_key() -> str:
    return f"secret_gpuops-emulator_{secrets.token_hex(16)}.{secrets.token_hex(16)}"


class Emulator:
    def __init__(self, state_dir: Path, *, api_key: str | None = None, port: int = 0, boot_seconds: float = 2.0,
                 terminate_seconds: float = 1.0, launch_window: float = LAUNCH_WINDOW_S, python: str | None = None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.api_key = api_key or new_api_key()
        self.user = getpass.getuser()  # instances log in as this user (Lambda's images: ubuntu)
        self.python = python
        self.lock = threading.RLock()
        self._port = port
        self.server: ThreadingHTTPServer | None = None
        self._defaults = {"boot_seconds": boot_seconds, "terminate_seconds": terminate_seconds,
                          "launch_window": launch_window}
        self._fresh()
        self._load()
        self._clock.update(self._defaults)  # the clock options this emulator was started with win over saved ones

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> "Emulator":
        handler = _handler(self)
        self.server = _Server(("127.0.0.1", self._port), handler)
        threading.Thread(target=self.server.serve_forever, name="lambda-emulator", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server, "start() first"
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"

    @property
    def env(self) -> dict:
        """Environment for a gpuops process using this emulator."""
        return {"LAMBDA_API_KEY": self.api_key, "GPUOPS_LAMBDA_API_URL": self.url, "GPUOPS_CLOUD_SSH_USER": self.user}

    def close(self) -> None:
        """Stop every instance host (their instances end `terminated`: nothing keeps running), then the server."""
        with self.lock:
            for inst in self._instances.values():
                self._stop_host(inst)
                if inst["status"] not in ("terminated", "preempted"):
                    inst["status"], inst["_ended"] = "terminated", self.now()
            self._save()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _fresh(self) -> None:
        self._instances: dict = {}
        self._keys: list = []
        self._filesystems: list = []
        self._firewall_rules: list = [{"protocol": "tcp", "port_range": [22, 22], "source_network": "0.0.0.0/0",
                                       "description": "Allow SSH from anywhere"}]
        self._capacity: dict = {t: {r: catalog.DEFAULT_SLOTS for r in catalog.DEFAULT_REGIONS}
                                for t in catalog.available_types()}
        self._failing: list = []  # [type, region]: listed as available, the launch fails
        self._arrivals: list = []  # [emulated time, type, region, slots]: capacity that frees up then (capacity_later)
        self._faults: dict = {}
        self._clock = dict(self._defaults, offset=0.0, rate=1.0, anchor_real=0.0, anchor_emu=0.0)
        self._last_launch = -1e18
        self._launches = 0
        self._requests = 0
        self._image: dict = {"python": None, "files": {}}  # what new instances boot with (the `image` knob)
        self._mount_root: str = str(self.dir / "root")  # the instances' "/" for mount points (the `mount_root` knob)

    def _load(self) -> None:
        try:
            doc = json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return
        for k in ("instances", "keys", "filesystems", "firewall_rules", "capacity", "failing", "arrivals", "faults",
                  "clock", "last_launch", "launches", "image", "mount_root"):
            if k in doc:
                setattr(self, "_" + k, doc[k])

    def _save(self) -> None:
        doc = {k: getattr(self, "_" + k) for k in ("instances", "keys", "filesystems", "firewall_rules", "capacity",
                                                   "failing", "arrivals", "faults", "clock", "last_launch", "launches",
                                                   "image", "mount_root")}
        write_private(self.dir / "state.json", json.dumps(doc, indent=1))

    def now(self) -> float:
        """The emulator's clock: real time, moved on by advance() and run faster by clock_rate()."""
        c = self._clock
        rate = c.get("rate", 1.0)
        if rate == 1.0 and not c.get("anchor_real"):
            return time.time() + c["offset"]
        return c.get("anchor_emu", 0.0) + (time.time() - c.get("anchor_real", 0.0)) * rate + c["offset"]

    # -- knobs (also POST /_emulator/<name>) ---------------------------------------------------------------------
    def reset(self) -> None:
        """Terminate every instance (hosts stopped), forget keys and filesystems (their folders removed), restore default
        capacity, clock and no faults."""
        with self.lock:
            for inst in self._instances.values():
                self._stop_host(inst)
            shutil.rmtree(self.dir / "filesystems", ignore_errors=True)
            shutil.rmtree(self.dir / "root", ignore_errors=True)  # the default root's links (another root is left)
            self._fresh()
            self._save()

    def capacity(self, type_name: str, regions: list, failing: list = (), slots: int = catalog.DEFAULT_SLOTS) -> None:
        """`type_name` has `slots` free instances in each of `regions` and none elsewhere; `failing` regions are listed
        as available but their launches answer insufficient-capacity."""
        with self.lock:
            self._capacity[type_name] = {r: slots for r in regions}
            self._failing = [f for f in self._failing if f[0] != type_name] + [[type_name, r] for r in failing]
            self._save()

    def capacity_later(self, type_name: str, regions: list, after: float, slots: int = catalog.DEFAULT_SLOTS) -> None:
        """`type_name` gets `slots` free instances in each of `regions` once `after` seconds of the emulator's clock
        have passed (capacity freed by other customers; with clock_rate() the wait passes faster)."""
        with self.lock:
            at = self.now() + float(after)
            self._arrivals += [[at, type_name, r, int(slots)] for r in regions]
            self._save()

    def _arrive(self) -> None:
        """Capacity whose time has come (capacity_later) becomes free."""
        now = self.now()
        due = [a for a in self._arrivals if a[0] <= now]
        if not due:
            return
        self._arrivals = [a for a in self._arrivals if a[0] > now]
        for _, t, r, slots in due:
            self._capacity.setdefault(t, {})[r] = slots

    def set_capacity(self, type_name: str, region: str, slots: int, failing: bool = False) -> None:
        with self.lock:
            self._capacity.setdefault(type_name, {})[region] = slots
            self._failing = [f for f in self._failing if f != [type_name, region]]
            if failing:
                self._failing.append([type_name, region])
            self._save()

    def fault(self, name: str, times: int | None = -1, **params) -> None:
        """Inject a fault (see FAULTS). times: how often it fires (default: once for 5xx and the launch faults,
        else until clear_faults)."""
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
        if params.get("error") is not None and params["error"] not in ERRORS:
            raise ValueError(f"unknown error {params['error']!r}; known: {', '.join(ERRORS)}")
        with self.lock:
            self._faults[name] = {"times": (1 if name in ONCE_BY_DEFAULT else None) if times == -1 else times,
                                  **params}
            self._save()

    def clear_faults(self) -> None:
        with self.lock:
            self._faults = {}
            self._save()

    def image(self, python: str | None = None, files: dict | None = None) -> None:
        """What instances launched from now on boot with: `python`, an image of sandbox/image.py IMAGES (e.g.
        "lambda-stack": the system python3 has a CUDA build of torch and pip) or None (the test machine's python3);
        `files`, {path under the home: text} placed on the instance's disk (a host's own ~/.config/pip/pip.conf)."""
        from ...sandbox.image import IMAGES

        if python is not None and python not in IMAGES:
            raise ValueError(f"unknown image python {python!r}; known: {', '.join(IMAGES)}")
        with self.lock:
            self._image = {"python": python, "files": dict(files or {})}
            self._save()

    def mount_root(self, path: str) -> None:
        """Where the instances' mount points live on this machine: a filesystem mounted at /lambda/nfs/NAME is the
        folder PATH/lambda/nfs/NAME, and the API reports that path (the emulated instances share this machine's
        disk, so the path the API reports is the path the job sees). Default <state_dir>/root; "/" (a daemon run as
        root) reports Lambda's own paths. Applies to filesystems created and mounts made from now on."""
        with self.lock:
            self._mount_root = str(Path(path).resolve()) if path != "/" else "/"
            self._save()

    def fs_dir(self, name: str) -> Path:
        """The folder holding filesystem NAME's data (what every instance attaching it sees at its mount point)."""
        with self.lock:
            fs = next((f for f in self._filesystems if f["name"] == name), None)
            if fs is None:
                raise KeyError(name)
            return Path(fs["_dir"])

    def boot_seconds(self, s: float) -> None:
        self._set_clock(boot_seconds=s)

    def terminate_seconds(self, s: float) -> None:
        self._set_clock(terminate_seconds=s)

    def launch_window(self, s: float) -> None:
        self._set_clock(launch_window=s)

    def advance(self, s: float) -> None:
        """Move the emulator's clock forward (boots and terminations complete sooner)."""
        with self.lock:
            self._clock["offset"] += s
            self._save()

    def clock_rate(self, rate: float) -> None:
        """From now on the emulator's clock runs `rate` times as fast as real time (boots, terminations and
        capacity_later arrivals come sooner); 1 is real time."""
        if not rate > 0:
            raise ValueError("rate must be above 0")
        with self.lock:
            now = self.now()
            self._clock.update(rate=float(rate), anchor_real=time.time(), anchor_emu=now - self._clock["offset"])
            self._save()

    def _set_clock(self, **kw) -> None:
        with self.lock:
            self._clock.update(kw)
            self._save()

    def preempt(self, instance_id: str) -> None:
        self.set_status(instance_id, "preempted")

    def set_status(self, instance_id: str, status: str) -> None:
        with self.lock:
            inst = self._instances[instance_id]
            inst["status"] = status
            if status in ("preempted", "terminated", "terminating"):
                inst["_ended"] = self.now()
                self._stop_host(inst)
            self._save()

    def gpu_fault(self, instance_id: str, fault: str, kill_jobs: bool = False) -> list:
        """A running instance's GPU fails from now on, as `gpuops sandbox up --fault FAULT` describes it (`xid=79`: the
        driver's "GPU has fallen off the bus" line in its kernel log; `ecc`: uncorrectable ECC errors; ...): its
        nvidia-smi and kernel log say so, the API keeps saying `active`. Its job keeps running, or with kill_jobs
        dies at that moment (SIGKILL, as a CUDA job does when its GPU falls off the bus). Returns its faults."""
        from ...paths import write_atomic
        from ...sandbox.host import kill_gpu_jobs
        from ...sandbox.nvidia_smi import fault_problem

        with self.lock:
            f = Path(self._get(instance_id)["_dir"]) / "gpu.json"
            state = json.loads(f.read_text())
            why = fault_problem(fault, int(state.get("count") or 1))
            if why:
                raise ValueError(why)
            state["faults"] = list(state.get("faults") or []) + [fault]
            write_atomic(f, json.dumps(state, indent=1))
            if kill_jobs:  # the fault is in the host's data before the job dies: whoever looks after sees it
                kill_gpu_jobs(f.parent)
            return state["faults"]

    def unreachable(self, instance_id: str) -> int:
        """The instance stops answering on the network for good: its sshd and every SSH connection to it end (new
        ones are refused), its jobs keep running, the API keeps saying `active`. Returns the connections cut."""
        from ...sandbox import host

        with self.lock:
            listener = host.sshd_pid(Path(self._get(instance_id)["_dir"]))
        cut = self.drop_connections(instance_id)
        if listener:
            try:
                os.kill(listener, signal.SIGKILL)
            except OSError:
                pass
        return cut

    def drop_connections(self, instance_id: str) -> int:
        """The instance's network drops for a moment: every SSH connection to it is cut (its sshd's per-connection
        processes end); sshd keeps listening, the jobs keep running and the API keeps saying `active`. Returns how
        many connections were cut."""
        from ...sandbox import host

        with self.lock:
            inst = self._get(instance_id)
            listener = host.sshd_pid(Path(inst["_dir"])) if inst.get("_dir") else None
        cut = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if listener and ppid == listener:
                try:
                    os.kill(int(stat.parent.name), signal.SIGKILL)
                    cut += 1
                except OSError:
                    pass
        return cut

    def instances(self) -> list:
        """Every instance as GET /instances shows it (terminated ones too), plus `_dir` and `_address` (its sandbox host)."""
        with self.lock:
            return [dict(self._view(i), _dir=i.get("_dir"), _address=i.get("_address"))
                    for i in self._instances.values()]

    def home(self, instance_id: str) -> Path:
        """The instance's remote $HOME on this machine (what a test plants or inspects on the 'instance' disk)."""
        with self.lock:
            return Path(self._get(instance_id)["_dir"]) / "home"

    def launch_requests(self) -> int:
        return self._launches

    def state(self) -> dict:
        with self.lock:
            return {"url": self.url if self.server else None, "user": self.user, "clock": self._clock,
                    "capacity": self._capacity, "failing": self._failing, "arrivals": self._arrivals,
                    "faults": self._faults, "image": self._image.get("python"),
                    "launch_requests": self._launches, "instances": self.instances()}

    KNOBS = ("reset", "capacity", "set_capacity", "capacity_later", "fault", "clear_faults", "boot_seconds",
             "terminate_seconds", "launch_window", "advance", "clock_rate", "preempt", "set_status", "image",
             "drop_connections", "gpu_fault", "unreachable", "mount_root")

    # -- faults --------------------------------------------------------------------------------------------------
    def _take_fault(self, name: str, path: str = "") -> dict | None:
        f = self._faults.get(name)
        if f is None or (f.get("path") and f["path"] not in path):
            return None
        if f.get("times") is not None:
            f["times"] -= 1
            if f["times"] <= 0:
                del self._faults[name]
        return f

    def proxy_page(self, path: str) -> tuple[int, str] | None:
        """The `proxy-page` fault: (status, nginx's HTML error page) for this API path, or None."""
        if not path.startswith("/api/v1/"):
            return None
        with self.lock:
            f = self._take_fault("proxy-page", path.split("?", 1)[0][len("/api/v1"):])
            if f is None:
                return None
            self._save()
        status = int(f.get("status") or 502)
        title = NGINX_TITLES.get(status) or f"{status} {HTTPStatus(status).phrase}"
        return status, (f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{title}</h1></center>"
                        "\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a dropped answer's socket errors are expected
        pass


def _handler(emu: Emulator):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "gpuops-lambda-emulator"

        def log_message(self, *a):
            pass

        def _send(self, status: int, doc, headers: dict | None = None) -> None:
            body = json.dumps(doc).encode()
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body_bytes(self) -> bytes:
            n = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(n) if n else b""

        def _body(self):
            raw = self._body_bytes()
            if not raw:
                return None
            try:
                return json.loads(raw)
            except ValueError:
                raise ApiError("invalid-parameters", "The request body is not valid JSON.") from None

        def _page(self, status: int, html: str) -> None:
            body = html.encode()
            self.send_response(status)
            self.send_header("Server", "nginx")
            if status == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="proxy"')
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _any(self) -> None:
            page = emu.proxy_page(self.path)
            if page:
                self._body_bytes()  # read the request's body, so the connection stays usable
                return self._page(*page)
            try:
                if not emu.authorized(self.headers.get("Authorization")):
                    raise ApiError("invalid-api-key")
                body = self._body()
                if self.path.startswith("/_emulator/"):
                    status, doc = self._admin(body)
                else:
                    with emu.lock:
                        slow = emu._take_fault("slow-answer", self.path.split("?", 1)[0])
                    if slow:  # outside the lock: the other requests go on meanwhile
                        time.sleep(float(slow.get("seconds", 3)))
                    try:
                        with emu.lock:
                            try:
                                status, doc = emu.handle(self.command, self.path, body)
                            finally:
                                emu._save()
                    except _Delayed as d:
                        time.sleep(d.seconds)
                        status, doc = d.status, d.doc
                self._send(status, doc)
            except ApiError as e:
                self._send(e.status, {"error": e.body}, e.headers)
            except _Drop:
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        def _admin(self, body) -> tuple[int, object]:
            name = self.path.split("?", 1)[0][len("/_emulator/"):].strip("/")
            if self.command == "GET" and name == "state":
                return 200, {"data": emu.state()}
            if self.command == "POST" and name in Emulator.KNOBS:
                try:
                    getattr(emu, name)(**(body or {}))
                except (TypeError, ValueError, KeyError) as e:
                    raise ApiError("invalid-parameters", f"{name}: {e}") from None
                return 200, {"data": emu.state()}
            raise ApiError("not-found")

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _any

    return Handler
