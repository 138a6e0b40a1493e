"""`--notify` (run, watch): when a run ends, say so where the user is.

- a desktop notification where this machine has one (`notify-send` on Linux, `osascript` on macOS), else a terminal
  bell on stderr;
- a webhook (Slack or Discord incoming webhook) from GPUOPS_NOTIFY_URL or the profile's `notify_url:`, posted as JSON.
The message holds the run's name, outcome, duration and cost, never an env value or a secret; the URL (a secret of
its own: whoever has it can post) is never printed. A notification that fails is a warning, never the command's
failure. Pure: `message`, `payload`; the rest talks (a local process, one HTTP POST).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from urllib.parse import urlsplit

WEBHOOK_TIMEOUT_S = 10.0
GOOD = ("succeeded", "done", "ok")


def message(name: str, outcome: str, seconds: float | None, cost: float | None) -> str:
    """`run grpo-7b succeeded after 1h 02m, $3.41`. Pure."""
    parts = [f"run {name} {outcome}"]
    if seconds is not None:
        m, s = divmod(int(round(seconds)), 60)
        h, m = divmod(m, 60)
        parts.append(f"after {h}h {m:02d}m" if h else (f"after {m}m {s:02d}s" if m else f"after {s}s"))
    text = " ".join(parts)
    return text + (f", ${cost:.2f}" if cost is not None else "")


def payload(url: str, text: str) -> dict:
    """Discord's webhooks take `content`, Slack's (and most others) `text`. Pure."""
    host = (urlsplit(url).hostname or "").lower()
    return {"content": text} if host.endswith(("discord.com", "discordapp.com")) else {"text": text}


def webhook_url(profile=None) -> str | None:
    return os.environ.get("GPUOPS_NOTIFY_URL") or getattr(profile, "notify_url", None) or None


def _where(url: str) -> str:
    """The webhook named without its path (the path is the secret)."""
    return urlsplit(url).hostname or "the webhook"


def post(url: str, text: str) -> None:
    """One POST of the JSON payload; raises OSError (urllib's errors are OSErrors) when it does not go through."""
    import json
    import urllib.request

    if urlsplit(url).scheme not in ("http", "https"):
        raise OSError("not an http(s) URL")
    req = urllib.request.Request(url, data=json.dumps(payload(url, text)).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "gpuops"})
    with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT_S) as resp:  # noqa: S310 - the user's own webhook
        resp.read()


def desktop(title: str, text: str) -> bool:
    """A desktop notification; False when this machine has none (then the caller rings the bell)."""
    try:
        if sys.platform == "darwin" and shutil.which("osascript"):
            script = f"display notification {_applescript(text)} with title {_applescript(title)}"
            return subprocess.run(["osascript", "-e", script], capture_output=True, timeout=10).returncode == 0
        if shutil.which("notify-send"):
            return subprocess.run(["notify-send", "--app-name=gpuops", title, text], capture_output=True,
                                  timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    return False


def _applescript(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def notify(out, *, name: str, outcome: str, seconds: float | None, cost: float | None, profile=None) -> dict:
    """Say that the run ended: desktop (or bell) and the webhook. Returns what was done, for --json and tests."""
    text = message(name, outcome, seconds, cost)
    title = "gpuops: " + ("done" if outcome in GOOD else outcome)
    done = {"text": text, "desktop": desktop(title, text), "bell": False, "webhook": None}
    if not done["desktop"]:
        try:
            out.stderr.write("\a")
            out.stderr.flush()
            done["bell"] = True
        except (OSError, ValueError, AttributeError):
            pass
    url = webhook_url(profile)
    if url:
        try:
            post(url, text)
            done["webhook"] = "sent"
        except OSError as exc:
            reason = getattr(exc, "reason", None) or getattr(exc, "code", None) or exc.__class__.__name__
            out.warn(f"notification to {_where(url)} failed: {reason}")
            done["webhook"] = "failed"
    return done
