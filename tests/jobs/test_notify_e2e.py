"""`--notify` (watch, run): a desktop notification (notify-send, here a fake on PATH that records its arguments), a
terminal bell where there is none, and a webhook posted to a local HTTP server; the message holds the run's name,
outcome, duration and cost, never an env value."""
from __future__ import annotations

import http.server
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from gpuops import notify


class Hook:
    """A webhook on 127.0.0.1 that records each POST's JSON body."""

    def __init__(self, status: int = 200):
        self.bodies: list = []
        hook = self

        class H(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                hook.bodies.append({"path": self.path, "type": self.headers.get("Content-Type"),
                                    "json": json.loads(self.rfile.read(n))})
                self.send_response(status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/XXXXsecretpath"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def hook():
    h = Hook()
    yield h
    h.close()


@pytest.fixture
def fake_notify_send(tmp_path, monkeypatch):
    """A notify-send on PATH that writes its arguments to a file (this machine may have no desktop)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    log = tmp_path / "notify-send.log"
    script = bin_dir / "notify-send"
    script.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> {log}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return log


def test_the_message_and_the_payloads_are_pure():
    assert notify.message("grpo", "succeeded", 3725, 3.414) == "run grpo succeeded after 1h 02m, $3.41"
    assert notify.message("x", "failed", 65, None) == "run x failed after 1m 05s"
    assert notify.payload("https://hooks.slack.com/services/a/b/c", "t") == {"text": "t"}
    assert notify.payload("https://discord.com/api/webhooks/1/abc", "t") == {"content": "t"}


def _train(gpuops, sandbox):
    Path("train.py").write_text("import os, time\nprint('step 1 loss 0.5', flush=True)\ntime.sleep(1)\n"
                                "print('step 2 loss 0.25', flush=True)\n")
    r = gpuops("train", "-p", "sandbox", "--script", "train.py", "--env", "HF_TOKEN=hf_sekritvalue42", "--json")
    assert r.code == 0, r.all
    return json.loads(r.out)["run_id"]


def test_watch_notify_sends_desktop_and_webhook_without_secrets(sandbox, gpuops, hook, fake_notify_send, monkeypatch):
    import yaml

    data = yaml.safe_load(sandbox["profile"].read_text())
    data["price_per_hour"] = 2.0
    data["notify_url"] = "${MY_SLACK_HOOK}"  # the profile names the variable, the URL stays out of the file
    sandbox["profile"].write_text(yaml.safe_dump(data))
    monkeypatch.setenv("MY_SLACK_HOOK", hook.url)
    rid = _train(gpuops, sandbox)
    r = gpuops("watch", rid, "-p", "sandbox", "--notify")
    assert r.code == 0, r.all
    said = fake_notify_send.read_text()
    assert "gpuops: done" in said and f"run {rid} succeeded after" in said, said
    assert len(hook.bodies) == 1, hook.bodies
    body = hook.bodies[0]
    assert body["type"] == "application/json" and body["path"].endswith("XXXXsecretpath")
    text = body["json"]["text"]
    assert text.startswith(f"run {rid} succeeded after") and "$0.0" in text, text
    assert "sekrit" not in json.dumps(hook.bodies) and "sekrit" not in said and "\a" not in r.err
    assert "secretpath" not in r.all


def test_without_a_desktop_the_terminal_bell_and_a_failing_webhook_is_a_warning(sandbox, gpuops, monkeypatch, tmp_path):
    empty = tmp_path / "nobin"
    empty.mkdir()
    rid = _train(gpuops, sandbox)
    for tool in ("notify-send", "osascript"):  # hide a real one, keep what the CLI itself needs (ssh, rsync)
        assert not (empty / tool).exists()
    monkeypatch.setenv("PATH", ":".join(p for p in os.environ["PATH"].split(":")
                                        if not (Path(p) / "notify-send").exists()))
    dead = Hook(status=404)
    monkeypatch.setenv("GPUOPS_NOTIFY_URL", dead.url)
    try:
        r = gpuops("watch", rid, "-p", "sandbox", "--notify")
    finally:
        dead.close()
    assert r.code == 0, r.all
    assert "\a" in r.err
    assert "notification to 127.0.0.1 failed: Not Found" in r.err and "secretpath" not in r.all
    r = gpuops("watch", rid, "-p", "sandbox")  # without --notify: nothing
    assert "\a" not in r.err


from support.cloud import TYPE


def test_run_notify_at_the_end_of_a_whole_run(cloud, gpuops, hook, fake_notify_send, monkeypatch):
    monkeypatch.setenv("GPUOPS_NOTIFY_URL", hook.url)
    Path("train.py").write_text("import os\nprint('step 1 loss 0.5', os.environ.get('WANDB_API_KEY', ''), "
                                "flush=True)\n")
    Path(".env").write_text("WANDB_API_KEY=wandb_sekrit_value\n")
    r = gpuops("run", "--type", TYPE, "--key", str(cloud.key), "--yes", "--json", "--script", "train.py", "--notify")
    assert r.code == 0, r.all
    doc = json.loads(r.out)
    assert len(hook.bodies) == 1, (hook.bodies, r.err)
    text = hook.bodies[0]["json"]["text"]
    assert text.startswith(f"run {doc['run']} succeeded after") and f"${doc['total_cost']:.2f}" in text, text
    assert "sekrit" not in text and f"run {doc['run']} succeeded" in fake_notify_send.read_text()
