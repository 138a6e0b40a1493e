"""`gpuops dashboard`: parse, start the dashboard (gpuops.dashboard), print its URL. Nothing heavy at import."""
from __future__ import annotations

import typer

from .app import app, output


@app.command("dashboard")
def dashboard(
    port: int = typer.Option(0, "--port", min=0, max=65535, help="Port to listen on (0: a free one)."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Only print the URL; do not open a browser."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on. Keep the default (this machine "
                                                          "only) unless you know who else can reach it."),
) -> None:
    """A local web page of what you pay for and what it is doing: the account's instances (uptime, $/hour, cost so
    far, TTL, filesystems; "billing, unwatched" when no run follows one), this project's runs (state, exit code and
    cause, cost; sortable, filterable) and pipelines, each run's page (what it is: GPUs, instance type, host, script,
    start, $/h; loss and throughput by step over its whole history, per-GPU utilisation, memory, power and
    temperature, training signals, the log) and two or more runs compared on one chart. Fed by the same stream
    `gpuops watch` reads (one per run however many tabs are open); every run's metrics are kept in
    ./runs/metrics.sqlite, so a finished run's page shows its whole history after a restart. The URL carries a
    random token (traded for a cookie); requests without it get 401. Read-only. Ctrl-C stops it (exit 130)."""
    from pathlib import Path

    from ..dashboard.app import bind, new_token, serve
    from ..dashboard.hub import Hub
    from ..errors import ExitCode

    out = output(False)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    token = new_token()
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/?token={token}"
    if host not in ("127.0.0.1", "localhost", "::1"):
        out.warn(f"listening on {host}: anyone who can reach this address and has the URL sees your instances and runs")
    hub = Hub(Path.cwd()).start()
    hub.settle()

    opened: list[Path] = []

    def ready() -> None:
        out.info("gpuops dashboard: open this URL (it carries the access token; Ctrl-C stops the dashboard)")
        out.print(url)
        out.stdout.flush()
        if not no_browser:
            opened.append(_open(url, bound, out))

    try:
        serve(hub, sock, token, host, bound, ready)
    except KeyboardInterrupt:
        pass
    finally:
        for page in opened:
            page.unlink(missing_ok=True)
    raise typer.Exit(int(ExitCode.INTERRUPTED))


OPEN_FILE_S = 60.0  # the redirect file (it holds the token) is removed this long after the browser was started


def _open(url: str, port: int, out):
    """Open the browser on a private local file that redirects to the URL (as Jupyter does), so the token is never on
    the browser's command line; the URL printed above works as well. The file is this dashboard's own (its port and
    process in the name) and is removed once the browser had time to read it, and at the latest when it stops."""
    import html
    import os
    import threading
    import webbrowser

    from ..paths import state_dir, write_private

    page = state_dir() / "dashboard" / f"open-{port}-{os.getpid()}.html"
    write_private(page, f'<!doctype html><meta http-equiv="refresh" content="0;url={html.escape(url)}">'
                        f'<a href="{html.escape(url)}">open the gpuops dashboard</a>\n')
    timer = threading.Timer(OPEN_FILE_S, lambda: page.unlink(missing_ok=True))
    timer.daemon = True
    timer.start()
    try:
        webbrowser.open(page.as_uri())
    except Exception as exc:  # no browser here: the printed URL is enough
        out.warn(f"could not open a browser ({exc}); open the URL above")
    return page
