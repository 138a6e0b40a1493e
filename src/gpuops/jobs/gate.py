"""The launch gate (pure): what the preflight's one remote execution found (`parse_preflight`), the facts the gate
asks the probe for (`gate_params`), the failed checks that make a run worthless as verify words them
(`gate_results`), a GPU the job sees held by a process that is not a gpuops run (`gpu_holders`), the modules the
job's python cannot find, and the verdict (`judge_preflight`: launch, warn, or refuse with the fix)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..errors import ChecksFailed, GpuopsError, UsageError


# -- preflight --------------------------------------------------------------------------------
@dataclass
class Preflight:
    gpus: list[str] = field(default_factory=list)
    gpu_error: Optional[str] = None
    free_gb: Optional[float] = None
    active: list[str] = field(default_factory=list)  # ids of gpuops runs still running on the host
    active_pids: list[int] = field(default_factory=list)  # their launchers' pids (= process group and session ids)
    packages: Optional[dict[str, Optional[str]]] = None
    has_setsid_fork: bool = True
    job_gpus: int = 0  # the GPUs the job is given: all listed, or those its CUDA_VISIBLE_DEVICES names (job_gpu_count)
    compile_error: Optional[str] = None  # the launch gate: the script does not compile (.py) or is unreadable
    python_found: Optional[bool] = None  # the launch gate: the profile's python exists on the host (None: not asked)
    facts: Optional[dict] = None  # the launch gate: the verify probe's document (stack facts), when gathered


def parse_preflight(text: str) -> Preflight:
    """Sections written by launch.PREFLIGHT: `@gpu rc=N`, `@df`, `@active`, `@pkg`, `@setsid`."""
    pf = Preflight()
    section, gpu_lines, gpu_rc = None, [], 0
    for line in text.splitlines():
        if line.startswith("@"):
            head = line[1:].split()
            section = head[0] if head else None
            if section == "gpu_rc":
                gpu_rc = int(head[1]) if len(head) > 1 and head[1].lstrip("-").isdigit() else 1
            elif section == "setsid":
                pf.has_setsid_fork = len(head) > 1 and head[1] == "1"
            elif section == "python":
                pf.python_found = len(head) > 1 and head[1] == "1"
            elif section == "compile":
                msg = line[len("@compile"):].strip()
                pf.compile_error = None if msg == "ok" else (msg or "the script could not be compiled")
            continue
        if section == "facts":
            if line.startswith("{"):
                try:
                    pf.facts = json.loads(line)
                except ValueError:
                    pass
            continue
        if section == "gpu":
            if line.strip():
                gpu_lines.append(line.strip())
        elif section == "df":
            parts = line.split()
            if len(parts) >= 4 and parts[3].isdigit():
                pf.free_gb = int(parts[3]) / 1024 / 1024
        elif section == "active":
            parts = line.split()
            if parts:
                pf.active.append(parts[0])
                if len(parts) > 1 and parts[1].isdigit():
                    pf.active_pids.append(int(parts[1]))
        elif section == "pkg":
            if pf.packages is None:
                pf.packages = {}
            name, _, ver = line.partition("=")
            if name.strip():
                pf.packages[name.strip()] = ver.strip() or None
    if gpu_rc != 0 or not gpu_lines:
        pf.gpu_error = (gpu_lines[0] if gpu_lines else "") or f"nvidia-smi exited {gpu_rc} and listed no GPU"
    else:
        pf.gpus = gpu_lines
    return pf


@dataclass
class PreflightVerdict:
    warnings: list[str] = field(default_factory=list)  # shown in this order, before the error if there is one
    error: Optional[GpuopsError] = None  # the launch is refused with this
    forced: list[str] = field(default_factory=list)  # problems --force launched past (recorded in meta.json)


# -- the launch gate: a stack that makes the run worthless ------------------------------------------
GATE_PACKAGES = ("torch", "torchvision", "torchaudio", "flash-attn")
GATE_SKIP = ("os", "cpus", "memory", "disk", "nvcc")  # facts the gate does not judge


def flash_attn_expected(profile) -> bool:
    e = profile.expect
    return "flash-attn" in e.packages or "flash_attn" in e.packages or "flash_attn" in e.imports


CVD = "CUDA_VISIBLE_DEVICES"


def gate_params(profile, remote_dir: str, *, env: Optional[dict[str, Optional[str]]] = None,
                modules: Optional[dict[str, list[str]]] = None) -> dict:
    """The verify probe's parameters for the launch gate: only the facts it judges (it runs inside the preflight).
    env: the job's variables (job_env): the CUDA test and the module check run with them, as the job will.
    modules: job_imports.probe_groups (sys.path[0] -> names the job's python must find)."""
    return {"remote_dir": remote_dir, "packages": sorted(set(GATE_PACKAGES) | set(profile.expect.packages)),
            "imports": ["flash_attn"] if flash_attn_expected(profile) else [], "cuda_check": True,
            "skip": list(GATE_SKIP), "timeouts": {"cuda_check": 60, "imports": 60}, "env": [CVD],
            "job_env": env or {}, "gpu_apps": True, "find_modules": {"cwd": remote_dir, "groups": modules or {}}}


def job_cvd(facts, env: Optional[dict[str, Optional[str]]]) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES as the job will have it: the run's environment plan, else the host's (None: not set)."""
    if env and CVD in env:
        return env[CVD]
    return facts.env.get(CVD)


def _given(facts, env: Optional[dict[str, Optional[str]]]) -> tuple[Optional[str], Optional[set[int]]]:
    """The job's CUDA_VISIBLE_DEVICES and the host's GPUs it names (None: not set, every GPU)."""
    from ..verify.checks_gpu import visible_gpus

    cvd = job_cvd(facts, env)
    given = visible_gpus(cvd, facts.gpus)
    return cvd, None if given is None else given & {g.index for g in facts.gpus}


def job_gpu_count(facts_doc: Optional[dict], env: Optional[dict[str, Optional[str]]], listed: int) -> int:
    """How many GPUs the job is given: those its CUDA_VISIBLE_DEVICES names, else all `listed` (nvidia-smi)."""
    from ..verify.facts import from_probe

    given = _given(from_probe(facts_doc), env)[1] if facts_doc else None
    return listed if given is None else len(given)


def gate_results(facts_doc: Optional[dict], profile, knowledge: dict,
                 env: Optional[dict[str, Optional[str]]] = None) -> list:
    """The failed checks that make a run worthless, as verify words them (title, measured, fix): a CPU-only torch
    on a GPU host, torch.cuda.is_available() False, fewer GPUs than expected (nvidia-smi; torch: the GPUs the job's
    CUDA_VISIBLE_DEVICES gives it, else expect.gpu_count), flash-attn not importing when expected, torch or
    flash-attn expected and not installed. env: the job's variables (job_env). Pure."""
    from ..verify import checks as ck
    from ..verify.facts import from_probe

    if not facts_doc:
        return []
    facts = from_probe(facts_doc, host=profile.host, failures=knowledge.get("nvidia_smi_failures", []))
    c = ck.Context(facts, profile, {}, knowledge, {}, {})
    out: list = []
    for r in ck.check_packages(c):
        if r.status == ck.FAIL and r.id.split(".", 1)[1] in ("torch", "flash-attn", "flash_attn") \
                and not c.installed(r.title):
            out.append(r)
    if facts.python_ok:
        out += [r for r in ck.check_torch_cuda_build(c) if r.status == ck.FAIL]
        if c.installed("torch"):
            out += [with_cause(r, c) for r in ck.check_cuda_runtime(c) if r.status == ck.FAIL and r.id == "cuda.runtime"]
        out += [r for r in ck.check_imports(c) if r.status == ck.FAIL and r.id == "packages.flash_attn"]
    out += [r for r in ck.check_gpu_count(c) if r.status == ck.FAIL]
    rt = facts.cuda_runtime or {}
    cvd, given = _given(facts, env)
    if given is None:
        want, expected = profile.expect.gpu_count, str(profile.expect.gpu_count)
    else:  # the job is given these GPUs: torch must see each of them, whatever the host has
        want, expected = len(given), f"{len(given)}: CUDA_VISIBLE_DEVICES={cvd}"
    if want and rt.get("available") and (rt.get("device_count") or 0) < want and c.gpu_host \
            and len(facts.gpus) >= want:
        out.append(ck.CheckResult("cuda.device_count", "GPUs visible to torch", ck.FAIL,
                                  f"torch sees {rt.get('device_count')} GPU(s)", expected,
                                  remediation="CUDA_VISIBLE_DEVICES hides some GPUs (check the profile's env: and "
                                              "--env), or a GPU is unusable"))
    return out


def torch_origin(rt: dict) -> str:
    """Which torch the job's python imports, and whether it is the image's: `torch 2.14.1+cu130 from
    ~/.venvs/gpuops/lib/python3.10/site-packages/torch (the job's environment's, installed there by setup: not the
    image's)`. rt: the probe's cuda_runtime fact."""
    import posixpath

    version, where = rt.get("version") or "?", rt.get("file") or ""
    folder = posixpath.dirname(where) if where else ""
    prefix, base = rt.get("prefix") or "", rt.get("base_prefix") or ""
    if folder and prefix and base and prefix != base and folder.startswith(prefix.rstrip("/") + "/"):
        whose = "the job's environment's, installed there by setup: not the image's, which it shadows"
    elif folder and base and (folder.startswith(base.rstrip("/") + "/") or folder.startswith("/usr/")):
        whose = "the image's: the system python's"
    else:
        whose = "" if not folder else "a folder outside the job's environment"
    return f"torch {version}" + (f" from {folder}" if folder else "") + (f" ({whose})" if whose else "")


def with_cause(r, c):
    """The CUDA test's failure with verify's cause and fix (issue 34): the CUDA the job's torch is built for against
    the driver (cuda.driver_compat: CUDA 13.0 needs driver 580, the host has 570), and which torch the job would use
    and whether it is the image's."""
    from ..verify import checks as ck

    compat = next((x for x in ck.check_driver_compat(c) if x.status == ck.FAIL), None)
    rt = c.f.cuda_runtime or {}
    origin = torch_origin(rt) if rt.get("imported") else ""
    if compat is None and not origin:
        return r
    measured = r.measured
    fix = r.remediation or ""
    if compat is not None:
        measured = f"{r.measured}: {compat.measured} ({compat.detail})" if compat.detail else \
            f"{r.measured}: {compat.measured}"
        fix = compat.remediation or fix
    if origin:
        measured += f"; the job imports {origin}"
        if "not the image's" in origin:
            fix += ("; or keep the image's torch: pin the project's torch, torchvision and torchaudio to the ones that "
                    "match it (`gpuops plan --script ...` shows what setup installs, before anything is launched)")
    return ck.CheckResult(r.id, r.title, r.status, measured, r.expected, remediation=fix, detail=r.detail)


APPS_COMMAND = "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"


def gpu_holders(facts_doc: Optional[dict], active_pids: Iterable[int],
                env: Optional[dict[str, Optional[str]]] = None,
                active_ids: Optional[Iterable[str]] = None) -> list[tuple[str, list[str]]]:
    """The GPUs the job will see (CUDA_VISIBLE_DEVICES of `env`, else the host's) holding memory of a process that is
    not a running gpuops run: one (problem, fix lines) per process. A running gpuops run's process: its process group
    or session is an active run's launcher (active_pids), or its environment names GPUOPS_RUN_ID of an active run
    (active_ids; None: any run id). A process of a run that has ended or was stopped (a child that left the run's
    session) holds the GPU as any other process does. Pure: the probe's gpu_apps fact (nvidia-smi's compute
    processes, raw, and /proc facts per pid)."""
    from ..verify.facts import fact_value, from_probe

    apps = fact_value(facts_doc or {}, "gpu_apps")
    if not isinstance(apps, dict) or apps.get("rc") != 0:
        return []
    facts = from_probe(facts_doc)
    index = {g.uuid: g.index for g in facts.gpus if g.uuid}
    seen = _given(facts, env)[1]
    ours = set(active_pids)
    out = []
    for line in (apps.get("stdout") or "").splitlines():
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        pid, mem, uuid, name = int(parts[0]), parts[1], parts[2], parts[3]
        gpu = index.get(uuid)
        if seen is not None and gpu not in seen:
            continue
        who = (apps.get("procs") or {}).get(str(pid)) or {}
        rid = who.get("run_id")
        if (rid and (active_ids is None or rid in active_ids)) or who.get("pgid") in ours or who.get("sid") in ours:
            continue
        held = f"{mem} MiB" if mem.isdigit() else f"memory ({mem})"
        owner = f", user {who['user']}" if who.get("user") else ""
        what = (f"a process left over from gpuops run {rid}, which is not running (stop it: gpuops stop {rid})"
                if rid else "which is not a gpuops run")
        out.append((f"GPU {gpu if gpu is not None else uuid} holds {held} of process {pid} ({name}{owner}), " + what,
                    [f"fix (process {pid}): see it with `{APPS_COMMAND}` and `ps -o pid,user,etime,cmd -p {pid}`; "
                     "stop it, or give the job another GPU (CUDA_VISIBLE_DEVICES in the profile's env: or --env)"]))
    return out


def found_modules(facts_doc: Optional[dict]) -> Optional[dict]:
    """The probe's find_modules answer: {sys.path[0]: {module: found}}, or None when it was not gathered."""
    from ..verify.facts import fact_value

    value = fact_value(facts_doc or {}, "find_modules")
    return value.get("result") if isinstance(value, dict) else None


def gate_line(r) -> str:
    """One gate problem as verify prints it: `title: measured (expected X)`; the fix goes in the hint."""
    text = f"{r.title}: {r.measured or '-'}"
    return text + (f" (expected {r.expected})" if r.expected else "")


def judge_preflight(pf: Preflight, *, script_found: bool, script: str, remote_dir: str, min_disk_gb: Optional[float],
                    force: bool, synced: bool, stack: Iterable = (), launcher: str = "none",
                    python: str = "python3", extra: Iterable[tuple[str, list[str]]] = ()) -> PreflightVerdict:
    """Launch or not: no GPU, less disk than the profile expects, another run still running, a broken stack
    (`stack`: gate_results), a script that does not compile, a launcher whose package the profile's python lacks
    (torchrun: torch, ray: ray), and `extra` (problem, fix lines) other judges found (a module the script imports
    that the job's python cannot find: job_imports.problems; a GPU held by another process: gpu_holders) are
    problems (--force turns them into warnings, recorded in verdict.forced); a missing script is a usage error;
    under 1 GB free is a warning."""
    from .launchers import NEEDS

    verdict = PreflightVerdict()
    problems = []
    fixes = []
    need = NEEDS.get(launcher)
    if pf.python_found is False:  # nothing it would run can be judged: said once, with what makes it
        problems.append(f"the profile's python {python} does not exist on the host yet")
        fixes.append("fix: run `gpuops setup` (it creates the environment that the profile's python: names and "
                     "installs the project into it), or correct python: in the profile")
    elif need and pf.packages is not None and not pf.packages.get(need):
        problems.append(f"--launcher {launcher} needs {need}, and {python} has no {need} installed")
        fixes.append(f"fix: put {need} in the project's dependencies (or expect.packages) and run gpuops setup")
    for r in stack:
        problems.append(gate_line(r))
        if r.remediation:
            fixes.append(f"fix ({r.title}): {r.remediation}")
    if script_found and pf.compile_error and pf.python_found is not False:
        problems.append(f"script {script} does not compile: {pf.compile_error}")
        fixes.append(f"fix: correct {script} (python -m py_compile {script} shows the error locally)")
    for problem, fix in extra:
        problems.append(problem)
        fixes += fix
    if pf.gpu_error:
        problems.append(f"no GPU visible: {pf.gpu_error}")
    if pf.free_gb is not None and min_disk_gb is not None and pf.free_gb < min_disk_gb:
        problems.append(f"only {pf.free_gb:.1f} GB free in {remote_dir} (the profile expects {min_disk_gb:g} GB)")
    elif pf.free_gb is not None and pf.free_gb < 1:
        verdict.warnings.append(f"only {pf.free_gb:.2f} GB free on the host; checkpoints may not fit")
    if pf.active:
        problems.append(f"another gpuops run is still running on the host: {', '.join(pf.active)}")
    if not script_found:
        verdict.error = UsageError(f"script not found on the host: {remote_dir}/{script}",
                                   hint="check the path; is it excluded from sync?" if synced else
                                   "sync first (drop --no-sync) or check the path")
    elif problems and not force:
        verdict.error = ChecksFailed("; ".join(problems) + "; not launching",
                                     hint="\n".join(fixes + [(f"stop it first (gpuops stop {pf.active[0]}) or "
                                                              if pf.active else "") + "add --force to launch anyway"]))
    elif problems:
        verdict.warnings += [p + " (--force: launching anyway)" for p in problems]
        verdict.forced = list(problems)
    return verdict
