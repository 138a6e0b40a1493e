"""The Lambda Cloud API client (OpenAPI 1.8.3): httpx with explicit timeouts, typed lenient parsing, one error type.

- Responses are parsed leniently: unknown fields are ignored; unknown instance types, regions and statuses are kept as
  plain strings; `ip` / `private_ip` may be absent.
- Every failure is a `LambdaError` carrying Lambda's own `code`, `message` and `suggestion` (or a transport
  description), with `transient` (worth retrying: 429, 5xx, `provider/*`, `global/internal-error`, connection
  trouble) and `ambiguous` (the request may have been carried out: a timeout after sending, a dropped connection, a 5xx).
- Idempotent requests (GET, terminate) are retried with backoff on transient failures, honouring Retry-After.
  A launch is never retried here: the caller adopts by tag after an ambiguous failure (launch.py).
- The API key never appears in output, exception text or a repr: `Secret` hides it and `redact()` scrubs any text of
  every form the key can take there (raw, escaped, as bytes, URL-encoded, base64 as in a Basic header).
- A request that cannot even be sent (a header or URL httpx refuses) is a local error (exit 2), never retried as a
  network failure; an answer that is not Lambda's (a proxy's HTML page) gets the exit code of its HTTP status.
"""
from __future__ import annotations

import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import ExitCode, GpuopsError, UsageError

LAMBDA_API_URL = "https://cloud.lambda.ai/api/v1"
AUTH_CODES = ("global/invalid-api-key", "global/account-inactive", "global/invalid-address")
CAPACITY = "instance-operations/launch/insufficient-capacity"
NOT_FOUND = "global/object-does-not-exist"
TRANSIENT_CODES = ("global/internal-error", "global/unknown")
AUTH_HINTS = {
    "global/invalid-api-key": "create a key at https://cloud.lambda.ai/api-keys and set LAMBDA_API_KEY "
                              "(or ~/.lambda_cloud/lambda_keys: api_key = ...)",
    "global/account-inactive": "the account is inactive: verify your email and payment method at https://cloud.lambda.ai",
    "global/invalid-address": "set a valid billing address at https://cloud.lambda.ai",
}


class Secret:
    """An API key that never prints itself. Every Secret made is scrubbed by `redact` from then on."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value
        _register(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def key_problem(value: str) -> str | None:
    """Why a text cannot be an API key (it goes into an HTTP header as it is: visible ASCII only), or None. Says where
    the first bad character is and what it is, never the key."""
    if not value:
        return "it is empty"
    for i, ch in enumerate(value, 1):
        n = ord(ch)
        if 0x21 <= n <= 0x7E:
            continue
        what = {"\n": "a line break (\\n)", "\r": "a carriage return (\\r)", "\t": "a tab",
                " ": "a space"}.get(ch) or (f"a control character (U+{n:04X})" if n < 0x20 or n == 0x7F
                                            else f"a non-ASCII character (U+{n:04X})")
        return f"it holds {what} at character {i} of {len(value)}"
    return None


_SECRETS: set[str] = set()
_MIN_SECRET = 4  # shorter stand-ins (tests' "k") would blank out ordinary words; no real key is that short
_MIN_PIECE = 8  # the visible pieces of a key cut by a line break are scrubbed on their own from this length
_PATTERN: list = [None]  # every form of every secret, compiled once per set of secrets


def _register(value: str) -> None:
    if isinstance(value, str) and len(value) >= _MIN_SECRET and value not in _SECRETS:
        _SECRETS.add(value)
        _PATTERN[0] = None


def secret_forms(key: str) -> set[str]:
    """Every way a key can be written into a text: as it is; escaped as repr, JSON and `unicode_escape` write it; as
    bytes repr shows it (httpx's "Illegal header value b'Bearer ...'"); URL-encoded (upper and lower case hex, `+` or
    `%20` for a space); base64 as in a Basic header (`KEY:` and `KEY`, standard and URL-safe, padded or not); and each
    visible piece of a key cut by a control character, a space or a non-ASCII character."""
    import base64
    import json
    from urllib.parse import quote, quote_plus

    raw = key.encode("utf-8", "surrogateescape")
    forms = {key, repr(key)[1:-1], json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=False)[1:-1],
             key.encode("unicode_escape").decode("ascii"), repr(raw)[2:-1], quote(key, safe=""), quote(key),
             quote_plus(key)}
    forms |= {re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), f) for f in list(forms) if "%" in f}
    for data in (raw, raw + b":"):
        for enc in (base64.b64encode(data), base64.urlsafe_b64encode(data)):
            forms |= {enc.decode(), enc.decode().rstrip("=")}
    forms |= {p for p in re.split(r"[^\x21-\x7e]+", key) if len(p) >= _MIN_PIECE}
    return {f for f in forms if len(f) >= _MIN_SECRET}


def redact(text: str) -> str:
    """Remove every API key this process has loaded from a text, in every form it can take there (secret_forms)."""
    if not _SECRETS or not text:
        return text
    if _PATTERN[0] is None:
        forms = set().union(*(secret_forms(s) for s in _SECRETS))
        _PATTERN[0] = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))
    return _PATTERN[0].sub("***", text)


class LambdaError(GpuopsError):
    """One failed API call: Lambda's code, message and suggestion (or what went wrong on the way)."""

    def __init__(self, message: str, *, api_code: str = "", suggestion: str | None = None, status: int | None = None,
                 transient: bool = False, ambiguous: bool = False, retry_after: float | None = None,
                 method: str = "", path: str = "", code: ExitCode | None = None):
        self.api_code = api_code
        self.api_message = message
        self.suggestion = suggestion
        self.status = status
        self.transient = transient
        self.ambiguous = ambiguous
        self.retry_after = retry_after
        self.method, self.path = method, path
        where = f"{method} {path}".strip()
        text = f"Lambda API: {api_code + ': ' if api_code else ''}{message}" + (f" ({where}" + (f", HTTP {status})" if status else ")") if where else "")
        code = code or (ExitCode.CONNECTION if api_code in AUTH_CODES else ExitCode.FAILED)
        hint = AUTH_HINTS.get(api_code) or suggestion
        super().__init__(redact(text), hint=redact(hint) if hint else None, code=code)

    @property
    def capacity(self) -> bool:
        return self.api_code == CAPACITY

    @property
    def not_found(self) -> bool:
        """Lambda said the object does not exist. A 404 without Lambda's error code (a proxy's page, a wrong API URL)
        says nothing about an instance: reading it as "already gone" would stop tracking one that bills."""
        return self.api_code == NOT_FOUND

    @property
    def rate_limited(self) -> bool:
        return self.status == 429


# -- typed records ---------------------------------------------------------------------------------------------------
def _int(v: Any, default: int = 0) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _str(v: Any) -> Optional[str]:
    return v if isinstance(v, str) and v else None


@dataclass(frozen=True)
class InstanceType:
    name: str
    description: str = ""
    gpu_description: str = ""
    price_cents_per_hour: int = 0
    vcpus: int = 0
    memory_gib: int = 0
    storage_gib: int = 0
    gpus: int = 0

    @property
    def price_per_hour(self) -> float:
        return self.price_cents_per_hour / 100.0

    @classmethod
    def parse(cls, d: Any, name: str = "") -> "InstanceType":
        d = d if isinstance(d, dict) else {}
        specs = d.get("specs") if isinstance(d.get("specs"), dict) else {}
        return cls(name=_str(d.get("name")) or name, description=str(d.get("description") or ""),
                   gpu_description=str(d.get("gpu_description") or ""),
                   price_cents_per_hour=_int(d.get("price_cents_per_hour")), vcpus=_int(specs.get("vcpus")),
                   memory_gib=_int(specs.get("memory_gib")), storage_gib=_int(specs.get("storage_gib")),
                   gpus=_int(specs.get("gpus")))

    def to_dict(self) -> dict:
        return {"name": self.name, "description": self.description, "gpu_description": self.gpu_description,
                "price_per_hour": self.price_per_hour, "gpus": self.gpus, "vcpus": self.vcpus,
                "memory_gib": self.memory_gib, "storage_gib": self.storage_gib}


@dataclass(frozen=True)
class TypeAvailability:
    type: InstanceType
    regions: tuple[str, ...]  # regions with capacity now, in the API's order

    @classmethod
    def parse_map(cls, data: Any) -> dict[str, "TypeAvailability"]:
        out: dict[str, TypeAvailability] = {}
        if not isinstance(data, dict):
            return out
        for key, item in data.items():
            if not isinstance(item, dict):
                continue
            t = InstanceType.parse(item.get("instance_type"), name=str(key))
            regions = tuple(r["name"] for r in item.get("regions_with_capacity_available") or []
                            if isinstance(r, dict) and isinstance(r.get("name"), str))
            out[t.name] = cls(t, regions)
        return out


@dataclass(frozen=True)
class Instance:
    id: str
    status: str
    name: Optional[str] = None
    ip: Optional[str] = None
    private_ip: Optional[str] = None
    region: Optional[str] = None
    type: Optional[InstanceType] = None
    hostname: Optional[str] = None
    ssh_key_names: tuple[str, ...] = ()
    tags: dict = field(default_factory=dict)
    file_system_names: tuple[str, ...] = ()
    file_system_mounts: tuple[tuple[str, str], ...] = ()  # (filesystem id, mount point), as the record says

    @property
    def type_name(self) -> str:
        return self.type.name if self.type else "?"

    @classmethod
    def parse(cls, d: Any) -> Optional["Instance"]:
        if not isinstance(d, dict) or not _str(d.get("id")):
            return None
        region = d.get("region")
        tags = {}
        for t in d.get("tags") or []:
            if isinstance(t, dict) and isinstance(t.get("key"), str):
                tags[t["key"]] = str(t.get("value", ""))
        return cls(id=d["id"], status=str(d.get("status") or "unknown"), name=_str(d.get("name")), ip=_str(d.get("ip")),
                   private_ip=_str(d.get("private_ip")),
                   region=_str(region.get("name")) if isinstance(region, dict) else _str(region),
                   type=InstanceType.parse(d["instance_type"]) if isinstance(d.get("instance_type"), dict) else None,
                   hostname=_str(d.get("hostname")),
                   ssh_key_names=tuple(k for k in d.get("ssh_key_names") or [] if isinstance(k, str)), tags=tags,
                   file_system_names=tuple(n for n in d.get("file_system_names") or [] if isinstance(n, str)),
                   file_system_mounts=tuple((m["file_system_id"], m["mount_point"])
                                            for m in d.get("file_system_mounts") or []
                                            if isinstance(m, dict) and _str(m.get("file_system_id"))
                                            and _str(m.get("mount_point"))))


@dataclass(frozen=True)
class Filesystem:
    """A persistent filesystem (GET /file-systems). `mount_point` is the default one; an instance launched with
    `file_system_mounts` holds its own in its record. `bytes_used` is Lambda's estimate (updated every few hours),
    None when the API leaves it out."""

    id: str
    name: str
    region: str = ""
    mount_point: str = ""
    is_in_use: bool = False
    bytes_used: Optional[int] = None
    created: str = ""
    created_by: str = ""

    @classmethod
    def parse(cls, d: Any) -> Optional["Filesystem"]:
        if not isinstance(d, dict) or not _str(d.get("id")) or not _str(d.get("name")):
            return None
        region, by = d.get("region"), d.get("created_by")
        used = d.get("bytes_used")
        return cls(id=d["id"], name=d["name"],
                   region=(_str(region.get("name")) if isinstance(region, dict) else _str(region)) or "",
                   mount_point=_str(d.get("mount_point")) or "", is_in_use=d.get("is_in_use") is True,
                   bytes_used=used if isinstance(used, int) and not isinstance(used, bool) and used >= 0 else None,
                   created=_str(d.get("created")) or "",
                   created_by=(_str(by.get("email")) or "") if isinstance(by, dict) else "")

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "region": self.region, "mount_point": self.mount_point,
                "is_in_use": self.is_in_use, "bytes_used": self.bytes_used, "created": self.created,
                "created_by": self.created_by}


@dataclass(frozen=True)
class SSHKey:
    id: str
    name: str
    public_key: str

    @classmethod
    def parse(cls, d: Any) -> Optional["SSHKey"]:
        if not isinstance(d, dict) or not _str(d.get("id")):
            return None
        return cls(id=d["id"], name=str(d.get("name") or ""), public_key=str(d.get("public_key") or ""))


# -- the client -----------------------------------------------------------------------------------------------------
def parse_retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


FOREIGN_HINTS = {  # an answer that is not Lambda's (no {"error": {"code": ...}}): who else may have answered
    401: "the answer came from something in front of Lambda's API (a proxy or gateway asking for its own login?), or "
         "the key is wrong: check the key (LAMBDA_API_KEY, ./.env, ~/.lambda_cloud/lambda_keys), GPUOPS_LAMBDA_API_URL "
         "and HTTPS_PROXY",
    403: "something in front of Lambda's API (a proxy or firewall?) refused the request: check GPUOPS_LAMBDA_API_URL "
         "and HTTPS_PROXY, or the key",
    407: "a proxy asks for its own login: give it in HTTPS_PROXY, or reach the API without that proxy",
}
FOREIGN_HINT = "check GPUOPS_LAMBDA_API_URL (it should end in /api/v1) and any proxy between this machine and the API"


def foreign_answer(status: int, headers: dict, text: str) -> str:
    """'not an answer of Lambda's API: Unauthorized, text/html "401 Authorization Required"': what a person needs to
    recognise a proxy's or portal's page; one line, no control characters, at most 80 of the page's characters."""
    from http import HTTPStatus

    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = f"HTTP {status}"
    kind = (headers.get("content-type") or "").split(";", 1)[0].strip() or "no content type"
    m = re.search(r"<title[^>]*>(.*?)</title>", text, re.I | re.S)
    gist = m.group(1) if m else re.sub(r"<[^>]*>", " ", text)
    gist = " ".join(re.sub(r"[\x00-\x1f\x7f-\x9f]", " ", gist).split())
    gist = gist[:77] + "..." if len(gist) > 80 else gist
    return f"not an answer of Lambda's API: {phrase}, {kind}" + (f' "{gist}"' if gist else "")


def error_from_response(status: int, body: Any, headers: dict, method: str, path: str, text: str = "") -> LambdaError:
    """A non-2xx answer -> LambdaError (pure: tested on Lambda's recorded shapes and on proxies' pages).

    Lambda's errors carry {"error": {"code", "message", "suggestion"}}. Anything else did not come from Lambda's API
    (a proxy, a captive portal, a wrong GPUOPS_LAMBDA_API_URL): 401, 403 and 407 are authentication (exit 3), 429 and
    5xx are retried, the rest exit 1; each names the status and what the page says, and never reads as "not found"."""
    err = body.get("error") if isinstance(body, dict) else None
    retry_after = parse_retry_after(headers.get("retry-after"))
    if isinstance(err, dict) and isinstance(err.get("code"), str):
        code = err["code"]
        transient = status == 429 or status >= 500 or code.startswith("provider/") or code in TRANSIENT_CODES
        return LambdaError(str(err.get("message") or code), api_code=code, suggestion=_str(err.get("suggestion")),
                           status=status, transient=transient, ambiguous=status >= 500, retry_after=retry_after,
                           method=method, path=path)
    if status == 429:
        return LambdaError("too many requests", status=429, transient=True, retry_after=retry_after, method=method, path=path)
    hint = FOREIGN_HINTS.get(status, FOREIGN_HINT)
    if 300 <= status < 400 and headers.get("location"):
        hint = f"the API URL redirects to {headers['location'][:200]}: {FOREIGN_HINT}"
    return LambdaError(foreign_answer(status, headers, text), status=status, transient=status >= 500,
                       ambiguous=status >= 500, retry_after=retry_after, method=method, path=path, suggestion=hint,
                       code=ExitCode.CONNECTION if status in FOREIGN_HINTS else None)


def backoff_delay(attempt: int, retry_after: float | None, rng: Callable[[], float] = random.random,
                  base: float = 1.0, cap: float = 30.0) -> float:
    """Exponential backoff with full jitter; a server's Retry-After wins when it asks for longer."""
    d = min(cap, base * (2 ** attempt)) * (0.5 + rng() / 2)
    return max(d, retry_after or 0.0)


class Client:
    """One API session. `calls` counts requests per (method, path template), for benchmarks and tests."""

    def __init__(self, api_key: Secret, base_url: str = LAMBDA_API_URL, *, timeout: float = 30.0,
                 connect_timeout: float = 10.0, attempts: int = 5, sleep: Callable[[float], None] = time.sleep,
                 rng: Callable[[], float] = random.random, backoff_base: float = 1.0, transport=None):
        import httpx

        problem = key_problem(api_key.reveal())
        if problem:  # credentials.load_api_key refuses such a key first; this is for any other caller
            raise UsageError(f"the Lambda API key cannot be sent: {problem}")
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.sleep = sleep
        self.rng = rng
        self.backoff_base = backoff_base
        self.calls: Counter = Counter()
        self.on_retry: Callable[[LambdaError, float], None] | None = None
        try:
            self._http = httpx.Client(
                base_url=self.base_url,
                headers={"Authorization": f"Bearer {api_key.reveal()}", "Accept": "application/json",
                         "User-Agent": "gpuops"},
                timeout=httpx.Timeout(timeout, connect=connect_timeout),
                transport=transport,
                follow_redirects=False,
            )
        except (httpx.InvalidURL, UnicodeError) as exc:
            raise UsageError(f"cannot use the Lambda API URL {redact(self.base_url)!r}: {redact(str(exc))}",
                             hint="set GPUOPS_LAMBDA_API_URL to an http(s):// URL, or unset it for Lambda's own") from None

    def __repr__(self) -> str:
        return f"Client({self.base_url!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())

    # -- transport ------------------------------------------------------------------------------------------------
    def _once(self, method: str, path: str, template: str, body: Any = None) -> Any:
        import httpx

        self.calls[(method, template)] += 1
        try:
            resp = self._http.request(method, path, json=body)
        except (httpx.LocalProtocolError, httpx.UnsupportedProtocol, httpx.InvalidURL, UnicodeError) as exc:
            # refused on this machine before anything was sent (a header or URL httpx will not write): retrying
            # cannot help, and it is not the network's fault
            raise LambdaError(f"request not sent: {redact(str(exc)) or type(exc).__name__}", method=method,
                              path=template, code=ExitCode.USAGE,
                              suggestion="check GPUOPS_LAMBDA_API_URL (an http(s):// URL ending in /api/v1) and the "
                                         "API key (LAMBDA_API_KEY, ./.env, ~/.lambda_cloud/lambda_keys)") from None
        except httpx.ConnectError as exc:
            raise LambdaError(f"cannot reach {self.base_url}: {redact(str(exc)) or 'connection refused'}",
                              transient=True, method=method, path=template) from None
        except httpx.TimeoutException as exc:
            sent = not isinstance(exc, (httpx.ConnectTimeout, httpx.PoolTimeout))
            raise LambdaError(f"no answer from {self.base_url} in time ({type(exc).__name__})", transient=True,
                              ambiguous=sent, method=method, path=template) from None
        except httpx.TransportError as exc:  # dropped connection, protocol error: the request may have been carried out
            raise LambdaError(f"connection to {self.base_url} failed: {redact(str(exc)) or type(exc).__name__}",
                              transient=True, ambiguous=True, method=method, path=template) from None
        try:
            doc = resp.json()
        except ValueError:
            doc = None
        headers = {k.lower(): v for k, v in resp.headers.items()}
        text = resp.content[:4096].decode("utf-8", "replace") if doc is None else ""
        if 200 <= resp.status_code < 300:
            if isinstance(doc, dict) and "data" in doc:
                return doc["data"]
            if doc is None:
                raise LambdaError(foreign_answer(resp.status_code, headers, text), status=resp.status_code,
                                  method=method, path=template, suggestion=FOREIGN_HINT)
            raise LambdaError(f"answer without 'data' (HTTP {resp.status_code})", status=resp.status_code,
                              method=method, path=template)
        raise error_from_response(resp.status_code, doc, headers, method, template, text)

    def request(self, method: str, path: str, body: Any = None, *, template: str | None = None,
                retry: bool = True) -> Any:
        """One API call; transient failures retried (tenacity) with jittered exponential backoff, Retry-After
        honoured, at most `attempts` tries."""
        from tenacity import Retrying, retry_if_exception, stop_after_attempt

        template = template or path
        if not retry:
            return self._once(method, path, template, body)

        def wait(state) -> float:
            return backoff_delay(state.attempt_number - 1, getattr(state.outcome.exception(), "retry_after", None),
                                 self.rng, base=self.backoff_base)

        def announce(state) -> None:
            if self.on_retry:
                self.on_retry(state.outcome.exception(), state.next_action.sleep)

        for attempt in Retrying(stop=stop_after_attempt(self.attempts), wait=wait, sleep=self.sleep, reraise=True,
                                before_sleep=announce,
                                retry=retry_if_exception(lambda e: isinstance(e, LambdaError) and e.transient)):
            with attempt:
                return self._once(method, path, template, body)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- endpoints --------------------------------------------------------------------------------------------------
    def instance_types(self) -> dict[str, TypeAvailability]:
        return TypeAvailability.parse_map(self.request("GET", "/instance-types"))

    def instances(self) -> list[Instance]:
        data = self.request("GET", "/instances")
        return [i for i in (Instance.parse(d) for d in (data if isinstance(data, list) else [])) if i]

    def instance(self, instance_id: str) -> Instance:
        inst = Instance.parse(self.request("GET", f"/instances/{instance_id}", template="/instances/{id}"))
        if inst is None:
            raise LambdaError("instance record without an id", method="GET", path="/instances/{id}")
        return inst

    def launch(self, *, region: str, type_name: str, ssh_key: str, name: str | None = None,
               tags: dict[str, str] | None = None, user_data: str | None = None,
               file_systems: list[str] | None = None, file_system_mounts: list[tuple[str, str]] | None = None,
               retry_rate_limit: bool = False) -> list[str]:
        """POST /instance-operations/launch once (never retried on ambiguous failures: see lifecycle.adopt)."""
        body: dict[str, Any] = {"region_name": region, "instance_type_name": type_name, "ssh_key_names": [ssh_key]}
        if name:
            body["name"] = name[:64]
        if tags:
            body["tags"] = [{"key": k, "value": v} for k, v in tags.items()]
        if user_data:
            body["user_data"] = user_data
        if file_systems:
            body["file_system_names"] = list(file_systems)
        if file_system_mounts:  # (filesystem id, mount point under /home, /lambda/nfs or /data)
            body["file_system_mounts"] = [{"file_system_id": i, "mount_point": m} for i, m in file_system_mounts]
        data = self.request("POST", "/instance-operations/launch", body, retry=False)
        ids = data.get("instance_ids") if isinstance(data, dict) else None
        return [i for i in ids or [] if isinstance(i, str)]

    def terminate(self, instance_ids: list[str]) -> list[Instance]:
        data = self.request("POST", "/instance-operations/terminate", {"instance_ids": list(instance_ids)})
        items = data.get("terminated_instances") if isinstance(data, dict) else None
        return [i for i in (Instance.parse(d) for d in items or []) if i]

    def ssh_keys(self) -> list[SSHKey]:
        data = self.request("GET", "/ssh-keys")
        return [k for k in (SSHKey.parse(d) for d in (data if isinstance(data, list) else [])) if k]

    def add_ssh_key(self, name: str, public_key: str) -> SSHKey:
        key = SSHKey.parse(self.request("POST", "/ssh-keys", {"name": name, "public_key": public_key}, retry=False))
        if key is None:
            raise LambdaError("ssh key record without an id", method="POST", path="/ssh-keys")
        return key

    def filesystems(self) -> list[Filesystem]:
        """GET /file-systems (with a hyphen: the only path spelled so)."""
        data = self.request("GET", "/file-systems")
        return [f for f in (Filesystem.parse(d) for d in (data if isinstance(data, list) else [])) if f]

    def create_filesystem(self, name: str, region: str) -> Filesystem:
        """POST /filesystems once (not retried: a lost answer may have created it; the caller lists to see)."""
        fs = Filesystem.parse(self.request("POST", "/filesystems", {"name": name, "region": region}, retry=False))
        if fs is None:
            raise LambdaError("filesystem record without an id", method="POST", path="/filesystems")
        return fs

    def delete_filesystem(self, fs_id: str) -> list[str]:
        data = self.request("DELETE", f"/filesystems/{fs_id}", template="/filesystems/{id}")
        ids = data.get("deleted_ids") if isinstance(data, dict) else None
        return [i for i in ids or [] if isinstance(i, str)]
