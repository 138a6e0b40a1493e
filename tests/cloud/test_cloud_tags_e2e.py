"""Issue #36 end to end: instances whose TTL tag is `inf`, `1e400` or garbage (set by anyone holding the account's
key) neither crash `gpuops ls` nor stop `gpuops reap --yes` for the whole account: the tag is ignored and reported,
the rest of the account is judged as before. Through the Lambda emulator."""
from __future__ import annotations

import json
import time

from gpuops.cloud import api
from support.cloud import API_KEY, TYPE


def _launch(cloud, tags: dict) -> str:
    client = api.Client(api.Secret(API_KEY), cloud.url)
    with client:
        if not client.ssh_keys():
            client.add_ssh_key("e2e", cloud.key.with_suffix(".pub").read_text())
        (iid,) = client.launch(region="us-east-1", type_name=TYPE, ssh_key="e2e", tags=tags)
    return iid


def test_ls_and_reap_survive_ttl_tags_that_are_not_times(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    bad = {}
    for i, value in enumerate(("inf", "1e400", "soon")):
        bad[_launch(cloud, {"gpuops-launch-id": f"Lbad{i}", "gpuops-profile": f"far{i}",
                            "gpuops-ttl-deadline": value})] = value
        time.sleep(0.01)
    past = _launch(cloud, {"gpuops-launch-id": "Lpast", "gpuops-profile": "old", "gpuops-ttl-deadline": "1000"})

    r = gpuops("ls")
    assert r.code == 0, r.all
    assert "internal error" not in r.all and "Traceback" not in r.all
    for iid, value in bad.items():
        assert iid in r.out
        assert f"instance {iid} (profile far" in r.err and f"gpuops-ttl-deadline='{value}' is not a time" in r.err, \
            r.err
    r = gpuops("ls", "--json")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert {i["id"] for i in doc["instances"]} >= set(bad) | {past}

    r = gpuops("reap", "--yes")
    assert r.code == 0, r.all
    assert "internal error" not in r.all
    assert f"terminated {past}" in r.err, r.err  # the rest of the account is still judged
    live = {i["id"] for i in cloud.instances() if i["status"] not in ("terminated", "terminating")}
    assert live == set(bad)  # a tag that is no time ends nothing


def test_down_by_id_never_takes_a_profile_tag_that_is_no_profile_name(cloud, gpuops):
    cloud.capacity(TYPE, ["us-east-1"])
    iid = _launch(cloud, {"gpuops-launch-id": "Lodd", "gpuops-profile": "../../evil; rm -rf ~"})
    r = gpuops("down", iid, "--yes")
    assert r.code == 0, r.all
    assert "rm -rf" not in r.all and "evil" not in r.all, r.all
    assert not [i for i in cloud.instances() if i["id"] == iid and i["status"] not in ("terminated", "terminating")]
