"""The Lambda Cloud API client (OpenAPI 1.8.3): httpx with explicit timeouts, typed lenient parsing, one error type.

- Responses are parsed leniently: unknown fields are ignored; unknown instance types, regions and statuses are kept as
  plain strings; `ip` / `private_ip` may be absent.
- Every failure is a `LambdaError` carrying Lambda's own `code`, `message` and `suggestion` (or a transport
  description), with `transient` (worth retrying: 429, 5xx, `provider/*`, `global/internal-error`, connection
  trouble) and `ambiguous` (the request may have been carried out: a timeout after sending, a dropped connection, a 5xx).
- Idempotent requests (GET, terminate) are retried with backoff on transient failures, honouring Retry-After.
  A launch is never retried here: the caller adopts by tag after an ambiguous failure (lifecycle.py).
- The API key never appears in output, exception text or a repr: `Secret` hides it and `redact()` scrubs any text.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ..errors import ExitCode, GpuopsError

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
    """An API key that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


_SECRETS: set[str] = set()


def redact(text: str) -> str:
    """Remove every API key this process has loaded from a text."""
    for s in _SECRETS:
        if s:
            text = text.replace(s, "***")
    return text


class LambdaError(GpuopsError):
    """One failed API call: Lambda's code, message and suggestion (or what went wrong on the way)."""

    def __init__(self, message: str, *, api_code: str = "", suggestion: str | None = None, status: int | None = None,
                 transient: bool = False, ambiguous: bool = False, retry_after: float | None = None,
                 method: str = "", path: str = ""):
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
        code = ExitCode.CONNECTION if api_code in AUTH_CODES else ExitCode.FAILED
        hint = AUTH_HINTS.get(api_code) or suggestion
        super().__init__(redact(text), hint=redact(hint) if hint else None, code=code)

    @property
    def capacity(self) -> bool:
        return self.api_code == CAPACITY

    @property
    def not_found(self) -> bool:
        return self.api_code == NOT_FOUND or self.status == 404

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
                   ssh_key_names=tuple(k for k in d.get("ssh_key_names") or [] if isinstance(k, str)), tags=tags)


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


def error_from_response(status: int, body: Any, headers: dict, method: str, path: str) -> LambdaError:
    """A non-2xx answer -> LambdaError (pure: tested on Lambda's recorded shapes)."""
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
    return LambdaError(f"unexpected HTTP {status} answer", status=status, transient=status >= 500,
                       ambiguous=status >= 500, retry_after=retry_after, method=method, path=path)


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

        _SECRETS.add(api_key.reveal())
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.sleep = sleep
        self.rng = rng
        self.backoff_base = backoff_base
        self.calls: Counter = Counter()
        self.on_retry: Callable[[LambdaError, float], None] | None = None
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key.reveal()}", "Accept": "application/json",
                     "User-Agent": "gpuops"},
            timeout=httpx.Timeout(timeout, connect=connect_timeout),
            transport=transport,
            follow_redirects=False,
        )

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
        if 200 <= resp.status_code < 300:
            if isinstance(doc, dict) and "data" in doc:
                return doc["data"]
            raise LambdaError(f"answer without 'data' (HTTP {resp.status_code})", status=resp.status_code,
                              method=method, path=template)
        raise error_from_response(resp.status_code, doc, {k.lower(): v for k, v in resp.headers.items()}, method, template)

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
               file_systems: list[str] | None = None, retry_rate_limit: bool = False) -> list[str]:
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
