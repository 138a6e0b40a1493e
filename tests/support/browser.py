"""The dashboard's browser tests share these: Debian's Chromium through Playwright (the `browser` fixture is in
tests/conftest.py), `gpuops dashboard` as a process of its own, where screenshots go, what a page must not do."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import ROOT

IMG = ROOT / "docs" / "img"


def shot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: docs/img/ only when GPUOPS_DOC_SCREENSHOTS=1 asks for the docs' pictures, else tmp."""
    return IMG if os.environ.get("GPUOPS_DOC_SCREENSHOTS") == "1" else tmp_path
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-quic", "--no-first-run", "--disable-sync"]

def start_dashboard(project: Path):
    """`gpuops dashboard --no-browser` as a process of its own: (process, URL)."""
    proc = subprocess.Popen([sys.executable, "-m", "gpuops", "dashboard", "--no-browser"], cwd=project,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    line = proc.stdout.readline().strip()
    assert line.startswith("http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
    return proc, line


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def watch_page(page, errors: list, requests: list) -> None:
    page.on("pageerror", lambda exc: errors.append(f"pageerror: {exc}"))
    page.on("console", lambda msg: errors.append(f"console {msg.type}: {msg.text}") if msg.type == "error" else None)
    page.on("request", lambda req: requests.append(req.url))


def open_page(browser, url: str, width: int, height: int):
    """A new context of that viewport with its page at url, watched for errors: (context, page, errors, requests)."""
    errors: list = []
    requests: list = []
    ctx = browser.new_context(viewport={"width": width, "height": height})
    page = ctx.new_page()
    watch_page(page, errors, requests)
    page.goto(url)
    return ctx, page, errors, requests


def assert_page_clean(url: str, errors: list, requests: list) -> None:
    """No script error on the page, and it asked nothing but the dashboard (or data: URLs)."""
    assert not errors, errors
    base = url.split("/?")[0]
    assert all(u.startswith(base + "/") or u.startswith("data:") for u in requests), requests
