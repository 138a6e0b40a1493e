"""The GPU identity table (playbooks/gpus.yaml): one row per GPU model with every name it goes by.

Stable API (used by verify, `profiles new --type` and the cloud commands):
    load(project_dir=None) -> list[GpuRow]
    match(name, project_dir=None) -> GpuRow | None        nvidia-smi name, Lambda description, instance type or alias
    for_instance_type(type, project_dir=None) -> (GpuRow, count) | None
    family(name, project_dir=None) -> [GpuRow]           `--gpu H100`: the rows a GPU name covers
    for_lambda_type(gpu_description, type, gpus=0, project_dir=None) -> (GpuRow, count) | None
    satisfies(row, expect_gpu, project_dir=None) -> bool  would verify's gpu.model pass for `expect.gpu`

Names compare case and spacing aside ("H100 SXM" == "h100-sxm" == "H100_SXM"), with a leading "NVIDIA " or
"Tesla " and Lambda's "8x " dropped. Pure apart from reading the YAML (cached).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError

_INSTANCE_RE = re.compile(r"^gpu_(\d+)x_([a-z0-9_]+)$", re.I)


@dataclass(frozen=True)
class GpuRow:
    id: str
    smi_names: tuple = ()
    lambda_descriptions: tuple = ()
    lambda_instance_types: tuple = ()
    aliases: tuple = ()
    form_factor: str | None = None
    architecture: str | None = None
    memory_mib: int | None = None
    compute_capability: str | None = None
    power_limit_w: float | None = None
    interconnect: str | None = None
    link_gbps: float | None = None
    preset: str | None = None
    reference: dict | None = field(default=None, hash=False, compare=False)
    source: str | None = None
    # NCCL all-reduce bus bandwidth a healthy machine of these GPUs reaches: {gpus, min_mib, busbw_gbps, algorithm,
    # source} each (verify.bench judges by GPU model, count and message size)
    allreduce: tuple = field(default=(), hash=False, compare=False)

    def allreduce_refs(self, world: int, message_bytes: int) -> list[dict]:
        """The all-reduce references that apply to `world` GPUs all-reducing `message_bytes` at a time."""
        return [r for r in self.allreduce if int(r.get("gpus") or 0) == int(world)
                and message_bytes >= int(r.get("min_mib") or 0) * 2**20 and r.get("busbw_gbps")]

    @property
    def name(self) -> str:
        """The row's display name: its first Lambda description or nvidia-smi name, e.g. 'H100 (80 GB SXM5)'."""
        return (self.lambda_descriptions or self.smi_names or (self.id,))[0]

    @property
    def names(self) -> tuple:
        return self.smi_names + self.lambda_descriptions + self.aliases + (self.id,)

    def ref(self, key: str) -> float | None:
        v = (self.reference or {}).get(key)
        return float(v) if isinstance(v, (int, float)) else None

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "smi_names": list(self.smi_names),
                "lambda_descriptions": list(self.lambda_descriptions),
                "lambda_instance_types": list(self.lambda_instance_types), "aliases": list(self.aliases),
                "form_factor": self.form_factor, "architecture": self.architecture, "memory_mib": self.memory_mib,
                "compute_capability": self.compute_capability, "power_limit_w": self.power_limit_w,
                "interconnect": self.interconnect, "link_gbps": self.link_gbps, "preset": self.preset,
                "reference": self.reference, "source": self.source}


def normalize(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h10080gbhbm3'; '8x A100 (40 GB SXM4)' -> 'a10040gbsxm4'."""
    s = (name or "").strip().lower()
    s = re.sub(r"^\d+\s*x\s+", "", s)
    s = re.sub(r"^(nvidia|tesla)[\s_-]+", "", s)
    return re.sub(r"[^a-z0-9]", "", s)


def _tuple(v) -> tuple:
    if v is None:
        return ()
    if isinstance(v, (list, tuple)):
        return tuple(str(x) for x in v)
    return (str(v),)


def rows_from_doc(doc: dict, where: str = "gpus.yaml") -> list[GpuRow]:
    """Rows of a parsed gpus.yaml, validated: every row has an id and a source, and no name belongs to two rows."""
    rows, seen = [], {}
    for i, r in enumerate(doc.get("gpus") or []):
        if not isinstance(r, dict) or not r.get("id"):
            raise UsageError(f"{where}: gpus[{i}] needs an id")
        if not r.get("source"):
            raise UsageError(f"{where}: gpu '{r['id']}' needs a source")
        row = GpuRow(
            id=str(r["id"]), smi_names=_tuple(r.get("smi_names")),
            lambda_descriptions=_tuple(r.get("lambda_descriptions")),
            lambda_instance_types=_tuple(r.get("lambda_instance_types")), aliases=_tuple(r.get("aliases")),
            form_factor=r.get("form_factor"), architecture=r.get("architecture"),
            memory_mib=int(r["memory_mib"]) if r.get("memory_mib") is not None else None,
            compute_capability=str(r["compute_capability"]) if r.get("compute_capability") is not None else None,
            power_limit_w=float(r["power_limit_w"]) if r.get("power_limit_w") is not None else None,
            interconnect=r.get("interconnect"),
            link_gbps=float(r["link_gbps"]) if r.get("link_gbps") is not None else None,
            preset=r.get("preset"), reference=r.get("reference") or None, source=str(r["source"]),
            allreduce=_allreduce(r.get("allreduce"), f"{where}: gpu '{r['id']}'"))
        for n in row.names:
            key = normalize(n)
            if key and seen.get(key, row.id) != row.id:
                raise UsageError(f"{where}: name '{n}' belongs to both '{seen[key]}' and '{row.id}'")
            seen[key] = row.id
        for t in row.lambda_instance_types:
            key = "type:" + t.lower()
            if seen.get(key, row.id) != row.id:
                raise UsageError(f"{where}: instance type '{t}' belongs to both '{seen[key]}' and '{row.id}'")
            seen[key] = row.id
        rows.append(row)
    return rows


def _allreduce(v, where: str) -> tuple:
    """A row's all-reduce references, each checked: gpus, min_mib, busbw_gbps and a source."""
    out = []
    for i, ref in enumerate(v or []):
        if not isinstance(ref, dict) or not all(ref.get(k) for k in ("gpus", "busbw_gbps", "source")):
            raise UsageError(f"{where}: allreduce[{i}] needs gpus, busbw_gbps and a source (min_mib: the smallest "
                             "message it holds for)")
        out.append(dict(ref))
    return tuple(out)


_CACHE: dict = {}


def _table(project_dir: Path | None = None):
    from ..knowledge import load_playbook

    doc = load_playbook("gpus", project_dir)
    hit = _CACHE.get(id(doc))
    if hit is None or hit[0] is not doc:
        rows = rows_from_doc(doc)
        by_name = {normalize(n): r for r in rows for n in r.names}
        by_type = {t.lower(): r for r in rows for t in r.lambda_instance_types}
        hit = (doc, rows, by_name, by_type)
        _CACHE[id(doc)] = hit
    return hit[1:]


def load(project_dir: Path | None = None) -> list[GpuRow]:
    return list(_table(project_dir)[0])


def by_id(gpu_id: str, project_dir: Path | None = None) -> GpuRow | None:
    return next((r for r in load(project_dir) if r.id == gpu_id), None)


def for_instance_type(instance_type: str, project_dir: Path | None = None):
    """(row, GPU count) for a Lambda instance type ('gpu_8x_h100_sxm5' -> (H100 SXM5 row, 8)), or None.
    Types not in the table are understood from their pattern when the part after gpu_Nx_ names a GPU."""
    if not instance_type:
        return None
    _, by_name, by_type = _table(project_dir)
    t = instance_type.strip().lower()
    m = _INSTANCE_RE.match(t)
    count = int(m.group(1)) if m else 1
    row = by_type.get(t)
    if row is None and m:
        row = by_name.get(normalize(m.group(2)))
    return (row, count) if row is not None else None


def match(name: str, project_dir: Path | None = None) -> GpuRow | None:
    """The row any of whose names equals `name` (case, spacing and punctuation aside), or None."""
    if not name or not name.strip():
        return None
    _, by_name, _ = _table(project_dir)
    row = by_name.get(normalize(name))
    if row is None and _INSTANCE_RE.match(name.strip()):
        hit = for_instance_type(name, project_dir)
        row = hit[0] if hit else None
    return row


def _tokens(name: str) -> list[str]:
    """'NVIDIA H100 80GB HBM3' -> ['h100', '80gb', 'hbm3']; '8x A100 (40 GB SXM4)' -> ['a100', '40', 'gb', 'sxm4']."""
    s = (name or "").strip().lower()
    s = re.sub(r"^\d+\s*x\s+", "", s)
    s = re.sub(r"^(nvidia|tesla)[\s_-]+", "", s)
    return re.findall(r"[a-z0-9]+", s)


def family(name: str, project_dir: Path | None = None) -> list[GpuRow]:
    """The rows a GPU name covers (`--gpu NAME`): the one row that has this exact name ('H100 SXM', 'A10', 'GH200'),
    else every row one of whose names begins with these words ('H100': H100 SXM5 and H100 PCIe; 'A100 80GB': both
    80 GB A100s). Words compare whole: 'A10' never covers an A100."""
    exact = match(name, project_dir)
    if exact is not None:
        return [exact]
    want = _tokens(name)
    if not want:
        return []
    return [r for r in load(project_dir) if any(_tokens(n)[:len(want)] == want for n in r.names)]


def for_lambda_type(gpu_description: str, instance_type: str, gpus: int = 0, project_dir: Path | None = None):
    """(row, GPU count) of a type as Lambda's API lists it: its `gpu_description` names the GPU where the table knows
    it (the API's own word), else its name; the count is the API's `specs.gpus` where given, else the name's."""
    row = match(gpu_description, project_dir) if gpu_description else None
    by_name = for_instance_type(instance_type, project_dir)
    if row is None and by_name is not None:
        row = by_name[0]
    if row is None:
        return None
    return row, (gpus if gpus and gpus > 0 else (by_name[1] if by_name else 1))


def satisfies(row: GpuRow, expect_gpu: str, project_dir: Path | None = None) -> bool:
    """Would a host with this row's GPUs pass verify's gpu.model check for `expect.gpu`? The row the words name, or
    (words that name no row, e.g. 'H100') a substring of the GPU's nvidia-smi name, as verify judges it."""
    named = match(expect_gpu, project_dir)
    if named is not None:
        return named.id == row.id
    text = expect_gpu.strip().lower()
    return bool(text) and any(text in n.lower() for n in row.smi_names)


def describe(row: GpuRow | None, smi_name: str | None = None, instance_type: str | None = None) -> str:
    """One wording for both sides of a comparison: 'H100 (80 GB SXM5) [nvidia-smi: NVIDIA H100 80GB HBM3]'."""
    if row is None:
        return f"'{smi_name}' (not in gpus.yaml)" if smi_name else "unknown GPU"
    text = f"{row.name} [nvidia-smi: {smi_name or ' / '.join(row.smi_names) or '?'}]"
    if instance_type:
        text += f", as on {instance_type}"
    return text
