"""Environment snapshots: what ran, so a run can be recreated months later and differences found fast (comparing
saved snapshots, `gpuops diff` and `gpuops matrix`, is transfer/snapcompare.py's).

Pure core (unit-tested on recorded probe outputs in tests/data/):
  build(facts, ...)        probe facts -> the snapshot document (what environment.json holds)
  render_requirements()    requirements.txt (pip freeze format, credentials in URLs redacted)
  render_reproduce()       REPRODUCE.md (Python, install commands with the matching PyTorch index, hardware,
                           known sources of non-determinism)
Shell (network and disk):
  capture(remote, profile)       ONE remote execution (the probe with pip freeze)
  save(snapshot, out_dir)        the three files, each written atomically
  write_remote(remote, snapshot, remote_dir)   the same three files on the host, ONE remote execution
  snapshot_for_run(...)          what `gpuops train` calls after launching a run
  log_to_wandb(...)              a versioned W&B artifact of type `environment` + key versions in the run config
wandb is imported only inside log_to_wandb.
"""
from __future__ import annotations

import io
import json
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from ..errors import GpuopsError, RemoteError, UsageError
from ..verify.facts import fact_value

SCHEMA = 1
FILES = ("requirements.txt", "environment.json", "REPRODUCE.md")
KEY_PACKAGES = ["torch", "torchvision", "torchaudio", "transformers", "numpy", "accelerate", "deepspeed",
                "flash-attn", "triton", "jax", "tensorflow", "pip"]
TORCH_INDEX = "https://download.pytorch.org/whl/"


# -- small helpers -----------------------------------------------------------------------------------
def normalize(name: str) -> str:
    """PEP 503 name: 'Flask_Cors' and 'flask-cors' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _fact_error(facts: dict, name: str) -> str | None:
    f = facts.get(name)
    if isinstance(f, dict) and not f.get("ok"):
        return f.get("error") or "failed"
    return None


_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^/@\s]+)@")


def redact(text: str) -> str:
    """Remove credentials from URLs (https://user:token@host, https://token@host); keep ssh's `git@`."""
    def sub(m: re.Match) -> str:
        scheme, user = m.group("scheme"), m.group("user")
        if ":" in user or "http" in scheme.lower():
            return f"{scheme}****@"
        return m.group(0)
    return _USERINFO.sub(sub, text)


def cudnn_text(v: Any) -> str | None:
    """torch.backends.cudnn.version() -> '9.10.2' (91002) or '8.9.2' (8902)."""
    if v in (None, "", 0):
        return None
    try:
        n = int(v)
    except (TypeError, ValueError):
        return str(v)
    if n >= 10000:
        return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"
    return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"


def parse_freeze(text: str) -> dict[str, str]:
    """`pip freeze` lines -> {name: version}; `name @ url` and editables get the URL as their version."""
    pkgs: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-e ") or line.startswith("--editable"):
            m = re.search(r"[#&]egg=([A-Za-z0-9_.-]+)", line)
            if m:
                pkgs[m.group(1)] = line.split(None, 1)[1]
            continue
        if line.startswith("-"):
            continue
        if "==" in line:
            name, _, ver = line.partition("==")
            pkgs[name.strip()] = ver.strip()
        elif " @ " in line:
            name, _, url = line.partition(" @ ")
            pkgs[name.strip()] = "@ " + url.strip()
    return pkgs


def _lookup(packages: dict[str, str], name: str) -> str | None:
    want = normalize(name)
    for k, v in packages.items():
        if normalize(k) == want:
            return v
    return None


def _smi_rows(text: str) -> list[dict]:
    """GPU rows for the snapshot, parsed by facts.parse_smi_query (the parser verify uses)."""
    from ..verify.facts import parse_smi_query

    return [{"index": g.index, "name": g.name,
             "memory_total_mib": int(g.memory_total_mib) if g.memory_total_mib is not None else None,
             "compute_cap": g.compute_cap, "driver_version": g.driver_version, "pci_bus_id": g.bus_id,
             "uuid": g.uuid} for g in parse_smi_query(text)]


def short_python(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"\d+\.\d+(\.\d+)?", version)
    return m.group(0) if m else version


def torch_index_url(torch_version: str | None, cuda_version: str | None, torch_imported: bool = True) -> str | None:
    """The PyTorch wheel index matching the build: 2.9.0+cu128 -> .../whl/cu128; +cpu -> .../whl/cpu."""
    if not torch_version:
        return None
    m = re.search(r"\+(cu\d+|cpu|rocm[\d.]+|xpu)$", torch_version)
    if m:
        return TORCH_INDEX + m.group(1)
    if cuda_version:
        parts = cuda_version.split(".")
        return TORCH_INDEX + "cu" + "".join(parts[:2])
    return TORCH_INDEX + "cpu" if torch_imported else None


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


# -- facts -> snapshot ---------------------------------------------------------------------------------
def build(facts: dict, *, profile: Any = None, captured_at: str | None = None, extra: dict | None = None) -> dict:
    """The snapshot document from the probe's facts. Pure; never holds environment variables or secrets."""
    problems: list[str] = []
    if not facts.get("python_ok", True):
        raise RemoteError(f"Python {facts.get('python_missing', '')!s} was not found on the host; a snapshot needs "
                          "the Python that runs your training", hint="set 'python:' in the profile")
    py = fact_value(facts, "python") or {}
    osv = fact_value(facts, "os") or {}
    packages, freeze_text, freeze_source = _packages(facts, problems)
    listed = fact_value(facts, "packages") or {}

    def version_of(name: str) -> str | None:
        return _lookup(packages, name) or (listed.get(name) if isinstance(listed, dict) else None)

    cres, torch_imported, torch_version, cuda_version = _torch(facts, problems, version_of)
    gpus, driver, cuda_driver, names = _gpus(facts, problems, cres)
    nvcc = fact_value(facts, "nvcc") or {}
    m = re.search(r"release [\d.]+, V([\d.]+)", nvcc.get("stdout") or "")
    return {
        "gpuops_snapshot": SCHEMA,
        "captured_at": captured_at or now_iso(),
        "source": _source(profile, extra),
        "python_version": py.get("full") or py.get("version"),
        "python_version_short": short_python(py.get("version") or py.get("full")),
        "python_implementation": py.get("implementation"),
        "python_executable": py.get("executable"),
        "platform": py.get("platform"),
        "os_name": osv.get("pretty"),
        "os_release": osv.get("kernel"),
        "arch": osv.get("arch"),
        "torch_version": torch_version,
        "transformers_version": version_of("transformers"),
        "numpy_version": version_of("numpy"),
        "torchvision_version": version_of("torchvision"),
        "torchaudio_version": version_of("torchaudio"),
        "cuda_available": bool(cres.get("available")) if torch_imported else None,
        "cuda_version": cuda_version,
        "cudnn_version": cudnn_text(cres.get("cudnn")),
        "cuda_driver_version": cuda_driver,
        "nvcc_version": m.group(1) if m else None,
        "driver_version": driver,
        "gpu_name": " + ".join(names) if names else None,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "torch_index_url": torch_index_url(torch_version, cuda_version, torch_imported),
        "pip_freeze_source": freeze_source,
        "pip_freeze": freeze_text,
        "packages": packages,
        "problems": problems,
    }


def _packages(facts: dict, problems: list[str]) -> tuple[dict, str, str]:
    """(packages, requirements text, where it came from): importlib.metadata (canonical versions) and anything only
    pip reports; pip freeze's own text when it ran, else one built from the metadata."""
    meta = fact_value(facts, "freeze") or {}
    if _fact_error(facts, "freeze"):
        problems.append(f"package list: {_fact_error(facts, 'freeze')}")
    pf = fact_value(facts, "pip_freeze") or {}
    if pf.get("rc") == 0 and pf.get("stdout", "").strip():
        freeze_text, freeze_source = redact(pf["stdout"]), "pip freeze --all"
    else:
        freeze_text = "".join(f"{n}=={v}\n" for n, v in sorted(meta.items(), key=lambda kv: kv[0].lower()))
        freeze_source = "importlib.metadata"
        if pf.get("stderr") or pf.get("timeout"):
            why = "timed out" if pf.get("timeout") else (pf.get("stderr", "").strip().splitlines() or ["failed"])[-1]
            problems.append(f"pip freeze unavailable ({why[:200]}); requirements.txt built from importlib.metadata")
    packages = dict(parse_freeze(freeze_text))
    known = {normalize(k) for k in packages}
    for n, v in meta.items():
        if normalize(n) not in known:
            packages[n] = v
    return dict(sorted(packages.items(), key=lambda kv: kv[0].lower())), freeze_text, freeze_source


def _torch(facts: dict, problems: list[str], version_of) -> tuple[dict, bool, str | None, str | None]:
    """torch, CUDA, cuDNN as the training Python sees them: (the CUDA test's result, imported, torch, CUDA)."""
    cuda_fact = fact_value(facts, "cuda") or {}
    cres = cuda_fact.get("result") if isinstance(cuda_fact, dict) else None
    cres = cres if isinstance(cres, dict) else {}
    if cres.get("error") and version_of("torch"):
        problems.append(f"torch import failed: {cres['error'][:300]}")
    elif cuda_fact.get("error") or cuda_fact.get("timeout"):
        problems.append(f"CUDA check: {cuda_fact.get('error', 'timed out')}")
    return cres, bool(cres.get("imported")), cres.get("version") or version_of("torch"), cres.get("cuda")


def _gpus(facts: dict, problems: list[str], cres: dict) -> tuple[list[dict], str | None, str | None, list[str]]:
    """GPUs and driver from nvidia-smi (torch's devices when nvidia-smi listed none): (gpus, driver, the CUDA the
    driver supports, the distinct GPU names)."""
    from ..verify.facts import parse_smi_header

    gpus: list[dict] = []
    q = fact_value(facts, "nvidia_smi_query") or {}
    if not q.get("found", False):
        problems.append("nvidia-smi not found on the host")
    elif q.get("rc") == 0:
        gpus = _smi_rows(q.get("stdout", ""))
    else:
        msg = (q.get("stderr") or q.get("stdout") or "").strip().splitlines()
        problems.append(f"nvidia-smi failed (exit {q.get('rc')}): {msg[0] if msg else 'no output'}")
    header = parse_smi_header((fact_value(facts, "nvidia_smi") or {}).get("stdout") or "")  # legacy or R610+ KMD header
    drivers = sorted({g["driver_version"] for g in gpus if g.get("driver_version")})
    driver = (drivers[0] if len(drivers) == 1 else ", ".join(drivers)) if drivers else header["driver"]
    if not gpus and cres.get("devices"):
        gpus = [{"index": d.get("index"), "name": d.get("name"), "compute_cap": d.get("capability")}
                for d in cres["devices"]]
    names: list[str] = []
    for g in gpus:
        if g.get("name") and g["name"] not in names:
            names.append(g["name"])
    return gpus, driver, header["cuda"], names


def _source(profile: Any, extra: dict | None) -> dict[str, Any]:
    """Where the snapshot was taken: the profile's name, instance type, region and python, and the caller's extras."""
    src: dict[str, Any] = {}
    if profile is not None:
        src = {"profile": getattr(profile, "name", None), "instance_type": getattr(profile, "instance_type", None),
               "region": getattr(profile, "region", None), "python": getattr(profile, "python", None)}
    src.update({k: v for k, v in (extra or {}).items() if v is not None})
    return src


def key_versions(snap: dict) -> dict:
    """The few versions worth filtering runs by (W&B config, summaries)."""
    return {"python": snap.get("python_version_short"), "torch": snap.get("torch_version"),
            "cuda": snap.get("cuda_version"), "cudnn": snap.get("cudnn_version"),
            "driver": snap.get("driver_version"), "gpu": snap.get("gpu_name"), "gpu_count": snap.get("gpu_count")}


# -- rendering the three files ---------------------------------------------------------------------------
def render_requirements(snap: dict) -> str:
    src = snap.get("source") or {}
    where = f" from profile {src['profile']}" if src.get("profile") else ""
    head = [f"# gpuops snapshot{where} at {snap.get('captured_at')}; Python {snap.get('python_version_short')}",
            f"# source: {snap.get('pip_freeze_source')}; recreate: see REPRODUCE.md"]
    if snap.get("torch_index_url") and "+" in (snap.get("torch_version") or ""):
        head.append(f"# torch local versions (+...) come from {snap['torch_index_url']} (--extra-index-url)")
    body = redact(snap.get("pip_freeze") or "")
    if body and not body.endswith("\n"):
        body += "\n"
    return "\n".join(head) + "\n" + body


def render_json(snap: dict) -> str:
    return json.dumps(snap, indent=2, sort_keys=False) + "\n"


def gpu_line(snap: dict) -> str:
    """The GPUs in one line: `2 x NVIDIA H100 80GB HBM3 (80 GiB each)`, or `none detected`."""
    if not snap.get("gpu_count"):
        return "none detected"
    mems = {g.get("memory_total_mib") for g in snap.get("gpus", []) if g.get("memory_total_mib")}
    mem = f" ({round(max(mems) / 1024)} GiB each)" if mems else ""
    return f"{snap['gpu_count']} x {snap.get('gpu_name')}{mem}"


def _compute_caps(snap: dict) -> list[float]:
    caps = []
    for g in snap.get("gpus", []):
        try:
            caps.append(float(g.get("compute_cap")))
        except (TypeError, ValueError):
            pass
    return caps


def nondeterminism(snap: dict) -> list[str]:
    items = [
        "GPU floating-point atomics (`index_add_`, `scatter_add_`, many backward kernels) sum in a varying order, so "
        "results differ slightly from run to run. For bit-exact runs call `torch.use_deterministic_algorithms(True)` "
        "and set `CUBLAS_WORKSPACE_CONFIG=:4096:8` (slower; see docs/reproducibility.md).",
        "The cuDNN autotuner (`torch.backends.cudnn.benchmark = True`) picks kernels by timing; keep it off and set "
        "`torch.backends.cudnn.deterministic = True`.",
        "Seeds: Python `random`, NumPy and torch (CPU and every GPU) must all be seeded, and DataLoader workers "
        "seeded through `worker_init_fn` and a seeded `generator`; `PYTHONHASHSEED` fixes set/dict-of-str order.",
    ]
    if any(c >= 8.0 for c in _compute_caps(snap)):
        items.append("TF32: these GPUs (compute capability >= 8.0) may run float32 matmuls and convolutions in TF32. "
                     "Keep `torch.backends.cuda.matmul.allow_tf32` / `torch.backends.cudnn.allow_tf32` (or "
                     "`torch.set_float32_matmul_precision`) the same as in the original run.")
    if (snap.get("gpu_count") or 0) > 1:
        items.append(f"Multi-GPU: {snap['gpu_count']} GPUs; all-reduce (NCCL) order and the per-GPU batch depend on "
                     "the number of GPUs. Reproduce with the same GPU count.")
    items.append(f"Hardware and stack: a different GPU model, driver, CUDA or cuDNN than {gpu_line(snap)} / driver "
                 f"{snap.get('driver_version') or 'unknown'} / CUDA {snap.get('cuda_version') or 'n/a'} / cuDNN "
                 f"{snap.get('cudnn_version') or 'n/a'} selects different kernels; expect small numeric differences. "
                 "Compare environments with `gpuops diff`.")
    return items


def render_reproduce(snap: dict) -> str:
    src = snap.get("source") or {}
    pyv = snap.get("python_version_short") or "unknown"
    url = snap.get("torch_index_url")
    lines = ["# Reproducing this environment", ""]
    where = [f"profile `{src['profile']}`" if src.get("profile") else None,
             f"instance type `{src['instance_type']}`" if src.get("instance_type") else None,
             f"run `{src['run_id']}`" if src.get("run_id") else None]
    lines += [f"Captured by `gpuops snapshot` at {snap.get('captured_at')}"
              + (" (" + ", ".join(w for w in where if w) + ")" if any(where) else "") + ".", ""]
    lines += ["## 1. Python", "", f"This environment ran **Python {pyv}** ({snap.get('python_implementation') or 'CPython'}"
              f", {snap.get('platform') or 'unknown platform'}). Create a virtual environment with the same version:", "",
              "```bash", f"uv venv --python {pyv} .venv && source .venv/bin/activate",
              f"# or: pyenv install {pyv} && pyenv local {pyv} && python -m venv .venv && source .venv/bin/activate",
              f"python --version   # must print Python {pyv}", "```", ""]
    lines += ["## 2. Packages", ""]
    tv = snap.get("torch_version")
    if tv and url:
        companions = [f"torch=={tv}"]
        for comp in ("torchvision", "torchaudio"):
            v = snap.get(f"{comp}_version")
            if v and not v.startswith("@"):
                companions.append(f"{comp}=={v}")
        lines += [f"PyTorch {tv} was built for {'CUDA ' + snap['cuda_version'] if snap.get('cuda_version') else 'CPU'}; "
                  f"its wheels come from the PyTorch index `{url}`. Install it first, then the rest:", "",
                  "```bash", f"pip install {' '.join(companions)} --index-url {url}",
                  f"pip install -r requirements.txt --extra-index-url {url}", "```", "",
                  f"With uv: `uv pip install -r requirements.txt --extra-index-url {url} --index-strategy unsafe-best-match`.",
                  ""]
    else:
        lines += ["```bash", "pip install -r requirements.txt", "```", ""]
    lines += [f"`requirements.txt` lists all {len(snap.get('packages') or {})} packages exactly as `pip freeze` printed "
              f"them (source: {snap.get('pip_freeze_source')}). Then check:", "", "```bash",
              "python - <<'PY'", "import sys; print('python', sys.version.split()[0])",
              "try:", "    import torch",
              "    print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())",
              "except ImportError:", "    print('torch not installed')", "PY", "```", "",
              f"Expected: python {pyv}, torch {tv or 'not installed'}, cuda {snap.get('cuda_version') or 'None'}, "
              f"cudnn {snap.get('cudnn_version') or 'None'}.", ""]
    lines += ["## 3. Hardware and drivers", "", "| Component | Version |", "|-----------|---------|",
              f"| OS | {snap.get('os_name') or 'unknown'} (kernel {snap.get('os_release') or '?'}, {snap.get('arch') or '?'}) |",
              f"| GPUs | {gpu_line(snap)} |",
              f"| NVIDIA driver | {snap.get('driver_version') or 'unknown'} |",
              f"| CUDA supported by the driver | {snap.get('cuda_driver_version') or 'unknown'} |",
              f"| CUDA runtime (PyTorch build) | {snap.get('cuda_version') or 'n/a'} |",
              f"| cuDNN | {snap.get('cudnn_version') or 'n/a'} |"]
    if snap.get("nvcc_version"):
        lines.append(f"| CUDA toolkit (nvcc) | {snap['nvcc_version']} |")
    caps = sorted({g.get("compute_cap") for g in snap.get("gpus", []) if g.get("compute_cap")})
    if caps:
        lines.append(f"| Compute capability | {', '.join(caps)} |")
    lines += ["", "The driver must support the CUDA runtime of the PyTorch build (`nvidia-smi` shows the highest CUDA "
              "version the driver supports).", ""]
    lines += ["## 4. Known sources of non-determinism", ""]
    if src.get("seed") is not None:
        lines += [f"This run used seed **{src['seed']}** (`GPUOPS_SEED={src['seed']}`, `PYTHONHASHSEED={src['seed']}`); "
                  f"relaunch with `gpuops train --seed {src['seed']}`.", ""]
    lines += [f"- {item}" for item in nondeterminism(snap)]
    if snap.get("problems"):
        lines += ["", "## Notes from the capture", ""] + [f"- {p}" for p in snap["problems"]]
    return "\n".join(lines) + "\n"


def render_files(snap: dict) -> dict[str, str]:
    return {"requirements.txt": render_requirements(snap), "environment.json": render_json(snap),
            "REPRODUCE.md": render_reproduce(snap)}


def save(snapshot: dict, out_dir: Path | str) -> dict[str, Path]:
    """Write requirements.txt, environment.json and REPRODUCE.md into out_dir, each atomically."""
    from ..paths import write_atomic

    out = Path(out_dir)
    paths = {}
    try:
        for name, text in render_files(snapshot).items():
            write_atomic(out / name, text)
            paths[name] = out / name
    except OSError as exc:
        raise UsageError(f"cannot write the snapshot to {out}: {exc.strerror or exc}") from exc
    return paths


# -- loading saved snapshots ---------------------------------------------------------------------------
def load(path: Path | str) -> dict:
    """A snapshot from environment.json, a snapshot folder, or a run folder (its environment/)."""
    p = Path(path)
    cands = [p] if p.is_file() else [p / "environment.json", p / "environment" / "environment.json"]
    for c in cands:
        if c.is_file():
            try:
                doc = json.loads(c.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise UsageError(f"{c}: not a readable environment.json ({exc})") from exc
            if not isinstance(doc, dict) or not ("packages" in doc or "pip_freeze" in doc):
                raise UsageError(f"{c}: not an environment snapshot (no 'packages')")
            if "packages" not in doc:
                doc["packages"] = parse_freeze(doc.get("pip_freeze") or "")
            doc.setdefault("python_version_short", short_python(doc.get("python_version")))
            doc["_path"] = str(c)
            return doc
    raise UsageError(f"{p}: no environment.json there", hint="give a snapshot folder, an environment.json, a run id "
                                                             "or a profile name")


def find_run_env(ref: str, project_dir: Path) -> Path | None:
    """runs/<id>/environment (an exact id, or a unique prefix of one)."""
    runs = project_dir / "runs"
    if not runs.is_dir() or "/" in ref or ref in (".", ".."):
        return None
    exact = runs / ref / "environment"
    if (exact / "environment.json").is_file():
        return exact
    matches = [d / "environment" for d in runs.iterdir()
               if d.name.startswith(ref) and (d / "environment" / "environment.json").is_file()]
    return matches[0] if len(matches) == 1 else None


# -- remote capture and writing --------------------------------------------------------------------------------
def capture(remote, profile, *, extra: dict | None = None, project_dir: Path | None = None) -> dict:
    """ONE remote execution: the probe with pip freeze, then build() here."""
    from ..remote.gather import gather

    params = {"freeze": True, "packages": KEY_PACKAGES, "remote_dir": profile.remote_dir_for(project_dir),
              "cuda_check": True}
    facts = gather(remote, params, python=profile.python)
    return build(facts, profile=profile, extra=extra)


def write_remote(remote, snapshot: dict, remote_dir: str, *, timeout: float = 60.0) -> None:
    """The three files into remote_dir on the host: ONE execution, a tar archive over stdin, the path quoted."""
    import tarfile
    import time

    from ..remote.shell import shell_path

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, text in render_files(snapshot).items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    d = shell_path(remote_dir)
    res = remote.run(f"mkdir -p {d} && tar -xf - -C {d}", stdin=buf.getvalue(), timeout=timeout)
    if res.rc != 0:
        detail = (res.stderr.strip().splitlines() or [f"exit {res.rc}"])[-1]
        raise RemoteError(f"could not write the snapshot to {remote_dir} on the host: {detail}")


def snapshot_for_run(remote, profile, *, run_id: str, remote_run_dir: str, local_dir: Path | str, out,
                     seed: int | None = None, wandb: bool | None = None, project_dir: Path | None = None) -> dict:
    """Called by `gpuops train` right after launch: capture (one execution), save under local_dir
    (runs/<run id>/environment/), write the same files to <remote_run_dir>/environment/ (one execution), and log to
    W&B when WANDB_API_KEY is set (os.environ over ./.env) or wandb=True.

    Never raises for a failed snapshot (the run is already running): it warns through `out` and returns
    {"ok": False, "error": ...}. Returns {"ok", "local_dir", "remote_dir", "files", "snapshot", "wandb", "error"}.
    """
    from ..profiles import model as profiles

    project_dir = project_dir or Path.cwd()
    remote_env_dir = remote_run_dir.rstrip("/") + "/environment"
    result: dict[str, Any] = {"ok": False, "local_dir": str(local_dir), "remote_dir": remote_env_dir, "files": [],
                              "snapshot": None, "wandb": None, "error": None}
    try:
        snap = capture(remote, profile, extra={"run_id": run_id, "seed": seed}, project_dir=project_dir)
        files = save(snap, local_dir)
        write_remote(remote, snap, remote_env_dir)
    except GpuopsError as exc:
        out.warn(f"environment snapshot failed: {exc.message}")
        result["error"] = exc.message
        return result
    result.update(ok=True, snapshot=snap, files=[str(p) for p in files.values()])
    out.step(f"environment snapshot: {local_dir} and {remote_env_dir} on the host")
    env = profiles.environment(project_dir)
    if wandb if wandb is not None else bool(env.get("WANDB_API_KEY")):
        try:
            info = log_to_wandb(local_dir, snap, run_name=f"{run_id}-environment",
                                project=env.get("WANDB_PROJECT") or project_dir.resolve().name,
                                entity=env.get("WANDB_ENTITY"), api_key=env.get("WANDB_API_KEY"),
                                artifact_name=f"{profile.name}-environment", aliases=[run_id],
                                config={"gpuops_run_id": run_id, "seed": seed}, group=profile.name,
                                mode=wandb_mode(env), timeout=wandb_timeout(env))
            result["wandb"] = info
            out.step(f"W&B: artifact {info['artifact']} (type environment), run {info['run_name']} "
                     f"({info['mode']})")
        except GpuopsError as exc:
            out.warn(exc.message if exc.message.startswith("W&B logging failed") else f"W&B logging failed: {exc.message}")
            result["error"] = exc.message
    return result


# -- Weights & Biases ------------------------------------------------------------------------------------------------
def _artifact_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "environment"


def wandb_mode(env: dict) -> str:
    return (env.get("WANDB_MODE") or "online").lower()


WANDB_TIMEOUT_S = 60.0  # every W&B call gpuops makes ends within this (GPUOPS_WANDB_TIMEOUT changes it)


def wandb_timeout(env: dict) -> float:
    """The bound of gpuops' own W&B logging, in seconds: GPUOPS_WANDB_TIMEOUT (os.environ over ./.env), else 60."""
    try:
        value = float(env.get("GPUOPS_WANDB_TIMEOUT") or WANDB_TIMEOUT_S)
    except ValueError:
        return WANDB_TIMEOUT_S
    return value if value > 0 else WANDB_TIMEOUT_S


def log_to_wandb(snapshot_dir: Path | str, snapshot: dict, *, run_name: str, project: str, entity: str | None = None,
                 api_key: str | None = None, artifact_name: str | None = None, aliases: Iterable[str] = (),
                 config: dict | None = None, job_type: str = "environment", group: str | None = None,
                 run=None, mode: str | None = None, timeout: float = WANDB_TIMEOUT_S) -> dict:
    """log_to_wandb_unbounded in a thread of its own, waited for `timeout` seconds at most: W&B online retries an
    unreachable server for 90 s and more, which must never hold a launch. mode: WANDB_MODE as the project says it
    (os.environ over ./.env, see snapshot_for_run); None: the process environment's. Raises GpuopsError when the
    time is up (the thread, a daemon, is left to W&B)."""
    import os
    import threading

    box: dict = {}

    def work() -> None:
        try:
            box["info"] = log_to_wandb_unbounded(snapshot_dir, snapshot, run_name=run_name, project=project,
                                                 entity=entity, api_key=api_key, artifact_name=artifact_name,
                                                 aliases=aliases, config=config, job_type=job_type, group=group,
                                                 run=run, mode=mode, init_timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    t = threading.Thread(target=work, name="gpuops-wandb", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise GpuopsError(f"W&B logging gave up after {timeout:g}s (W&B did not answer in time; mode "
                          f"{mode or wandb_mode(dict(os.environ))})",
                          hint="set WANDB_MODE=offline in .env to log locally (`wandb sync` later), or "
                               "GPUOPS_WANDB_TIMEOUT=SECONDS for a slow network")
    if "error" in box:
        raise box["error"]
    return box["info"]


def log_to_wandb_unbounded(snapshot_dir: Path | str, snapshot: dict, *, run_name: str, project: str,
                           entity: str | None = None, api_key: str | None = None, artifact_name: str | None = None,
                           aliases: Iterable[str] = (), config: dict | None = None, job_type: str = "environment",
                           group: str | None = None, run=None, mode: str | None = None,
                           init_timeout: float = WANDB_TIMEOUT_S) -> dict:
    """Log the three files as a versioned artifact of type `environment`, key versions in the run config.

    Uses `run` if given (an active wandb run), else starts one and finishes it. The API key goes to wandb through
    the process environment only for the duration of the call; it is never printed or written by gpuops.
    """
    import os

    d = Path(snapshot_dir)
    missing = [n for n in FILES if not (d / n).is_file()]
    if missing:
        raise UsageError(f"{d}: missing {', '.join(missing)}; not a snapshot folder")
    mode = (mode or wandb_mode(dict(os.environ))).lower()
    if mode not in ("offline", "disabled", "dryrun") and not (api_key or os.environ.get("WANDB_API_KEY")):
        raise UsageError("W&B logging needs WANDB_API_KEY (in the environment or ./.env)",
                         hint="export WANDB_API_KEY=... or set WANDB_MODE=offline and `wandb sync` later")
    try:
        import wandb
    except ImportError as exc:
        raise UsageError("the wandb package is not installed", hint="pip install wandb") from exc

    versions = key_versions(snapshot)
    meta = {**versions, "captured_at": snapshot.get("captured_at"), "packages": len(snapshot.get("packages") or {}),
            "torch_index_url": snapshot.get("torch_index_url"), "source": snapshot.get("source") or {}}
    name = _artifact_name(artifact_name or f"{run_name}-environment")
    restore = {}  # what the process environment held before this call (wandb reads it too)
    for var, value in (("WANDB_API_KEY", api_key), ("WANDB_MODE", mode)):
        if value and os.environ.get(var) != value:
            restore[var] = os.environ.get(var)
            os.environ[var] = value
    started = run is None
    try:
        if started:
            # x_disable_meta: W&B's metadata is the process's argv (`--env API_TOKEN=...`, a `--data` URL with its
            # credentials), host and program; none of it is W&B's to keep (issue #36)
            settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, x_save_requirements=False,
                                      x_disable_meta=True, x_disable_machine_info=True,
                                      disable_git=True, save_code=False, mode=mode,
                                      init_timeout=max(1.0, float(init_timeout)))
            # dir: W&B's default (WANDB_DIR, else ./wandb) read now: wandb's process-wide setup otherwise keeps the
            # folder of its first run, so a second run from another folder in one process would land in the first's
            run = wandb.init(project=project, entity=entity or None, name=run_name, job_type=job_type, group=group,
                             dir=os.environ.get("WANDB_DIR") or os.getcwd(),
                             config={"environment": versions, **{k: v for k, v in (config or {}).items() if v is not None}},
                             settings=settings, reinit="create_new")
        else:
            run.config.update({"environment": versions}, allow_val_change=True)
        art = wandb.Artifact(name, type="environment", metadata=meta,
                             description=f"Python {versions['python']}, torch {versions['torch']}, CUDA "
                                         f"{versions['cuda']}, driver {versions['driver']}, {versions['gpu']}")
        for n in FILES:
            art.add_file(str(d / n), name=n)
        logged = run.log_artifact(art, aliases=["latest", *aliases])
        info = {"mode": str(getattr(run.settings, "mode", mode)), "project": project, "run_id": run.id,
                "run_name": run_name, "run_dir": str(Path(run.dir).parent), "artifact": f"{name}:latest",
                "artifact_type": "environment", "config": versions}
        if info["mode"] not in ("offline", "disabled"):
            info["url"] = getattr(run, "url", None)
        del logged
        if started:
            run.finish()
            wandb.teardown()  # wait for wandb's service to write everything (the offline run file included)
    except GpuopsError:
        raise
    except Exception as exc:  # wandb raises many types (CommError, UsageError, AuthenticationError)
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if api_key:
            msg = msg.replace(api_key, "****")
        raise GpuopsError(f"W&B logging failed: {type(exc).__name__}: {msg[:300]}") from None
    finally:
        for var, before in restore.items():
            if before is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = before
    return info
