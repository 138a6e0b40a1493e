"""Models of gathered facts and parsers of tool output (nvidia-smi, nvcc, the probe document). Pure."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

SMI_QUERY_FIELDS = ["index", "name", "uuid", "memory_total_mib", "memory_used_mib", "utilization_pct",
                    "temperature_c", "power_draw_w", "power_limit_w", "compute_cap", "driver_version", "bus_id"]
NA_VALUES = {"[N/A]": "N/A", "N/A": "N/A", "[Not Supported]": "Not Supported", "Not Supported": "Not Supported",
             "[Unknown Error]": "Unknown Error", "[GPU is lost]": "GPU is lost"}
EMULATED_UUID_PREFIX = "GPU-e3e3e3e3"


@dataclass
class Gpu:
    index: int
    name: str
    uuid: str | None = None
    memory_total_mib: float | None = None
    memory_used_mib: float | None = None
    utilization_pct: float | None = None
    temperature_c: float | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    compute_cap: str | None = None
    driver_version: str | None = None
    bus_id: str | None = None
    unavailable: dict[str, str] = field(default_factory=dict)  # field -> "N/A" | "Not Supported" | ...
    lost: bool = False

    @property
    def emulated(self) -> bool:
        return bool(self.uuid and self.uuid.startswith(EMULATED_UUID_PREFIX))


@dataclass
class GpuHealth:
    """One GPU's health fields: field -> parsed value (bool for Yes/No, Active/Not Active, Enabled/Disabled; int for
    counts and hex masks; float for W/MHz; str otherwise). Fields the GPU or driver did not answer sit in `unknown`
    with the reason ("N/A", "Not Supported", "not supported by this driver")."""
    index: int
    values: dict[str, Any] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)

    def get(self, name: str, default: Any = None) -> Any:
        v = self.values.get(name)
        return default if v is None else v


@dataclass
class SmiStatus:
    state: str  # ok | missing | failed | timeout | error
    failure: str | None = None  # knowledge id, e.g. driver-not-loaded
    title: str | None = None
    message: str | None = None
    remediation: str | None = None
    exit_code: int | None = None


@dataclass
class Facts:
    host: str = ""
    python_ok: bool = True
    python_missing: str | None = None
    os: dict = field(default_factory=dict)
    cpus: int | None = None
    memory_total_bytes: int | None = None
    memory_available_bytes: int | None = None
    disk: dict = field(default_factory=dict)
    python: dict = field(default_factory=dict)
    smi: SmiStatus = field(default_factory=lambda: SmiStatus("missing"))
    gpus: list[Gpu] = field(default_factory=list)
    driver: str | None = None
    cuda_driver: str | None = None  # CUDA version the driver supports (nvidia-smi header)
    smi_header_style: str | None = None  # legacy | kmd
    emulated: bool = False
    nvcc: str | None = None
    packages: dict[str, str | None] = field(default_factory=dict)
    cuda_runtime: dict = field(default_factory=dict)
    imports: dict[str, dict] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    user_checks: dict[str, dict] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # fact name -> why it could not be gathered
    probe_seconds: float | None = None
    health: list[GpuHealth] | None = None  # None: not gathered (see errors["gpu_health"])
    health_unsupported: list[str] = field(default_factory=list)  # fields this driver does not know
    kernel_log: dict | None = None  # {"readable", "source", "error"}; None: not gathered
    xids: list[dict] = field(default_factory=list)
    bench: dict | None = None  # verify --bench: the remote snippet's result
    # every distribution the python has (name -> version), where asked (verify on a Slurm cluster: the local plan
    # judges a job against the nodes with it); None: not gathered
    distributions: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_smi_query(stdout: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=<SMI fields> --format=csv,noheader,nounits` output."""
    gpus: list[Gpu] = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line or "," not in line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < len(SMI_QUERY_FIELDS):
            parts += ["[N/A]"] * (len(SMI_QUERY_FIELDS) - len(parts))
        row: dict[str, Any] = {}
        unavailable: dict[str, str] = {}
        for key, raw in zip(SMI_QUERY_FIELDS, parts):
            raw = re.sub(r"\s*(MiB|W|%|C)$", "", raw)
            if raw in NA_VALUES:
                unavailable[key] = NA_VALUES[raw]
                row[key] = None
            elif key in ("memory_total_mib", "memory_used_mib", "utilization_pct", "temperature_c", "power_draw_w",
                         "power_limit_w"):
                row[key] = _num(raw)
                if row[key] is None:
                    unavailable[key] = raw
            else:
                row[key] = raw
        try:
            index = int(row.get("index") or len(gpus))
        except ValueError:
            index = len(gpus)
        gpus.append(Gpu(index=index, name=row.get("name") or "unknown", uuid=row.get("uuid"),
                        memory_total_mib=row.get("memory_total_mib"), memory_used_mib=row.get("memory_used_mib"),
                        utilization_pct=row.get("utilization_pct"), temperature_c=row.get("temperature_c"),
                        power_draw_w=row.get("power_draw_w"), power_limit_w=row.get("power_limit_w"),
                        compute_cap=row.get("compute_cap"), driver_version=row.get("driver_version"),
                        bus_id=row.get("bus_id"), unavailable=unavailable,
                        lost="GPU is lost" in unavailable.values()))
    return gpus


_HEADER_SMI = re.compile(r"NVIDIA-SMI\s+([\d.]+)")
_HEADER_DRIVER = re.compile(r"(?:Driver|KMD) Version:\s*([\d.]+)")
_HEADER_CUDA = re.compile(r"CUDA(?: UMD)? Version:\s*([\d.]+|N/A)")


def parse_smi_header(stdout: str) -> dict:
    """Driver and CUDA versions from the nvidia-smi table header, legacy or R610+ ('KMD Version', 'CUDA UMD Version')."""
    out: dict[str, Any] = {"driver": None, "cuda": None, "style": None, "emulated": "EMULATED" in stdout}
    m = _HEADER_DRIVER.search(stdout)
    if m:
        out["driver"] = m.group(1)
        out["style"] = "kmd" if "KMD Version" in m.group(0) else "legacy"
    elif (m2 := _HEADER_SMI.search(stdout)):
        out["driver"] = m2.group(1)
    m = _HEADER_CUDA.search(stdout)
    if m and m.group(1) != "N/A":
        out["cuda"] = m.group(1)
    return out


def classify_smi_failure(rc: int | None, text: str, failures: list[dict]) -> SmiStatus:
    """Name an nvidia-smi failure by its message (preferred) or exit code, using knowledge.yaml rows."""
    for row in failures:
        if re.search(row["match"], text, re.IGNORECASE):
            return SmiStatus("failed", row["id"], row["title"], _first_line(text), row.get("remediation"), rc)
    for row in failures:
        if rc is not None and rc == row.get("exit_code"):
            return SmiStatus("failed", row["id"], row["title"], _first_line(text), row.get("remediation"), rc)
    return SmiStatus("failed", "unknown", f"nvidia-smi failed (exit {rc})", _first_line(text),
                     "run nvidia-smi on the host to see the full error; `sudo dmesg | grep -i -E 'nvrm|xid'` shows driver errors", rc)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def parse_nvcc(stdout: str) -> str | None:
    m = re.search(r"release\s+([\d.]+)", stdout)
    return m.group(1) if m else None


def fact_value(doc: dict, name: str) -> Any:
    """The value of a probe fact ({"ok", "value", "error"}), or None when it failed or is absent."""
    entry = doc.get(name)
    if isinstance(entry, dict) and "ok" in entry:
        return entry.get("value") if entry.get("ok") else None
    return None


def from_probe(doc: dict, *, host: str = "", failures: list[dict] | None = None) -> Facts:
    """Turn the probe's JSON document into Facts. Never raises on a broken fact: it is recorded in .errors."""
    failures = failures or []
    f = Facts(host=host, python_ok=bool(doc.get("python_ok", True)), python_missing=doc.get("python_missing"))
    for name, entry in doc.items():
        if isinstance(entry, dict) and entry.get("ok") is False:
            f.errors[name] = entry.get("error") or "failed"
    f.os = fact_value(doc, "os") or {}
    f.cpus = (fact_value(doc, "cpus") or {}).get("count")
    mem = fact_value(doc, "memory") or {}
    f.memory_total_bytes, f.memory_available_bytes = mem.get("total_bytes"), mem.get("available_bytes")
    f.disk = fact_value(doc, "disk") or {}
    f.python = fact_value(doc, "python") or {}

    q = fact_value(doc, "nvidia_smi_query")
    table = fact_value(doc, "nvidia_smi")
    if "nvidia_smi_query" in f.errors and "timed out" in f.errors["nvidia_smi_query"]:
        f.smi = SmiStatus("timeout", "hang", "nvidia-smi hung", f.errors["nvidia_smi_query"],
                          "nvidia-smi did not answer: a GPU or the driver is wedged; check `dmesg` for Xid errors and reboot")
    elif q is None or not q.get("found"):
        f.smi = SmiStatus("missing", None, "nvidia-smi not found", None,
                          "install the NVIDIA driver (Lambda Stack images ship it), or check PATH for non-login shells")
    elif q.get("timeout"):
        f.smi = SmiStatus("timeout", "hang", "nvidia-smi hung", "timed out",
                          "nvidia-smi did not answer: a GPU or the driver is wedged; check `dmesg` for Xid errors and reboot")
    elif q.get("rc") != 0:
        f.smi = classify_smi_failure(q.get("rc"), (q.get("stdout") or "") + (q.get("stderr") or ""), failures)
    else:
        f.smi = SmiStatus("ok")
        f.gpus = parse_smi_query(q.get("stdout") or "")
        lost = [g for g in f.gpus if g.lost]
        if lost:
            row = next((r for r in failures if r["id"] == "gpu-lost"), {})
            f.smi = SmiStatus("failed", "gpu-lost", row.get("title", "GPU lost"),
                              f"GPU {lost[0].index} reports [GPU is lost]", row.get("remediation"), 0)
    if table and table.get("found") and table.get("rc") == 0:
        hdr = parse_smi_header(table.get("stdout") or "")
        f.driver, f.cuda_driver, f.smi_header_style = hdr["driver"], hdr["cuda"], hdr["style"]
        f.emulated = hdr["emulated"]
    if not f.driver and f.gpus:
        f.driver = f.gpus[0].driver_version
    f.emulated = f.emulated or any(g.emulated for g in f.gpus)

    nv = fact_value(doc, "nvcc")
    if nv and nv.get("found") and nv.get("rc") == 0:
        f.nvcc = parse_nvcc(nv.get("stdout") or "")
    f.packages = fact_value(doc, "packages") or {}
    dists = fact_value(doc, "freeze")
    f.distributions = dists if isinstance(dists, dict) else None
    cuda = fact_value(doc, "cuda")
    if cuda:
        if cuda.get("timeout"):
            f.cuda_runtime = {"timeout": True, "error": cuda.get("error")}
        elif "result" in cuda:
            f.cuda_runtime = cuda["result"]
        else:
            f.cuda_runtime = {"error": cuda.get("error") or "the CUDA check printed nothing", "crashed": True,
                              "stderr": cuda.get("stderr", "")[-1000:]}
    elif "cuda" in f.errors:
        f.cuda_runtime = {"timeout": "timed out" in f.errors["cuda"], "error": f.errors["cuda"]}
    imp = fact_value(doc, "imports")
    if imp:
        f.imports = imp.get("result") or {}
        if not f.imports and imp.get("error"):
            f.errors["imports"] = imp["error"]
    f.env = fact_value(doc, "env") or {}
    f.user_checks = {k: v for k, v in (fact_value(doc, "user_checks") or {}).items()}
    f.probe_seconds = doc.get("seconds")
    _health_from_probe(doc, f)
    return f


# -- GPU health (issue #15) ----------------------------------------------------------------------------------
_BOOL_WORDS = {"yes": True, "no": False, "active": True, "not active": False, "enabled": True, "disabled": False}
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)\): (\d+),\s*(.*)")


def parse_health_value(raw: str) -> tuple[Any, str | None]:
    """(value, why-unknown) of one health field as nvidia-smi prints it (with or without units)."""
    raw = raw.strip()
    if raw in NA_VALUES:
        return None, NA_VALUES[raw]
    low = raw.lower()
    if low in _BOOL_WORDS:
        return _BOOL_WORDS[low], None
    if re.fullmatch(r"0x[0-9a-fA-F]+", raw):
        return int(raw, 16), None
    num = re.fullmatch(r"(-?\d+(?:\.\d+)?)\s*(?:W|MHz|MiB|%|C|x)?", raw)
    if num:
        return (float(num.group(1)) if "." in num.group(1) else int(num.group(1))), None
    return raw, None


def parse_health(stdout: str, fields: list[str], unsupported: list[str] | None = None) -> list[GpuHealth]:
    """`nvidia-smi --query-gpu=<fields> --format=csv,noheader[,nounits]` -> one GpuHealth per GPU line."""
    out: list[GpuHealth] = []
    for line in stdout.splitlines():
        if not line.strip() or "," not in line:
            continue
        parts = [p.strip() for p in line.split(",")]
        h = GpuHealth(index=len(out))
        for name, raw in zip(fields, parts):
            value, why = parse_health_value(raw)
            if name == "index" and isinstance(value, int):
                h.index = value
                continue
            h.values[name] = value
            if why:
                h.unknown[name] = why
        for name in unsupported or []:
            h.values[name] = None
            h.unknown[name] = "not supported by this driver"
        out.append(h)
    return out


def parse_xids(lines: list[str]) -> list[dict]:
    """Xid events from kernel log lines (dmesg or journalctl format): code, PCI address, the driver's text."""
    found = []
    for line in lines or []:
        m = _XID.search(line)
        if m:
            found.append({"code": int(m.group(2)), "pci": m.group(1), "text": m.group(3).strip()[:300],
                          "line": line.strip()[:400]})
    return found


def _health_from_probe(doc: dict, f: Facts) -> None:
    h = fact_value(doc, "gpu_health")
    if h is not None:
        if h.get("found") and h.get("rc") == 0:
            f.health = parse_health(h.get("stdout") or "", h.get("fields") or [], h.get("unsupported"))
            f.health_unsupported = list(h.get("unsupported") or [])
        elif h.get("found"):
            text = ((h.get("stdout") or "") + (h.get("stderr") or "")).strip()
            f.errors["gpu_health"] = "nvidia-smi health query " + (
                "timed out" if h.get("timeout") else f"failed (exit {h.get('rc')}): {_first_line(text)}")
    k = fact_value(doc, "kernel_log")
    if k is not None:
        f.kernel_log = {key: k.get(key) for key in ("readable", "source", "error", "total_lines")}
        f.xids = parse_xids(k.get("lines") or []) if k.get("readable") else []
    b = fact_value(doc, "bench")
    if b is not None:
        if "result" in b:
            f.bench = b["result"]
        else:
            f.bench = {"error": b.get("error") or "the bench printed nothing", "timeout": bool(b.get("timeout")),
                       "stderr": (b.get("stderr") or "")[-1000:]}
    elif "bench" in f.errors:
        f.bench = {"error": f.errors["bench"], "timeout": "timed out" in f.errors["bench"]}
