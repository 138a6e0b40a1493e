"""The cluster's own lines of `gpuops verify` on a Slurm profile (pure): what the profile's `slurm:` asks for against
what the login node's sinfo and scontrol say, before a job is submitted.

- What Slurm would refuse (a partition that is not there, more nodes or GPUs than the partition has, an account or
  QOS the partition or the user's associations do not allow, a time over the partition's limit) is a profile error:
  one message (exit 2), never a rejected sbatch later. resolve() gathers them all.
- What is true of the cluster now (a drained or down node, fewer usable nodes than the job asks) is a check: each node
  with its state and, for a drained or down one, Slurm's own reason and the fix (`--exclude`, `slurm.exclude:`).
The nodes' own GPU stacks are judged by verify's checks, per node, and the fleet checks across them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..verify.results import FAIL, INFO, PASS, WARN, CheckResult
from .nodes import SinfoNode
from .states import duration_s, expand_hostlist, parse_scontrol


def parse_partitions(text: str) -> list[dict]:
    """`scontrol --oneliner show partition` -> a dict of Key=Value per partition (one line each)."""
    out = []
    for line in (text or "").splitlines():
        if line.strip().startswith("PartitionName="):
            recs = parse_scontrol(line)
            if recs:
                out.append(recs[0])
    return out


def parse_assoc(text: str) -> list[dict]:
    """`sacctmgr --noheader --parsable2 show assoc ... format=Account,Partition,QOS` -> [{account, partition, qos}]."""
    rows = []
    for line in (text or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 3 and parts[0]:
            rows.append({"account": parts[0], "partition": parts[1] or None,
                         "qos": [q for q in parts[2].split(",") if q]})
    return rows


@dataclass
class Partition:
    name: str
    default: bool = False
    nodes: list = field(default_factory=list)  # SinfoNode of this partition, sinfo's order
    state: Optional[str] = None  # UP, DOWN, DRAIN, INACTIVE
    max_time: Optional[str] = None
    default_time: Optional[str] = None
    allow_accounts: Optional[list] = None  # None: ALL
    deny_accounts: list = field(default_factory=list)
    allow_qos: Optional[list] = None
    allow_groups: Optional[list] = None  # None: ALL
    total_nodes: Optional[int] = None

    @property
    def max_gpus(self) -> int:
        return max((n.gpus for n in self.nodes), default=0)

    @property
    def gpu_types(self) -> set:
        return {n.gpu_type for n in self.nodes if n.gpu_type}


def _names(value: Optional[str]) -> Optional[list]:
    if value in (None, "", "ALL"):
        return None
    return [v for v in value.split(",") if v]


def partitions(nodes: list[SinfoNode], records: list[dict]) -> dict[str, Partition]:
    """The cluster's partitions from sinfo's node lines and scontrol's records (either may be missing)."""
    out: dict[str, Partition] = {}
    for rec in records:
        name = rec.get("PartitionName", "")
        out[name] = Partition(
            name=name, default=rec.get("Default") == "YES", state=rec.get("State"),
            max_time=rec.get("MaxTime"), default_time=rec.get("DefaultTime"),
            allow_accounts=_names(rec.get("AllowAccounts")), deny_accounts=_names(rec.get("DenyAccounts")) or [],
            allow_qos=_names(rec.get("AllowQos")), allow_groups=_names(rec.get("AllowGroups")),
            total_nodes=int(rec["TotalNodes"]) if (rec.get("TotalNodes") or "").isdigit() else None)
    for n in nodes:
        p = out.setdefault(n.partition, Partition(name=n.partition))
        p.default = p.default or n.default_partition
        if all(m.name != n.name for m in p.nodes):
            p.nodes.append(n)
    return out


def time_limit_s(value: Optional[str]) -> Optional[int]:
    """A time limit in seconds: Slurm's forms, a profile's bare minutes too; None for UNLIMITED, INFINITE, NONE."""
    if value is None or str(value).strip().upper() in ("", "UNLIMITED", "INFINITE", "NONE"):
        return None
    return duration_s(str(value))


@dataclass
class Plan:
    """What verify asks of the cluster: the partition, the nodes the step may use, and what is wrong."""
    partition: Optional[Partition] = None
    problems: list = field(default_factory=list)  # profile errors: what Slurm would refuse
    usable: list = field(default_factory=list)  # SinfoNode the job could get now (state, gres, not excluded)
    nodes_asked: int = 1
    available: list = field(default_factory=list)  # partition names, the default marked

    @property
    def step_nodes(self) -> int:
        return min(self.nodes_asked, len(self.usable))


def resolve(settings, nodes: list[SinfoNode], records: list[dict], assoc: Optional[list] = None,
            groups: Optional[list] = None) -> Plan:
    """The profile's `slurm:` against the cluster (`groups`: the user's, when known). Every refusal Slurm would give
    is in plan.problems."""
    parts = partitions(nodes, records)
    wanted, excluded = set(hostlist(settings.nodelist)), set(hostlist(settings.exclude))
    plan = Plan(nodes_asked=max(settings.nodes, len(wanted)),
                available=[p.name + (" (default)" if p.default else "") for p in parts.values()])
    where = ", ".join(plan.available) or "none"
    if settings.partition:
        part = parts.get(settings.partition)
        if part is None:
            plan.problems.append(f"partition {settings.partition!r} does not exist on this cluster "
                                 f"(its partitions: {where})")
            return plan
    else:
        part = next((p for p in parts.values() if p.default), None)
        if part is None:
            plan.problems.append(f"the profile names no partition and the cluster has no default one (its "
                                 f"partitions: {where})")
            return plan
    plan.partition = part
    if groups is not None and part.allow_groups is not None and not set(groups) & set(part.allow_groups):
        plan.problems.append(f"partition {part.name} is for the groups {', '.join(part.allow_groups)} (AllowGroups); "
                             f"yours: {', '.join(groups) or 'none'}")
    _limits(settings, part, plan)
    _accounts(settings, part, assoc, plan)
    names = {n.name for n in part.nodes}
    unknown = sorted(wanted - names)
    if unknown:
        plan.problems.append(f"slurm.nodelist names {', '.join(unknown)}, not nodes of partition {part.name} "
                             f"({', '.join(sorted(names)) or 'none'})")
    pool = [n for n in part.nodes if (not wanted or n.name in wanted) and n.name not in excluded]
    plan.usable = [n for n in pool if n.usable and (n.gpus >= settings.gpus_per_node)]
    total = len([n for n in part.nodes if n.name not in excluded]) if not wanted else len(wanted)
    if plan.nodes_asked > total:
        plan.problems.append(f"slurm.nodes: {plan.nodes_asked} nodes asked; partition {part.name} has "
                             f"{total}" + (" (after slurm.exclude)" if excluded else ""))
    return plan


def _limits(settings, part: Partition, plan: Plan) -> None:
    if settings.gpus_per_node and part.nodes and settings.gpus_per_node > part.max_gpus:
        offered = sorted({n.gres or "no gres" for n in part.nodes})
        plan.problems.append(f"slurm.gpus_per_node: {settings.gpus_per_node} GPUs asked per node; the nodes of "
                             f"partition {part.name} offer at most {part.max_gpus} (gres {', '.join(offered)})")
    if settings.gpu_type and part.nodes and settings.gpu_type not in part.gpu_types:
        plan.problems.append(f"slurm.gpu_type: {settings.gpu_type!r}: the nodes of partition {part.name} name "
                             + (f"their GPUs {', '.join(sorted(part.gpu_types))}" if part.gpu_types
                                else "no GPU type in their gres (leave gpu_type out)"))
    asked, limit = time_limit_s(settings.time), time_limit_s(part.max_time)
    if settings.time and asked is None and str(settings.time).upper() not in ("UNLIMITED", "INFINITE"):
        plan.problems.append(f"slurm.time: {settings.time!r} is not a Slurm time (minutes, [D-]HH:MM:SS)")
    elif asked is not None and limit is not None and asked > limit:
        plan.problems.append(f"slurm.time: {settings.time} is over partition {part.name}'s limit (MaxTime "
                             f"{part.max_time})")
    if part.state and part.state.upper() not in ("UP",):
        plan.problems.append(f"partition {part.name} is {part.state}: it starts no job")


def _accounts(settings, part: Partition, assoc: Optional[list], plan: Plan) -> None:
    acct, qos = settings.account, settings.qos
    if acct and part.allow_accounts is not None and acct not in part.allow_accounts:
        plan.problems.append(f"slurm.account: {acct!r} may not use partition {part.name} (AllowAccounts "
                             f"{','.join(part.allow_accounts)})")
    if acct and acct in part.deny_accounts:
        plan.problems.append(f"slurm.account: {acct!r} is denied partition {part.name} (DenyAccounts)")
    if qos and part.allow_qos is not None and qos not in part.allow_qos:
        plan.problems.append(f"slurm.qos: {qos!r} may not use partition {part.name} (AllowQos "
                             f"{','.join(part.allow_qos)})")
    if assoc is None:  # no accounting on this cluster: Slurm checks neither
        return
    mine = [a for a in assoc if a["partition"] in (None, part.name)]
    if acct and all(a["account"] != acct for a in mine):
        have = sorted({a["account"] for a in mine})
        plan.problems.append(f"slurm.account: {acct!r} is not one of your accounts on this cluster"
                             + (f" ({', '.join(have)})" if have else " (sacctmgr lists none for you)"))
    if qos and mine and all(qos not in a["qos"] for a in mine if not acct or a["account"] == acct):
        have = sorted({q for a in mine for q in a["qos"]})
        plan.problems.append(f"slurm.qos: {qos!r} is not one of your QOS on this cluster ({', '.join(have) or 'none'})")


def node_results(settings, plan: Plan) -> list[CheckResult]:
    """The partition, each of its nodes' state (drained or down with Slurm's reason and the fix), the gres against
    what the profile asks, and whether the job can have its nodes now."""
    part = plan.partition
    if part is None:
        return []
    out = [CheckResult("slurm.partition", "partition", PASS, measured=_partition_words(part, settings),
                       expected=settings.partition or "the cluster's default")]
    short = len(plan.usable) < plan.nodes_asked
    wanted, excluded = set(hostlist(settings.nodelist)), set(hostlist(settings.exclude))
    for n in part.nodes:
        if wanted and n.name not in wanted:
            continue
        out.append(_node_line(n, n.name in excluded, short or n.name in wanted))
    if settings.gpus_per_node:
        few = [n for n in part.nodes if n.gpus < settings.gpus_per_node and n.name not in excluded]
        out.append(CheckResult(
            "slurm.gres", f"GPUs per node ({'--gres' if settings.gpu_option == 'gres' else '--gpus-per-node'})",
            WARN if few else PASS, measured=", ".join(sorted({f'{n.gres or "none"}' for n in part.nodes})),
            expected=f"gpu:{settings.gpu_type + ':' if settings.gpu_type else ''}{settings.gpus_per_node} per node",
            remediation=(f"{', '.join(n.name for n in few)} offer fewer GPUs than asked: Slurm keeps the job off "
                         f"them") if few else None))
    out.append(CheckResult(
        "slurm.nodes", "nodes the job can have", FAIL if short else PASS,
        measured=f"{len(plan.usable)} usable" + (f" ({', '.join(n.name for n in plan.usable)})" if plan.usable else ""),
        expected=f"{plan.nodes_asked} (slurm.nodes)",
        remediation=(f"the job asks {plan.nodes_asked} nodes and partition {part.name} has {len(plan.usable)} that "
                     f"can take it: lower slurm.nodes, or have the drained/down nodes returned to service "
                     f"(your cluster's admins)") if short else None))
    return out


def _partition_words(part: Partition, settings) -> str:
    gpus = sorted({n.gpus for n in part.nodes})
    text = f"{part.name}{' (default)' if part.default else ''}: {len(part.nodes)} nodes"
    if gpus and gpus != [0]:
        text += f", {'/'.join(map(str, gpus))} GPUs each"
    if part.max_time:
        text += f", MaxTime {part.max_time}"
    return text


def _node_line(n: SinfoNode, excluded: bool, needed: bool) -> CheckResult:
    cid, title = f"slurm.node.{n.name}", f"node {n.name}"
    if excluded:
        return CheckResult(cid, title, INFO, measured=f"{n.words()} (slurm.exclude: not used)")
    if n.usable:
        return CheckResult(cid, title, PASS, measured=n.words())
    fix = exclude_fix(n.name) + f"; it returns once your admins fix it (scontrol update NodeName={n.name} State=RESUME)"

    return CheckResult(cid, title, FAIL if needed else WARN, measured=n.words(), remediation=fix,
                       detail=None if needed else "Slurm gives no job to it; the partition has nodes enough without it")


def exclude_fix(*names: str) -> str:
    listed = ", ".join(names)
    return (f"keep jobs off {'it' if len(names) == 1 else 'them'}: `slurm.exclude: [{listed}]` in the profile "
            f"(Slurm's own `--exclude={','.join(names)}` for sbatch and srun)")


def unused_nodes(plan: Plan, reached: list[str]) -> list[str]:
    """The usable nodes the step did not run on (a partition larger than the job)."""
    return [n.name for n in plan.usable if n.name not in reached]


def hostlist(names: list[str]) -> list[str]:
    return [x for name in names for x in expand_hostlist(name)]
