"""The dashboard's ASGI app (Starlette) and its server (uvicorn): imported only by `gpuops dashboard`.

Security, as Jupyter's server does it: the printed URL carries a random token; the first request with it gets an
HttpOnly, SameSite=Strict cookie and is redirected to the same page without the token (so it stays out of the
address bar and history); any request without the cookie or the token gets 401 and no data. The cookie is named for
the port (two dashboards on one machine keep their own) and holds a session secret of its own, never the token
(a browser sends localhost's cookies to every port: another service there sees a cookie, never the URL's token).
The cookie header is read leniently: another site's cookie of any shape never hides ours. The redirect stays on the
dashboard (a path beginning `//` is not another site). Requests naming another Host than the one it listens on are
refused (DNS rebinding). Every page forbids scripts, styles and connections from anywhere but the dashboard itself
(Content-Security-Policy). Read-only: no route changes anything.
"""
from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import socket
import time
from pathlib import Path
from typing import Optional
from urllib.parse import parse_qs, urlencode

from .feed import finite

from .hub import Hub

STATIC = Path(__file__).parent / "static"
COOKIE = "gpuops_dashboard"  # + "_<port>"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = [(b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
           (b"referrer-policy", b"no-referrer"), (b"cache-control", b"no-store"), (b"x-frame-options", b"DENY")]
OVERVIEW_EVERY_S = 1.0
RUN_POLL_S = 0.1  # how often a run page's event stream looks for new entries (a line reaches the page within this)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def cookie_name(port: int) -> str:
    return f"{COOKIE}_{port}"


def read_cookies(header: str) -> dict[str, str]:
    """A Cookie header as name -> value, read as browsers write it (`a=b; c=d`): a value with spaces, quotes, JSON or
    non-ASCII characters is kept as it is, and a pair that is not name=value is skipped, so one site's odd cookie
    never hides another's (http.cookies.SimpleCookie gives up on the whole header)."""
    out: dict[str, str] = {}
    for part in header.split(";"):
        name, eq, value = part.strip().partition("=")
        if eq and name and name not in out:
            out[name] = value.strip()
    return out


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode("utf-8", "surrogateescape"), b.encode("utf-8", "surrogateescape"))


def local_location(path: str, query: str) -> str:
    """Where the token-for-cookie redirect goes: this path on this dashboard, never another site (`//evil.example/`
    and `/\\evil.example` are network paths to a browser)."""
    return "/" + path.lstrip("/\\") + ("?" + query if query else "")


class TokenGate:
    """Pure ASGI middleware: the Host check, the token-for-cookie trade, 401 without either, security headers."""

    def __init__(self, app, token: str, hosts: Optional[set[str]], port: int = 0):
        self.app, self.token, self.hosts = app, token, hosts
        self.cookie = cookie_name(port)
        self.session = secrets.token_urlsafe(32)  # what the cookie holds: not the token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        if self.hosts is not None and headers.get("host", "") not in self.hosts:
            return await _plain(send, 403, "403: this dashboard answers only at the address it printed")
        got = read_cookies(headers.get("cookie", "")).get(self.cookie)
        if got is not None and _same(got, self.session):
            return await self.app(scope, receive, _with_headers(send))
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = (query.get("token") or [""])[0]
        if given and _same(given, self.token) and scope["method"] == "GET":
            rest = {k: v for k, v in query.items() if k != "token"}
            location = local_location(scope["path"], urlencode(rest, doseq=True))
            cookie = f"{self.cookie}={self.session}; HttpOnly; SameSite=Strict; Path=/"
            await send({"type": "http.response.start", "status": 303,
                        "headers": [(b"location", location.encode()), (b"set-cookie", cookie.encode()), *HEADERS,
                                    (b"content-length", b"0")]})
            return await send({"type": "http.response.body", "body": b""})
        return await _plain(send, 401, "401: open the URL `gpuops dashboard` printed (it carries the token)")


async def _plain(send, status: int, text: str) -> None:
    body = (text + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            *HEADERS]})
    await send({"type": "http.response.body", "body": body})


def _with_headers(send):
    async def wrapped(message):
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers") or []}
            message = {**message, "headers": list(message.get("headers") or []) +
                       [(k, v) for k, v in HEADERS if k not in names]}
        await send(message)
    return wrapped


def _json(data) -> str:
    """Strict JSON (no NaN, which a browser refuses: a `loss nan` line would stop the page)."""
    return json.dumps(finite(data), separators=(",", ":"), allow_nan=False)


def _sse(data: dict, event: Optional[str] = None) -> str:
    return (f"event: {event}\n" if event else "") + "data: " + _json(data) + "\n\n"


def _float_arg(request, name: str) -> Optional[float]:
    try:
        v = float(request.query_params.get(name, ""))
    except ValueError:
        return None
    return v if v == v and abs(v) != float("inf") else None


LOG_CHUNK = 1 << 16


def log_chunks(hub: Hub, run_id: str):
    """The run's whole log, secrets scrubbed line by line: the copy `gpuops run` fetched (runs/<id>/log), else read
    from the host as `gpuops logs` does (one execution, streamed). Yields bytes; raises GpuopsError."""
    import queue
    import threading

    from .hub import redact

    local = hub.project / "runs" / run_id / "log"
    if local.is_file():
        def produce(write):
            with open(local, "rb") as fh:
                while chunk := fh.read(LOG_CHUNK):
                    write(chunk)
    else:
        meta = hub.meta(run_id)
        if meta is None:
            return

        def produce(write):
            from ..jobs import actions
            from ..profiles.model import resolve

            prof = resolve(meta.get("profile"), hub.project).node(None)
            actions.tail(prof, hub.out, hub.project, meta, 10 ** 9, write)

    q: "queue.Queue" = queue.Queue(maxsize=16)

    def run():
        try:
            produce(q.put)
            q.put(None)
        except BaseException as exc:  # said at the end of the text
            q.put(exc)

    threading.Thread(target=run, daemon=True).start()
    pending = b""
    while True:
        item = q.get()
        if isinstance(item, BaseException):
            msg = getattr(item, "message", None) or f"{type(item).__name__}: {item}"
            yield redact(pending.decode("utf-8", "replace") + f"\n[gpuops dashboard: the rest of the log could not be "
                                                              f"read: {msg}]\n").encode()
            return
        if item is None:
            if pending:
                yield redact(pending.decode("utf-8", "replace")).encode()
            return
        pending += item
        cut = pending.rfind(b"\n") + 1
        if cut:
            yield redact(pending[:cut].decode("utf-8", "replace")).encode()
            pending = pending[cut:]


async def overview_stream(hub: Hub, request):
    """The overview's events: the whole document when it changed (the page updates its rows in place)."""
    last = None
    while not (hub.closing.is_set() or await request.is_disconnected()):
        doc = await asyncio.to_thread(hub.overview)
        text = json.dumps({k: v for k, v in doc.items() if k != "now"}, sort_keys=True, default=str)
        if text != last:
            last = text
            yield _sse(doc)
        else:
            yield ": alive\n\n"
        await asyncio.sleep(OVERVIEW_EVERY_S)


async def run_stream(hub: Hub, feed, request, seq: int):
    """A run's events from the viewer's cursor `seq`: the journal's new entries, or a `reset` when it fell behind."""
    idle = 0.0
    while not (hub.closing.is_set() or await request.is_disconnected()):
        with hub.lock:
            got = feed.since(seq)
            snap = feed.snapshot() if got is None else None
            seq = feed.seq
        if snap is not None:
            yield _sse(snap, "reset")
        elif got:
            yield _sse({"entries": got, "at": time.time()})  # the page compares: how far behind it is itself
            idle = 0.0
        elif idle >= 10.0:
            yield ": alive\n\n"
            idle = 0.0
        await asyncio.sleep(RUN_POLL_S)
        idle += RUN_POLL_S


def build_app(hub: Hub, token: str, hosts: Optional[set[str]], port: int = 0):
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse

    def JSONResponse(data, status_code: int = 200) -> Response:  # noqa: N802  (strict: see _json)
        return Response(_json(data), status_code=status_code, media_type="application/json")
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    shell = (STATIC / "index.html").read_bytes()  # the one page (its script draws the overview, a run, a comparison)

    def page(request):
        return Response(shell, media_type="text/html; charset=utf-8")

    async def overview(request):
        return JSONResponse(await asyncio.to_thread(hub.overview))

    def no_run(run_id: str):
        return JSONResponse({"error": f"no run {run_id} recorded in this project"}, status_code=404)

    async def run_doc(request):
        rid = request.path_params["run_id"]
        doc = await asyncio.to_thread(hub.run_doc, rid)
        return no_run(rid) if doc is None else JSONResponse(doc)

    async def run_series(request):
        rid = request.path_params["run_id"]
        metric = request.query_params.get("metric", "loss")
        if metric not in ("loss", "rate") or await asyncio.to_thread(hub.feed, rid) is None:
            return no_run(rid)
        try:
            limit = max(10, min(20000, int(request.query_params.get("limit", "2000"))))
        except ValueError:
            limit = 2000
        return JSONResponse(await asyncio.to_thread(hub.series, rid, metric, _float_arg(request, "lo"),
                                                    _float_arg(request, "hi"), limit))

    async def run_gpu(request):
        rid = request.path_params["run_id"]
        if await asyncio.to_thread(hub.feed, rid) is None:
            return no_run(rid)
        return JSONResponse(await asyncio.to_thread(hub.gpu_range, rid, _float_arg(request, "lo"),
                                                    _float_arg(request, "hi")))

    async def run_log(request):
        rid = request.path_params["run_id"]
        if await asyncio.to_thread(hub.feed, rid) is None:
            return no_run(rid)
        chunks = log_chunks(hub, rid)

        async def body():
            while True:
                chunk = await asyncio.to_thread(next, chunks, None)
                if chunk is None:
                    return
                yield chunk
        return StreamingResponse(body(), media_type="text/plain; charset=utf-8",
                                 headers={"content-disposition": f'inline; filename="{rid}.log"'})

    async def overview_events(request):
        return StreamingResponse(overview_stream(hub, request), media_type="text/event-stream")

    async def run_events(request):
        feed = await asyncio.to_thread(hub.feed, request.path_params["run_id"])
        if feed is None:
            return JSONResponse({"error": "no such run"}, status_code=404)
        try:
            seq = int(request.query_params.get("seq", "0"))
        except ValueError:
            seq = 0
        return StreamingResponse(run_stream(hub, feed, request, seq), media_type="text/event-stream")

    def no_icon(request):
        return Response(status_code=204)

    routes = [Route("/", page), Route("/favicon.ico", no_icon), Route("/run/{run_id}", page), Route("/compare", page),
              Route("/run/{run_id}/log", run_log), Route("/api/overview", overview),
              Route("/api/run/{run_id}", run_doc), Route("/api/run/{run_id}/series", run_series),
              Route("/api/run/{run_id}/gpu", run_gpu), Route("/events/overview", overview_events),
              Route("/events/run/{run_id}", run_events),
              Mount("/static", StaticFiles(directory=STATIC), name="static")]
    app = Starlette(routes=routes)
    app.middleware_stack = app.build_middleware_stack()  # built now, not while the first page waits
    return TokenGate(app, token, hosts, port)


def bind_hint(exc: OSError, port: int) -> str:
    """What to change when the socket cannot be bound: the port only when the port is what failed."""
    import errno

    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return ("this machine has no such address: --host takes one of its own addresses (the default 127.0.0.1: "
                "this machine only)")
    if exc.errno == errno.EACCES and 0 < port < 1024:
        return "ports below 1024 need root: choose another --port (0 picks a free one)"
    return "choose another --port (0 picks a free one)"


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one), made before the server starts so the URL is known."""
    from ..errors import UsageError

    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(fam, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}", hint=bind_hint(exc, port)) from None
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


WILDCARDS = ("0.0.0.0", "::", "")


def allowed_hosts(host: str, port: int) -> Optional[set[str]]:
    """The Host headers a request may carry: the address it listens on (and localhost for loopback); None (any) when
    it listens on every address, where the token alone guards it."""
    if host in WILDCARDS:
        return None
    names = {host, f"[{host}]"} | ({"localhost", "127.0.0.1"} if host in ("127.0.0.1", "localhost") else set())
    return {f"{n}:{port}" for n in names}


def serve(hub: Hub, sock: socket.socket, token: str, host: str, port: int, ready=lambda: None) -> None:
    """Serve until Ctrl-C (uvicorn's own signal handling ends the server; the followers are daemon threads).
    ready() is called once the server accepts requests: the URL is printed then, so the first page is not kept
    waiting by the server's start."""
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if not self.should_exit:
                ready()

        async def shutdown(self, sockets=None):
            hub.close()  # the event streams end now, so the shutdown has no task left to cancel
            await super().shutdown(sockets=sockets)

    app = build_app(hub, token, allowed_hosts(host, port), port)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=5,
                            ws="none")
    try:
        Server(config).run(sockets=[sock])
    finally:
        hub.close()
