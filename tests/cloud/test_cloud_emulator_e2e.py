"""The local Lambda API emulator (gpuops.cloud.emulator) over real HTTP: every response is checked against the OpenAPI
1.8.3 file's schema for its path, method and status (jsonschema, $refs resolved); the lifecycle clock, capacity, the
429 launch window, faults (dropped answer, 5xx, slow boot, preemption, quota), auth; and instances that are real sshd
hosts on 127.0.0.N:22 presenting the user_data host key and accepting only the registered key."""
from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support import DATA


SPEC_FILE = DATA / "lambda" / "lambda-cloud-openapi-1.8.3.json"
KEY = "secret_test-emulator_0123456789abcdef.fedcba9876543210"
TYPE = "gpu_1x_h100_pcie"


# -- conformance: each response against the spec ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def spec():
    from jsonschema import Draft202012Validator
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    doc = json.loads(SPEC_FILE.read_text())
    registry = Registry().with_resource("urn:lambda", Resource.from_contents(doc, default_specification=DRAFT202012))
    templates = [(re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", p) + "$"), p) for p in doc["paths"]]

    def check(method: str, path: str, status: int, body) -> None:
        tpl = next(t for rx, t in templates if rx.match(path.split("?")[0]))
        op = doc["paths"][tpl][method.lower()]
        resp = op["responses"].get(str(status))
        if resp is None:  # undeclared (429, 5xx): Lambda's error envelope, global/internal-error's schema for 5xx
            assert status in (429, 500), (method, path, status, body)
            assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
            if status == 500:
                ptr = "urn:lambda#/components/schemas/ApiErrorInternal"
                Draft202012Validator({"$ref": ptr}, registry=registry).validate(body["error"])
            return
        ptr = "urn:lambda#/paths/" + tpl.replace("~", "~0").replace("/", "~1") + \
              f"/{method.lower()}/responses/{status}/content/application~1json/schema"
        Draft202012Validator({"$ref": ptr}, registry=registry).validate(body)
        checked.append((method, tpl, status))

    checked: list = []
    check.checked = checked
    return check


@pytest.fixture(scope="module")
def server(sshd, tmp_path_factory):
    from gpuops.cloud.emulator.server import Emulator

    emu = Emulator(tmp_path_factory.mktemp("lambda-emu"), api_key=KEY, boot_seconds=0.3, terminate_seconds=0.3,
                   launch_window=0).start()
    yield emu
    emu.close()
    assert not [i for i in emu.instances() if _sshd_up(i)]


@pytest.fixture
def emu(server):
    server.reset()
    yield server
    server.reset()  # every instance host stopped


def _sshd_up(inst) -> bool:
    try:
        with socket.create_connection((inst["_address"], 22), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture
def api(emu, spec):
    def call(method: str, path: str, body=None, *, auth: str | None = f"Bearer {KEY}", raw: bool = False):
        headers = {"Content-Type": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        req = urllib.request.Request(emu.url + path, method=method, headers=headers,
                                     data=json.dumps(body).encode() if body is not None else None)
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status, doc, hdrs = r.status, json.loads(r.read()), r.headers
        except urllib.error.HTTPError as e:
            status, doc, hdrs = e.code, json.loads(e.read()), e.headers
        spec(method, "/api/v1" + path, status, doc)
        return (status, doc, hdrs) if raw else (status, doc)

    return call


@pytest.fixture
def client_key(starts_hosts, tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f", str(key)], check=True)
    return key


def _add_key(api, key: Path, name="e2e") -> dict:
    status, doc = api("POST", "/ssh-keys", {"name": name, "public_key": key.with_suffix(".pub").read_text()})
    assert status == 200, doc
    return doc["data"]


def _launch(api, region="us-east-1", type_=TYPE, **extra):
    return api("POST", "/instance-operations/launch", {"region_name": region, "instance_type_name": type_,
                                                        "ssh_key_names": ["e2e"], **extra})


def _wait(api, iid, status, limit=10.0) -> dict:
    deadline = time.monotonic() + limit
    while True:
        inst = api("GET", f"/instances/{iid}")[1]["data"]
        if inst["status"] == status or time.monotonic() > deadline:
            assert inst["status"] == status, inst
            return inst
        time.sleep(0.05)


# -- auth ------------------------------------------------------------------------------------------------------------
def test_auth_bearer_basic_raw_and_refused(api):
    assert api("GET", "/instances")[0] == 200
    assert api("GET", "/instances", auth="Basic " + base64.b64encode(f"{KEY}:".encode()).decode())[0] == 200
    assert api("GET", "/instances", auth=KEY)[0] == 200
    for bad in (None, "Bearer wrong", "Basic " + base64.b64encode(b"wrong:").decode()):
        status, doc = api("GET", "/instances", auth=bad)
        assert status == 401 and doc["error"]["code"] == "global/invalid-api-key", doc
    status, doc = api("POST", "/instance-operations/launch", {}, auth="Bearer wrong")
    assert status == 401 and doc["error"]["message"] == "API key was invalid, expired, or deleted."


def test_admin_surface_refused_without_the_key(emu):
    req = urllib.request.Request(emu.url.replace("/api/v1", "/_emulator/boot_seconds"), method="POST",
                                 data=b'{"s": 99}', headers={"Authorization": "Bearer wrong"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    assert emu.state()["clock"]["boot_seconds"] == 0.3
    req = urllib.request.Request(emu.url.replace("/api/v1", "/_emulator/boot_seconds"), method="POST",
                                 data=b'{"s": 7}', headers={"Authorization": f"Bearer {KEY}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["data"]["clock"]["boot_seconds"] == 7


# -- lifecycle -------------------------------------------------------------------------------------------------------
def test_lifecycle_booting_active_terminating_terminated_and_host_stopped(api, emu, client_key):
    emu.boot_seconds(3.0)  # `booting` seen at the first look, however loaded the machine (0.3 s was not always)
    _add_key(api, client_key)
    status, doc = _launch(api, name="run-1", tags=[{"key": "gpuops-launch-id", "value": "L1"}])
    assert status == 200, doc
    iid = doc["data"]["instance_ids"][0]
    inst = api("GET", f"/instances/{iid}")[1]["data"]
    assert inst["status"] == "booting" and "ip" not in inst
    assert inst["actions"]["restart"] == {"available": False, "reason_code": "vm-has-not-launched",
                                          "reason_description": "The instance has not launched yet."}
    inst = _wait(api, iid, "active")
    assert inst["ip"].startswith("127.0.0.") and inst["ip"] != "127.0.0.1"
    assert inst["tags"] == [{"key": "gpuops-launch-id", "value": "L1"}] and inst["name"] == "run-1"
    assert inst["instance_type"]["price_cents_per_hour"] == 249 and inst["region"]["name"] == "us-east-1"
    assert [i["id"] for i in api("GET", "/instances")[1]["data"]] == [iid]
    status, doc = api("POST", f"/instances/{iid}", {"name": "renamed"})
    assert status == 200 and doc["data"]["name"] == "renamed"
    status, doc = api("POST", "/instance-operations/restart", {"instance_ids": [iid]})
    assert status == 200 and doc["data"]["restarted_instances"][0]["status"] == "booting"
    _wait(api, iid, "active")
    status, doc = api("POST", "/instance-operations/terminate", {"instance_ids": [iid]})
    assert status == 200 and doc["data"]["terminated_instances"][0]["status"] == "terminating"
    assert not _sshd_up(emu.instances()[0])  # the host is down as soon as terminate answers
    inst = _wait(api, iid, "terminated")
    assert inst["actions"]["terminate"]["reason_code"] == "vm-is-terminating"


def test_unknown_instance_is_object_does_not_exist(api):
    for method, path, body in (("GET", "/instances/nope", None), ("POST", "/instances/nope", {"name": "x"}),
                               ("POST", "/instance-operations/terminate", {"instance_ids": ["nope"]}),
                               ("POST", "/instance-operations/restart", {"instance_ids": ["nope"]})):
        status, doc = api(method, path, body)
        assert status == 404 and doc["error"] == {"code": "global/object-does-not-exist",
                                                  "message": "Specified instance does not exist."}, (path, doc)


def test_launch_validation(api, client_key):
    _add_key(api, client_key)
    status, doc = _launch(api, region="mars-1")
    assert status == 400 and doc["error"]["code"] == "global/invalid-parameters"
    status, doc = _launch(api, type_="gpu_1x_nothing")
    assert status == 400 and doc["error"]["code"] == "global/invalid-parameters"
    status, doc = api("POST", "/instance-operations/launch", {"region_name": "us-east-1", "instance_type_name": TYPE,
                                                               "ssh_key_names": ["e2e", "e2e"]})
    assert status == 400 and "Exactly one SSH key" in doc["error"]["message"]
    status, doc = api("POST", "/instance-operations/launch", {"region_name": "us-east-1", "instance_type_name": TYPE,
                                                               "ssh_key_names": ["missing"]})
    assert status == 404 and doc["error"]["code"] == "global/object-does-not-exist" and doc["error"]["suggestion"]
    status, doc = _launch(api, hostname="Bad_Host")
    assert status == 400 and doc["error"]["code"] == "global/invalid-parameters"


# -- capacity --------------------------------------------------------------------------------------------------------
def test_capacity_listed_regions_listed_but_failing_and_slots(api, emu, client_key):
    _add_key(api, client_key)
    emu.capacity(TYPE, ["us-west-2", "us-south-1"], failing=["us-south-1"])
    types = api("GET", "/instance-types")[1]["data"]
    assert [r["name"] for r in types[TYPE]["regions_with_capacity_available"]] == ["us-west-2", "us-south-1"]
    for region in ("us-east-1", "us-south-1"):  # not listed; listed but the launch fails
        status, doc = _launch(api, region=region)
        assert status == 400 and doc["error"] == {"code": "instance-operations/launch/insufficient-capacity",
                                                  "message": "Not enough capacity to fulfill launch request."}
    emu.set_capacity(TYPE, "us-west-2", 1)
    status, doc = _launch(api, region="us-west-2")
    assert status == 200
    assert "us-west-2" not in [r["name"] for r in
                               api("GET", "/instance-types")[1]["data"][TYPE]["regions_with_capacity_available"]]
    assert _launch(api, region="us-west-2")[1]["error"]["code"] == "instance-operations/launch/insufficient-capacity"
    api("POST", "/instance-operations/terminate", {"instance_ids": doc["data"]["instance_ids"]})
    assert _launch(api, region="us-west-2")[0] == 200  # the slot came back
    assert len(emu.instances()) == 2


# -- rate limit and faults -------------------------------------------------------------------------------------------
def test_launch_window_answers_429_with_retry_after(api, emu, client_key):
    _add_key(api, client_key)
    emu.launch_window(0.6)
    assert _launch(api)[0] == 200
    status, doc, hdrs = api("POST", "/instance-operations/launch", {"region_name": "us-east-1",
                                                                     "instance_type_name": TYPE,
                                                                     "ssh_key_names": ["e2e"]}, raw=True)
    assert status == 429 and hdrs["Retry-After"] == "1" and doc["error"]["code"] == "global/too-many-requests"
    time.sleep(0.65)
    assert _launch(api)[0] == 200
    assert emu.launch_requests() == 3 and len(emu.instances()) == 2


def test_dropped_launch_answer_still_creates_exactly_one_instance(api, emu, client_key):
    _add_key(api, client_key)
    emu.fault("drop-launch-response")
    with pytest.raises((http.client.RemoteDisconnected, urllib.error.URLError, ConnectionError)):
        _launch(api, tags=[{"key": "gpuops-launch-id", "value": "L7"}])
    insts = api("GET", "/instances")[1]["data"]
    assert len(insts) == 1 and insts[0]["tags"] == [{"key": "gpuops-launch-id", "value": "L7"}]
    assert _launch(api)[0] == 200  # once only


def test_5xx_faults(api, emu, client_key):
    _add_key(api, client_key)
    emu.fault("5xx", times=2, path="/instances")
    assert api("GET", "/instances")[0] == 500
    assert api("GET", "/instance-types")[0] == 200  # another path is not affected
    status, doc = api("GET", "/instances")
    assert status == 500 and doc["error"]["code"] == "global/internal-error"
    assert api("GET", "/instances")[0] == 200
    emu.fault("launch-5xx-after-create")
    assert _launch(api)[0] == 500
    assert len(api("GET", "/instances")[1]["data"]) == 1  # ambiguous: created anyway


def test_slow_boot_preemption_quota_and_account_inactive(api, emu, client_key):
    _add_key(api, client_key)
    emu.fault("slow-boot", seconds=30)
    slow = _launch(api)[1]["data"]["instance_ids"][0]
    emu.clear_faults()
    fast = _launch(api)[1]["data"]["instance_ids"][0]
    _wait(api, fast, "active")
    assert api("GET", f"/instances/{slow}")[1]["data"]["status"] == "booting"
    emu.advance(31)
    assert api("GET", f"/instances/{slow}")[1]["data"]["status"] == "active"
    emu.preempt(fast)
    assert api("GET", f"/instances/{fast}")[1]["data"]["status"] == "preempted"
    emu.fault("preempt-while-booting", seconds=0.1)
    pre = _launch(api)[1]["data"]["instance_ids"][0]
    _wait(api, pre, "preempted")
    emu.clear_faults()
    emu.fault("quota-exceeded")
    status, doc = _launch(api)
    assert status == 400 and doc["error"] == {"code": "global/quota-exceeded", "message": "Quota exceeded.",
                                              "suggestion": "Contact Support to increase your quota."}
    emu.fault("account-inactive", times=1)
    status, doc = api("GET", "/instances")
    assert status == 403 and doc["error"]["code"] == "global/account-inactive"


# -- instances are real hosts ----------------------------------------------------------------------------------------
def _cloud_config(host_key: Path) -> str:
    priv = "".join(f"    {line}\n" for line in host_key.read_text().splitlines())
    return (f"#cloud-config\nssh_deletekeys: true\nssh_keys:\n  ed25519_private: |\n{priv}"
            f"  ed25519_public: {host_key.with_suffix('.pub').read_text().strip()}\n")


def _ssh(inst, user, key: Path, known_hosts: Path, command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={known_hosts}",
                           "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                           "-o", "ConnectTimeout=5", f"{user}@{inst['ip']}", command],
                          capture_output=True, text=True, timeout=30)


def test_instance_presents_user_data_host_key_and_accepts_only_the_registered_key(api, emu, client_key, tmp_path):
    host_key = tmp_path / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    _add_key(api, client_key)
    iid = _launch(api, type_="gpu_8x_h100_sxm5", user_data=_cloud_config(host_key))[1]["data"]["instance_ids"][0]
    inst = _wait(api, iid, "active")
    pub = host_key.with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{inst['ip']} {pub[0]} {pub[1]}\n")  # pinned before the first connection
    r = _ssh(inst, emu.user, client_key, known, "nvidia-smi --query-gpu=name --format=csv,noheader")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["NVIDIA H100 80GB HBM3"] * 8
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    r = _ssh(inst, emu.user, other, known, "true")
    assert r.returncode == 255 and "Permission denied" in r.stderr
    # a job left running dies with the instance
    r = _ssh(inst, emu.user, client_key, known, "nohup sleep 300 >/dev/null 2>&1 & echo started")
    assert r.stdout.strip() == "started"
    from gpuops.sandbox import host

    d = Path(emu.instances()[0]["_dir"])
    assert host.session_processes(d)
    (emu.home(iid) / "checkpoint.pt").write_text("weights")
    api("POST", "/instance-operations/terminate", {"instance_ids": [iid]})
    assert not host.session_processes(d)
    assert not (emu.home(iid) / "checkpoint.pt").exists()  # termination wipes the disk
    assert _ssh(inst, emu.user, client_key, known, "true").returncode == 255


def test_without_user_data_the_host_key_is_the_instances_own(api, emu, client_key, tmp_path):
    host_key = tmp_path / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    _add_key(api, client_key)
    emu.fault("ignore-user-data-host-key")
    iid = _launch(api, user_data=_cloud_config(host_key))[1]["data"]["instance_ids"][0]
    inst = _wait(api, iid, "active")
    pub = host_key.with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{inst['ip']} {pub[0]} {pub[1]}\n")
    r = _ssh(inst, emu.user, client_key, known, "true")
    assert r.returncode == 255 and "REMOTE HOST IDENTIFICATION HAS CHANGED" in r.stderr


# -- keys, images, file systems, firewall ----------------------------------------------------------------------------
def test_ssh_keys_add_generate_duplicate_delete(api, client_key):
    k = _add_key(api, client_key)
    status, doc = api("POST", "/ssh-keys", {"name": "e2e", "public_key": k["public_key"]})
    assert status == 400 and doc["error"]["code"] == "global/invalid-parameters"
    status, doc = api("POST", "/ssh-keys", {"name": "generated"})
    assert status == 200 and "PRIVATE KEY" in doc["data"]["private_key"]
    assert api("POST", "/ssh-keys", {"name": "bad", "public_key": "not a key"})[0] == 400
    assert [x["name"] for x in api("GET", "/ssh-keys")[1]["data"]] == ["e2e", "generated"]
    assert api("DELETE", f"/ssh-keys/{k['id']}") == (200, {"data": {}})
    assert api("DELETE", f"/ssh-keys/{k['id']}")[0] == 400
    assert [x["name"] for x in api("GET", "/ssh-keys")[1]["data"]] == ["generated"]


def test_images_file_systems_and_firewall_rules(api):
    images = api("GET", "/images")[1]["data"]
    assert {i["architecture"] for i in images} == {"x86_64", "arm64"}
    status, doc = api("POST", "/filesystems", {"name": "data1", "region": "us-east-1"})
    assert status == 200 and doc["data"]["mount_point"].endswith("/lambda/nfs/data1")
    assert api("POST", "/filesystems", {"name": "data1", "region": "us-east-1"})[1]["error"]["code"] == \
        "global/duplicate"
    assert api("POST", "/filesystems", {"name": "1bad", "region": "us-east-1"})[0] == 400
    assert [f["name"] for f in api("GET", "/file-systems")[1]["data"]] == ["data1"]
    assert api("DELETE", f"/filesystems/{doc['data']['id']}")[1] == {"data": {"deleted_ids": [doc["data"]["id"]]}}
    assert api("DELETE", "/filesystems/nope")[0] == 404
    rules = [{"protocol": "tcp", "port_range": [22, 22], "source_network": "10.0.0.0/8", "description": "ssh"}]
    assert api("PUT", "/firewall-rules", {"data": rules})[1]["data"] == rules
    assert api("GET", "/firewall-rules")[1]["data"] == rules


def test_filesystems_attach_share_measure_and_refuse_deletion_while_mounted(api, emu, client_key, tmp_path):
    """A filesystem is one folder every instance attaching it sees at its mount point (by name: the default one; by
    id: the one asked); `bytes_used` is measured, `is_in_use` follows the instances; deletion is refused while one
    mounts it and then removes its data; a launch in another region than the filesystem's is refused as Lambda does."""
    host_key = tmp_path / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    _add_key(api, client_key)
    fs = api("POST", "/filesystems", {"name": "shared-1", "region": "us-east-1"})[1]["data"]
    assert fs["is_in_use"] is False and fs["bytes_used"] == 0 and fs["created_by"]["email"]
    status, doc = _launch(api, region="us-west-1", file_system_names=["shared-1"])
    assert status == 400 and doc["error"]["code"] == "instance-operations/launch/file-system-in-wrong-region"
    assert "us-east-1" in doc["error"]["message"] and "us-west-1" in doc["error"]["message"]
    status, doc = _launch(api, file_system_names=["nope"])
    assert status == 404 and doc["error"]["code"] == "global/object-does-not-exist"
    status, doc = _launch(api, file_system_mounts=[{"mount_point": "/etc/x", "file_system_id": fs["id"]}])
    assert status == 400 and doc["error"]["code"] == "global/invalid-parameters"
    assert emu.instances() == []
    a = _launch(api, file_system_names=["shared-1"], user_data=_cloud_config(host_key))[1]["data"]["instance_ids"][0]
    b = _launch(api, file_system_mounts=[{"mount_point": "/data/mine", "file_system_id": fs["id"]}],
                user_data=_cloud_config(host_key))[1]["data"]["instance_ids"][0]
    ia, ib = _wait(api, a, "active"), _wait(api, b, "active")
    assert ia["file_system_names"] == ["shared-1"] and ib["file_system_names"] == ["shared-1"]
    mount_a = ia["file_system_mounts"][0]["mount_point"]
    mount_b = ib["file_system_mounts"][0]["mount_point"]
    assert mount_a == fs["mount_point"] and mount_b.endswith("/data/mine")
    pub = host_key.with_suffix(".pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{ia['ip']} {pub[0]} {pub[1]}\n{ib['ip']} {pub[0]} {pub[1]}\n")
    r = _ssh(ia, emu.user, client_key, known, f"head -c 5000 /dev/zero > {mount_a}/w && echo from-a > {mount_a}/note")
    assert r.returncode == 0, r.stderr
    r = _ssh(ib, emu.user, client_key, known, f"cat {mount_b}/note")
    assert r.returncode == 0 and r.stdout == "from-a\n", r.stderr
    listed = api("GET", "/file-systems")[1]["data"][0]
    assert listed["is_in_use"] is True and listed["bytes_used"] == 5007
    status, doc = api("DELETE", f"/filesystems/{fs['id']}")
    assert status == 400 and doc["error"]["code"] == "filesystems/filesystem-in-use" and a in doc["error"]["message"]
    api("POST", "/instance-operations/terminate", {"instance_ids": [a, b]})
    assert (emu.fs_dir("shared-1") / "note").read_text() == "from-a\n"  # outlives the instances
    # a terminating instance still holds it (Lambda refuses the deletion until it has ended): in use until then
    deadline = time.monotonic() + 30
    while api("GET", "/file-systems")[1]["data"][0]["is_in_use"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert api("GET", "/file-systems")[1]["data"][0]["is_in_use"] is False
    folder = emu.fs_dir("shared-1")
    assert api("DELETE", f"/filesystems/{fs['id']}")[1] == {"data": {"deleted_ids": [fs["id"]]}}
    assert not folder.exists() and api("GET", "/file-systems")[1]["data"] == []


def test_every_declared_status_of_the_used_endpoints_answers_as_the_spec_says(api, emu, client_key, spec):
    """Each answer gpuops reads (endpoint and status, success and error) is produced here and validated against the
    spec: on its own, so it holds in any order and on any xdist worker (the tests above check behaviour)."""
    start = len(spec.checked)
    _add_key(api, client_key)
    api("GET", "/instances")
    api("GET", "/instances", auth=None)
    api("GET", "/instances/nope")
    api("GET", "/instance-types")
    assert _launch(api, region="mars-1")[0] == 400
    assert api("POST", "/instance-operations/launch", {"region_name": "us-east-1", "instance_type_name": TYPE,
                                                       "ssh_key_names": ["missing"]})[0] == 404
    fs = api("POST", "/filesystems", {"name": "spec-fs", "region": "us-east-1"})[1]["data"]
    status, doc = _launch(api, file_system_names=["spec-fs"])
    assert status == 200, doc
    (iid,) = doc["data"]["instance_ids"]
    assert api("POST", f"/instances/{iid}", {"name": "renamed"})[0] == 200
    _wait(api, iid, "active")
    assert api("POST", "/instance-operations/restart", {"instance_ids": [iid]})[0] == 200
    assert api("DELETE", f"/filesystems/{fs['id']}")[0] == 400  # in use
    api("POST", "/instance-operations/terminate", {"instance_ids": ["nope"]})
    assert api("POST", "/instance-operations/terminate", {"instance_ids": [iid]})[0] == 200
    api("DELETE", "/filesystems/nope")
    api("GET", "/file-systems")
    seen = set(spec.checked[start:])
    for need in (("GET", "/api/v1/instances", 200), ("GET", "/api/v1/instances", 401),
                 ("GET", "/api/v1/instances/{id}", 404), ("POST", "/api/v1/instance-operations/launch", 400),
                 ("POST", "/api/v1/instance-operations/launch", 404), ("POST", "/api/v1/instance-operations/launch", 200),
                 ("POST", "/api/v1/instance-operations/terminate", 404), ("POST", "/api/v1/ssh-keys", 200),
                 ("GET", "/api/v1/instance-types", 200), ("POST", "/api/v1/instances/{id}", 200),
                 ("POST", "/api/v1/instance-operations/restart", 200), ("DELETE", "/api/v1/filesystems/{id}", 404),
                 ("DELETE", "/api/v1/filesystems/{id}", 400), ("GET", "/api/v1/file-systems", 200)):
        assert need in seen, need


# -- the CLI daemon --------------------------------------------------------------------------------------------------
def test_sandbox_up_cloud_runs_a_daemon_across_processes(starts_hosts, gpuops, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    r = gpuops("sandbox", "up", "--cloud", "--json", "--boot-seconds", "0.2")
    assert r.code == 0, r.all
    info = json.loads(r.out)
    try:
        assert info["api_key"].startswith("secret_") and info["user"]
        req = urllib.request.Request(info["url"] + "/instance-types",
                                     headers={"Authorization": f"Bearer {info['api_key']}"})
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert TYPE in json.loads(resp.read())["data"]
        r = gpuops("sandbox", "up", "--cloud")  # already running: the same one
        assert r.code == 0 and info["url"] in r.out and f"export LAMBDA_API_KEY={info['api_key']}" in r.out
        r = gpuops("sandbox", "status", "--cloud")
        assert r.code == 0 and "no instances" in r.out
    finally:
        r = gpuops("sandbox", "down", "--cloud")
    assert r.code == 0 and "stopped" in r.all
    assert gpuops("sandbox", "status", "--cloud").code == 1


def test_state_survives_a_restart_of_the_emulator(tmp_path, client_key):
    """The daemon saves its account after every change: a restarted emulator knows its keys, instances and faults."""
    from gpuops.cloud.emulator.server import Emulator

    first = Emulator(tmp_path / "emu", api_key=KEY, boot_seconds=0, launch_window=0)
    first._add_key({"name": "e2e", "public_key": client_key.with_suffix(".pub").read_text()})
    iid = first._launch({"region_name": "us-east-1", "instance_type_name": TYPE, "ssh_key_names": ["e2e"]})
    first._save()
    first.fault("quota-exceeded")
    second = Emulator(tmp_path / "emu", api_key=KEY)
    try:
        assert [k["name"] for k in second._keys] == ["e2e"] and second._faults == {"quota-exceeded": {"times": None}}
        assert [i["id"] for i in second.instances()] == [iid] and second.instances()[0]["status"] == "active"
    finally:
        second.close()
    third = Emulator(tmp_path / "emu", api_key=KEY)  # close() ended what it ran, and saved so
    assert third.instances()[0]["status"] == "terminated" and not _sshd_up(third.instances()[0])
