"""The pure half of the cloud lifecycle, on Lambda's recorded shapes (OpenAPI 1.8.3 examples) and an explicit clock."""
from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuops.cloud import api, decisions as d
from gpuops.cloud.ledger import LAUNCHED, LAUNCHING, Ledger, Record
from gpuops.errors import ExitCode, UsageError
from support import DATA


DATA = json.loads((DATA / "lambda" / "openapi_examples.json").read_text())


# -- parsing ---------------------------------------------------------------------------------------------------
def test_instance_parsed_from_lambda_example():
    raw = DATA["terminate_data"]["terminated_instances"][0]
    inst = api.Instance.parse(raw)
    assert inst.id == "0920582c7ff041399e34823a0be62549"
    assert inst.status == "terminating" and inst.ip == "198.51.100.2" and inst.region == "us-west-1"
    assert inst.type.name == "gpu_8x_a100" and inst.type.price_cents_per_hour == 1032 and inst.type.gpus == 8


def test_instance_parsing_is_lenient():
    raw = dict(DATA["terminate_data"]["terminated_instances"][0])
    for k in ("ip", "private_ip", "name", "hostname"):
        raw.pop(k, None)
    raw["status"] = "hibernating"  # a status this version does not know
    raw["is_reserved"] = True  # in the spec's example, not its schema
    raw["region"] = {"name": "mars-north-1", "description": "?"}
    raw["tags"] = [{"key": "gpuops-launch-id", "value": "abc"}, {"bogus": 1}]
    inst = api.Instance.parse(raw)
    assert inst.ip is None and inst.private_ip is None
    assert inst.status == "hibernating" and inst.region == "mars-north-1"
    assert inst.tags == {"gpuops-launch-id": "abc"}
    assert api.Instance.parse({"status": "active"}) is None  # no id: not an instance


def test_instance_types_parsed_from_lambda_example():
    types = api.TypeAvailability.parse_map(DATA["instance_types_data"])
    gh = types["gpu_1x_gh200"]
    assert gh.type.price_per_hour == 1.49 and gh.type.gpus == 1 and gh.regions == ("us-west-1",)
    odd = api.TypeAvailability.parse_map({"gpu_9x_new": {"instance_type": {"name": "gpu_9x_new"},
                                                         "regions_with_capacity_available": [{"name": "xx-new-9"}]},
                                          "junk": 3})
    assert odd["gpu_9x_new"].regions == ("xx-new-9",) and "junk" not in odd


# -- errors ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["ApiErrorUnauthorized", "ApiErrorAccountInactive"])
def test_auth_errors_exit_3_with_hint(name):
    e = DATA["errors"][name]
    err = api.error_from_response(e["http"], {"error": {"code": e["code"], "message": e["message"]}}, {},
                                  "GET", "/instances")
    assert err.code == ExitCode.CONNECTION and err.hint and not err.transient
    assert e["code"] in err.message and e["message"] in err.message


def test_other_errors_carry_lambdas_code_message_and_suggestion():
    e = DATA["errors"]["ApiErrorQuotaExceeded"]
    err = api.error_from_response(400, {"error": {"code": e["code"], "message": e["message"],
                                                  "suggestion": e["suggestion"]}}, {}, "POST", "/instance-operations/launch")
    assert err.code == ExitCode.FAILED and err.api_code == "global/quota-exceeded"
    assert "Quota exceeded." in err.message and err.hint == e["suggestion"] and not err.transient
    cap = DATA["errors"]["ApiErrorInsufficientCapacity"]
    assert api.error_from_response(400, {"error": {"code": cap["code"], "message": cap["message"]}}, {}, "POST", "/x").capacity


def test_429_without_json_and_5xx_are_transient_5xx_ambiguous():
    r = api.error_from_response(429, None, {"retry-after": "7"}, "POST", "/instance-operations/launch")
    assert r.rate_limited and r.transient and r.retry_after == 7.0 and not r.ambiguous
    s = api.error_from_response(502, None, {}, "POST", "/instance-operations/launch")
    assert s.transient and s.ambiguous
    p = api.error_from_response(503, {"error": {"code": "provider/internal-unavailable", "message": "Try again"}}, {}, "GET", "/x")
    assert p.transient
    i = DATA["errors"]["ApiErrorInternal"]
    assert api.error_from_response(409, {"error": {"code": i["code"], "message": i["message"]}}, {}, "GET", "/x").transient


def test_backoff_grows_and_honours_retry_after():
    assert api.backoff_delay(0, None, rng=lambda: 1.0) == 1.0
    assert api.backoff_delay(3, None, rng=lambda: 1.0) == 8.0
    assert api.backoff_delay(10, None, rng=lambda: 1.0) == 30.0
    assert api.backoff_delay(0, 12.0, rng=lambda: 0.0) == 12.0


def test_api_key_is_redacted_everywhere():
    s = api.Secret("secret_abc123_KEY")
    assert "secret_abc123_KEY" not in repr(s) and "secret_abc123_KEY" not in str(s)
    c = api.Client(s, "http://127.0.0.1:9")
    try:
        assert "secret_abc123_KEY" not in repr(c)
        err = api.LambdaError("echo secret_abc123_KEY back", suggestion="use secret_abc123_KEY")
        assert "secret_abc123_KEY" not in err.message and "secret_abc123_KEY" not in (err.hint or "")
        assert "secret_abc123_KEY" not in str(err)
    finally:
        c.close()


# -- decisions ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,seconds", [("45s", 45), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1d", 86400),
                                          ("90", 90), ("1.5h", 5400)])
def test_parse_duration(text, seconds):
    assert d.parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "soon", "5x", "1h soon"])
def test_parse_duration_refuses(bad):
    with pytest.raises(UsageError):
        d.parse_duration(bad)


def test_format_duration():
    assert d.format_duration(45) == "45s" and d.format_duration(90) == "1m30s"
    assert d.format_duration(3700) == "1h01m" and d.format_duration(-120) == "-2m00s" and d.format_duration(None) == "-"


def test_launch_order_and_next_region():
    listed = ["us-east-1", "us-west-2", "europe-central-1"]
    assert d.launch_order(listed) == listed
    assert d.launch_order(listed, ["us-west-2", "asia-south-1", "us-east-1"]) == ["us-west-2", "us-east-1"]
    assert d.launch_order([], ["us-east-1"]) == []
    assert d.next_region(["a", "b"], {"a"}) == "b" and d.next_region(["a"], {"a"}) is None


def test_capacity_recheck_is_jittered_within_30_to_60s():
    assert d.capacity_recheck_delay(lambda: 0.0) == 30.0 and d.capacity_recheck_delay(lambda: 1.0) == 60.0
    assert d.readiness_deadline(1) == 20 * 60 and d.readiness_deadline(8) == 35 * 60


def test_cost_so_far():
    assert d.cost_so_far(2.49, 1000.0, 1000.0 + 3600 * 2) == 4.98
    assert d.cost_so_far(None, 0, 10) is None and d.cost_so_far(1.0, 100.0, 50.0) == 0.0


def test_guard_ttl_and_idle():
    g = d.guard(1000.0, ttl_deadline=900.0, idle_limit_s=None, last_active=None, launched_at=0.0)
    assert g.ttl_passed and g.expired and g.ttl_left == -100 and "TTL passed" in g.reasons()[0]
    g = d.guard(1000.0, ttl_deadline=2000.0, idle_limit_s=600.0, last_active=500.0, launched_at=0.0)
    assert not g.ttl_passed and g.idle_left == 100 and not g.expired
    g = d.guard(1200.0, ttl_deadline=None, idle_limit_s=600.0, last_active=500.0, launched_at=0.0)
    assert g.idle_passed and not g.ttl_passed
    assert not d.guard(10.0, ttl_deadline=None, idle_limit_s=None, last_active=None, launched_at=0.0).expired


def test_busy():
    assert d.busy(True, []) and d.busy(False, [0, 5.0]) and not d.busy(False, [0, 4.9])


def _inst(iid, status="active", tags=None, price=249, typ="gpu_1x_h100_pcie"):
    return api.Instance(id=iid, status=status, ip="127.0.0.9", region="us-east-1",
                        type=api.InstanceType(name=typ, price_cents_per_hour=price), tags=tags or {})


def _rec(lid, iid, profile, **kw):
    base = dict(launch_id=lid, profile=profile, instance_type="gpu_1x_h100_pcie", region="us-east-1",
                price_cents_per_hour=249, created_at=0.0, state=LAUNCHED, instance_id=iid, launched_at=0.0)
    base.update(kw)
    return Record(**base)


def test_ls_rows_marks_managed_and_raises_alerts():
    now = 7200.0
    insts = [_inst("i-mine", tags={d.TAG_LAUNCH: "L1"}), _inst("i-other"), _inst("i-orphan", tags={d.TAG_LAUNCH: "L2",
                                                                                               d.TAG_PROFILE: "lost"})]
    recs = [_rec("L1", "i-mine", "train", ttl_deadline=3600.0), _rec("L3", None, "coming", state=LAUNCHING)]
    rows, alerts = d.ls_rows(insts, recs, {"train": {"instance_id": "i-mine", "state": "active"}}, now)
    by = {r["id"]: r for r in rows}
    assert by["i-mine"]["managed"] and by["i-mine"]["expired"] and by["i-mine"]["cost_so_far"] == 4.98
    assert by["i-mine"]["ttl_left_s"] == -3600 and by["i-mine"]["has_profile"] and not by["i-mine"]["flags"]
    assert not by["i-other"]["managed"] and by["i-other"]["cost_so_far"] is None
    assert by["i-orphan"]["managed"] and by["i-orphan"]["profile"] == "lost"
    assert any("i-mine" in a and "TTL passed" in a and "gpuops down train" in a for a in alerts)
    assert any("i-orphan" in a and "no launch record on this machine" in a and "gpuops down i-orphan" in a
               for a in alerts)
    assert any("L3" in a and "launching" in a for a in alerts)
    assert [r["id"] for r in d.reap_candidates(rows)] == ["i-mine"]


def test_a_launch_cut_off_in_flight_is_one_row_judged_by_its_record_and_flagged():
    """kill -9 while the launch request was in flight: the record stays `launching` (no instance id) but carries the
    TTL; the instance carries the launch id. One row, its TTL, a loud line; not while its process still runs."""
    inst = _inst("i-1", status="booting", tags={d.TAG_LAUNCH: "L1", d.TAG_PROFILE: "k1"})
    rec = _rec("L1", None, "k1", state=LAUNCHING, ttl_deadline=100.0, launched_at=None)
    rows, alerts = d.ls_rows([inst], [rec], {}, 200.0)
    assert len(rows) == 1 and rows[0]["id"] == "i-1" and rows[0]["launch_id"] == "L1"
    assert rows[0]["expired"] and "cut off before writing profile 'k1'" in rows[0]["flags"][0]
    assert any("i-1" in a and "cut off" in a and "gpuops down i-1" in a for a in alerts)
    assert [r["id"] for r in d.reap_candidates(rows)] == ["i-1"]
    rows, alerts = d.ls_rows([inst], [rec], {}, 50.0, live_owners={"L1"})  # `up` still at work: nothing to flag
    assert not rows[0]["flags"] and not alerts


def test_ttl_from_the_instance_tag_when_this_machine_has_no_record():
    inst = _inst("i-2", tags={d.TAG_LAUNCH: "LX", d.TAG_PROFILE: "far", d.TAG_TTL: "1000"})
    rows, alerts = d.ls_rows([inst], [], {}, 1500.0)
    assert rows[0]["ttl_left_s"] == -500 and rows[0]["expired"]
    assert [r["id"] for r in d.reap_candidates(rows)] == ["i-2"]
    assert d.launch_tags("L", "p", 1234.9)[d.TAG_TTL] == "1234" and d.TAG_TTL not in d.launch_tags("L", "p")


def test_a_closed_record_whose_instance_still_runs_is_flagged_and_ended_instances_are_not():
    recs = [_rec("L1", "i-1", "p", state="terminated"), _rec("L2", "i-2", "q", ttl_deadline=1.0)]
    insts = [_inst("i-1", tags={d.TAG_LAUNCH: "L1"}), _inst("i-2", status="preempted", tags={d.TAG_LAUNCH: "L2"})]
    rows, alerts = d.ls_rows(insts, recs, {}, 1000.0)
    by = {r["id"]: r for r in rows}
    assert "the ledger has it terminated but the API shows it active" in by["i-1"]["flags"][0]
    assert not by["i-2"]["flags"] and by["i-2"]["cost_so_far"] is None and not by["i-2"]["expired"]
    assert d.reap_candidates(rows) == [] and len(alerts) == 1


def test_limits_are_above_zero_and_at_most_a_year():
    assert d.parse_limit("90m", "--ttl") == 5400
    for bad in ("0", "0s", "99999999999999d", "366d"):
        with pytest.raises(UsageError):
            d.parse_limit(bad, "--ttl")


def test_type_names_whatever_their_case():
    types = {"gpu_1x_a10": "A10", "gpu_1x_h100_pcie": "H100"}
    assert d.find_type(types, "GPU_1X_A10") == "A10" and d.find_type(types, "gpu_1x_a10") == "A10"
    assert d.find_type(types, "gpu_1x_a1") is None and "gpu_1x_a10" in d.type_suggestion(types, "GPU_1X_A1")


def test_terminated_instances_cost_nothing_and_are_not_reaped():
    rows, alerts = d.ls_rows([_inst("i-x", status="terminated", tags={d.TAG_LAUNCH: "L1"})],
                             [_rec("L1", "i-x", "p", ttl_deadline=1.0)], {"p": {}}, 10_000.0)
    assert rows[0]["cost_so_far"] is None and not rows[0]["expired"] and not alerts
    assert d.reap_candidates(rows) == []


def test_adopt_by_tag_never_by_name():
    insts = [api.Instance(id="a", status="booting", name="gpuops-x", tags={d.TAG_LAUNCH: "L1"}),
             api.Instance(id="b", status="booting", name="gpuops-x"),
             api.Instance(id="c", status="terminated", tags={d.TAG_LAUNCH: "L1"})]
    assert [i.id for i in d.adopt(insts, "L1")] == ["a"]


# -- keys ----------------------------------------------------------------------------------------------------------
def test_fingerprint_and_key_name_match_ssh_keygen(tmp_path):
    k = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f", str(k)], check=True)
    line = (tmp_path / "k.pub").read_text().strip()
    ssh_fp = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True).stdout.split()[1]
    assert d.fingerprint(line) == ssh_fp
    name = d.ssh_key_name(line)
    assert name.startswith("gpuops-") and len(name) == len("gpuops-") + 12 and "/" not in name and "+" not in name
    assert d.same_key(line, " ".join(line.split()[:2]) + " other-comment") and not d.same_key(line, "ssh-ed25519 AAAA")


def test_cloud_config_hands_our_host_key_to_cloud_init():
    from gpuops.cloud.keys import make_host_key

    priv, pub = make_host_key()
    text = d.cloud_config(priv, pub)
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    assert doc["ssh_deletekeys"] is True
    assert doc["ssh_keys"]["ed25519_public"] == pub and doc["ssh_keys"]["ed25519_private"].strip() == priv.strip()


# -- credentials ----------------------------------------------------------------------------------------------------
def test_credentials_env_then_dotenv_then_key_file(monkeypatch, isolated):
    from gpuops.cloud import credentials as c

    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    with pytest.raises(Exception) as e:
        c.load_api_key(isolated)
    assert e.value.code == ExitCode.CONNECTION and "LAMBDA_API_KEY" in e.value.message
    f = Path.home() / ".lambda_cloud" / "lambda_keys"
    f.parent.mkdir()
    f.write_text("# comment\napi_key = from_file_123\n")
    os.chmod(f, 0o644)
    with pytest.raises(Exception) as e:
        c.load_api_key(isolated)
    assert e.value.code == ExitCode.CONNECTION and e.value.hint.startswith("chmod 600 ")
    assert "from_file_123" not in e.value.message
    os.chmod(f, 0o600)
    key, src = c.load_api_key(isolated)
    assert key.reveal() == "from_file_123" and src == str(f)
    (isolated / ".env").write_text("LAMBDA_API_KEY=from_dotenv_456\n")
    os.chmod(isolated / ".env", 0o644)  # a .env others can read: refused as lambda_keys is
    with pytest.raises(Exception) as e:
        c.load_api_key(isolated)
    assert e.value.code == ExitCode.CONNECTION and e.value.hint.startswith("chmod 600 ")
    os.chmod(isolated / ".env", 0o600)
    assert c.load_api_key(isolated)[0].reveal() == "from_dotenv_456"
    monkeypatch.setenv("LAMBDA_API_KEY", "from_env_789")
    assert c.load_api_key(isolated)[0].reveal() == "from_env_789"
    assert c.is_production("https://cloud.lambda.ai/api/v1") and not c.is_production("http://127.0.0.1:8080/api/v1")


# -- ledger ---------------------------------------------------------------------------------------------------------
def test_ledger_records_are_private_and_atomic(tmp_path):
    led = Ledger(tmp_path / "cloud" / "ledger.json")
    led.add(_rec("L1", None, "p", state=LAUNCHING))
    assert stat.S_IMODE(led.path.stat().st_mode) == 0o600
    assert led.get("L1").state == LAUNCHING and led.open_for_profile("p")
    led.update("L1", instance_id="i-1", state=LAUNCHED)
    assert led.by_instance("i-1").launch_id == "L1"
    led.note_activity("i-1", 50.0)
    led.note_activity("i-1", 40.0)  # never goes back
    assert led.get("L1").last_active == 50.0
    assert not [p for p in led.path.parent.iterdir() if ".tmp" in p.name]


def test_corrupt_ledger_is_kept_aside_and_passed_over(tmp_path):
    said = []
    led = Ledger(tmp_path / "ledger.json", on_passed_over=said.append)
    led.path.write_text("{half")
    assert led.records() == [] and led.records() == []  # passed over, said once
    assert len(said) == 1 and "unreadable" in said[0] and "kept as" in said[0]
    (aside,) = tmp_path.glob("ledger.json.corrupt-*")
    assert aside.read_text() == "{half"
    led.add(_rec("L1", None, "p", state=LAUNCHING))  # a new ledger, the old one still aside
    led.path.write_text("null")
    assert led.records() == [] and len(list(tmp_path.glob("ledger.json.corrupt-*"))) == 2


def _claim(path, now, q):
    q.put(Ledger(Path(path)).claim_launch_slot(now, 12.0))


def test_launch_slot_is_shared_between_processes(tmp_path):
    path = tmp_path / "ledger.json"
    q = multiprocessing.get_context("fork").Queue()
    procs = [multiprocessing.get_context("fork").Process(target=_claim, args=(str(path), 1000.0, q)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    waits = sorted(q.get() for _ in procs)
    assert waits.count(0.0) == 1 and all(w == 12.0 for w in waits[1:])
    assert Ledger(path).claim_launch_slot(1012.0, 12.0) == 0.0


# -- the CLI without a server: errors are one message, the key never shows (even with --debug) ----------------------
def test_unreachable_api_is_one_message_and_the_key_stays_hidden_under_debug(gpuops, monkeypatch):
    key = "sk_live_NEVER_SHOW_ME_42"
    monkeypatch.setenv("LAMBDA_API_KEY", key)
    monkeypatch.setenv("GPUOPS_LAMBDA_API_URL", f"http://127.0.0.1:1/api/v1?key={key}")  # even a key in the URL
    monkeypatch.setenv("GPUOPS_CLOUD_BACKOFF_S", "0.01")
    for args in (["--debug", "cloud", "types"], ["ls", "--json"], ["--debug", "reap", "--yes"]):
        r = gpuops(*args)
        assert r.code == 1, r.all
        assert "cannot reach" in r.err and key not in r.all
    assert "Traceback" in gpuops("--debug", "ls").err


def test_missing_key_exits_3_with_where_to_put_it(gpuops, monkeypatch):
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    r = gpuops("ls")
    assert r.code == 3 and "no Lambda API key" in r.err and "lambda_keys" in r.err


def test_up_refuses_bad_durations_and_guards_before_any_request(gpuops, monkeypatch, tmp_path):
    monkeypatch.setenv("LAMBDA_API_KEY", "k")
    monkeypatch.setenv("GPUOPS_LAMBDA_API_URL", "http://127.0.0.1:1/api/v1")
    r = gpuops("up", "x", "--type", "gpu_1x_a10", "--ttl", "soon", "--key", str(tmp_path))
    assert r.code == 2 and "not a duration: 'soon'" in r.err
    r = gpuops("up", "x", "--type", "gpu_1x_a10", "--guard", "on-instance", "--key", str(tmp_path))
    assert r.code == 2 and "needs --ttl or --idle" in r.err


def test_cuda_error_802_is_recognised_as_transient():
    from gpuops.verify.checks import FAIL, PASS, CheckResult
    from gpuops.verify.host import cuda_error_802

    e802 = CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "torch.cuda.is_available() is False",
                       detail="CUDA call failed lazily at initialization with error: CUDA error: system not yet "
                              "initialized (802)")
    assert cuda_error_802([e802])
    assert not cuda_error_802([CheckResult("cuda.runtime", "CUDA tensor test", FAIL, "timed out", detail="hung")])
    assert not cuda_error_802([CheckResult("cuda.runtime", "CUDA tensor test", PASS, "ok")])


@pytest.mark.parametrize("args", [["up", "--help"], ["ls", "--help"], ["cloud", "types", "--help"], ["reap", "--help"]])
def test_cloud_help_imports_neither_httpx_nor_the_heavy_libraries(args):
    import sys

    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "gpuops", *args], capture_output=True, text=True,
                       env={**os.environ, "NO_COLOR": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in p.stderr.splitlines() if line.startswith("import time:")}
    heavy = {"httpx", "httpcore", "paramiko", "fabric", "pydantic", "rich", "yaml", "cryptography", "tenacity"}
    assert not imported & heavy, sorted(imported & heavy)


def test_a_long_watch_notes_activity_once_a_minute_for_both_nodes_of_a_fleet(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from gpuops.cloud.meter import ActivityNoter
    from gpuops.profiles.model import CloudInfo

    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    led = Ledger()
    for lid, iid in (("L0", "i-0"), ("L1", "i-1")):
        led.add(_rec(lid, iid, "pair", state=LAUNCHED))
    cloud = CloudInfo(instance_id="i-0", launch_id="L0", nodes=[{"instance_id": "i-0", "launch_id": "L0"},
                                                                 {"instance_id": "i-1", "launch_id": "L1"}])
    now = [0.0]
    noter = ActivityNoter(SimpleNamespace(cloud=cloud), every_s=60.0, clock=lambda: now[0])
    now[0] = 30.0
    assert not noter.seen(True, [90.0])  # not a minute yet: no ledger write
    assert led.get("L0").last_active is None
    now[0] = 61.0
    assert noter.seen(True, [90.0])
    assert led.get("L0").last_active and led.get("L1").last_active  # a fleet's job runs on every node
    assert not noter.seen(True, [90.0])
    assert not ActivityNoter(SimpleNamespace(cloud=None), every_s=0.0).seen(True, [90.0])  # not a managed profile
