"""InfiniBand, GPUDirect RDMA and NCCL's transport, judged (pure): the same for a single 8-GPU host with IB and for
every node of a Slurm allocation. The facts are verify/facts_ib.py's; the entry point is `judge`, which returns
CheckResults like every other family (status, measured, expected, the fix), in the area `network`:

  network.ib_ports        every InfiniBand port Active at the rate it should run (the profile's expected rate, else
                          the rate of its peers: a rail trained at half speed slows every ring through it); a host
                          without IB or RoCE: INFO, not FAIL (NCCL uses TCP sockets between hosts)
  network.gpudirect       nvidia_peermem (or nv_peer_mem) loaded where there is IB: GPUDirect RDMA, the NIC reading
                          the GPU's memory without a copy through the host; NCCL's own words where a run said them
  network.nccl_env        NCCL_IB_HCA and NCCL_SOCKET_IFNAME name devices and interfaces that exist (NCCL's syntax:
                          prefixes, ^ excludes, = exact, dev:port); NCCL_IB_DISABLE / NCCL_NET=Socket with IB present
  network.nccl_transport  what NCCL chose on a multi-node run (its NCCL_DEBUG=INFO lines): IB, not Socket, when the
                          hosts have IB (the classic silent fall back to TCP: FAIL with the fix)
  network.busbw           nccl-tests' all_reduce bus bandwidth at large messages against the reference for the node
                          type (playbooks/nccl_busbw.yaml), and no #wrong result
"""
from __future__ import annotations

import re
from typing import Optional

from .facts_ib import AllReduce, IbFacts, NcclRun, parse_nccl_list
from .results import FAIL, INFO, PASS, WARN, CheckResult

_TRANSPORT_FIX = (
    "NCCL carried the traffic between hosts over TCP sockets although the hosts have InfiniBand: ten times slower, "
    "and nothing fails. Look at the job's environment: NCCL_IB_DISABLE=1 or NCCL_NET=Socket turn IB off; "
    "NCCL_IB_HCA must name devices that exist (`ibstat`); `NET/IB : No device found` means NCCL could not open them: "
    "libibverbs/rdma-core missing in the job's python or container image, or /dev/infiniband not visible in it. "
    "Run once with NCCL_DEBUG=INFO (`--env NCCL_DEBUG=INFO`) and look for `Using network IB`")


def load_reference(project_dir=None) -> dict:
    """playbooks/nccl_busbw.yaml (the project's copy wins over the shipped one)."""
    from ..knowledge import load_playbook

    return load_playbook("nccl_busbw", project_dir)


def judge(ib: Optional[IbFacts], *, nccl: Optional[NcclRun] = None, allreduce: Optional[AllReduce] = None,
          multi_node: bool = False, expect_rate_gbps: Optional[float] = None, gpu_name: Optional[str] = None,
          gpus_per_node: Optional[int] = None, reference: Optional[dict] = None) -> list[CheckResult]:
    """The network checks of one host (or one node) from its IB facts, and of a run from NCCL's lines and an
    all_reduce_perf table where there are ones. `multi_node`: the run (or the job to come) spans hosts."""
    ib = ib or IbFacts(error="not gathered")
    out = [check_ports(ib, expect_rate_gbps)]
    if ib.present:
        out.append(check_gpudirect(ib, nccl))
    env = check_nccl_env(ib)
    if env is not None:
        out.append(env)
    if nccl is not None:
        out.append(check_transport(ib, nccl, multi_node))
    if allreduce is not None:
        out.append(check_busbw(allreduce, reference or {}, gpu_name=gpu_name or (allreduce.gpus or [None])[0],
                               gpus_per_node=gpus_per_node, multi_node=multi_node or len(allreduce.hosts) > 1))
    return out


def check_ports(ib: IbFacts, expect_rate_gbps: Optional[float] = None) -> CheckResult:
    title = "InfiniBand ports"
    if ib.error:
        return CheckResult("network.ib_ports", title, WARN, detail=f"not gathered: {ib.error}",
                           remediation="`ibstat` on the host lists its ports; the probe reads /sys/class/infiniband")
    if not ib.present:
        return CheckResult("network.ib_ports", title, INFO, "no InfiniBand or RoCE adapter (/sys/class/infiniband is "
                           "empty or absent): NCCL uses TCP sockets between hosts")
    ports = ib.ib_ports
    eth = [p for p in ib.ports if not p.infiniband]
    eth_words = ("; RoCE/Ethernet: " + ", ".join(f"{p.name} {p.state or '?'}" for p in eth)) if eth else ""
    if not ports:
        return CheckResult("network.ib_ports", title, INFO, f"no InfiniBand port{eth_words}")
    down = [p for p in ports if not p.active]
    rates = [p.rate_gbps for p in ports if p.active and p.rate_gbps]
    want = float(expect_rate_gbps) if expect_rate_gbps else (max(rates) if rates else None)
    slow = [p for p in ports if p.active and p.rate_gbps and want and p.rate_gbps < want]
    active = len(ports) - len(down)
    measured = f"{active}/{len(ports)} Active" + (f" at {_gbps(want)}" if want and not slow else "") + eth_words
    expected = f"every port Active{f' at {_gbps(want)}' if want else ''}"
    if down:
        words = ", ".join(f"{p.name} {p.state or '?'} ({p.phys_state or '?'})" for p in down)
        return CheckResult(
            "network.ib_ports", title, FAIL, f"{measured}; down: {words}", expected,
            remediation=("a rail is down (Polling: no link partner, a cable or a switch port; Disabled: turned off): "
                         "`ibstat` shows it; reseat or replace the cable, or ask the cluster's admins; meanwhile keep "
                         "NCCL off it (NCCL_IB_HCA=^=" + ",".join(p.device for p in down) + ") or keep the job off "
                         "this node (Slurm: --exclude)"))
    if slow:
        words = ", ".join(f"{p.name} at {_gbps(p.rate_gbps)}" for p in slow)
        return CheckResult(
            "network.ib_ports", title, FAIL if expect_rate_gbps else WARN, f"{measured}; slow: {words}", expected,
            remediation=("a port trained below its rate (a damaged cable, fewer lanes, a lower speed): every NCCL "
                         "ring through it runs at its pace; `ibstat` / `ibv_devinfo -v` (active_width, "
                         "active_speed) show it; reseat or replace the cable"))
    return CheckResult("network.ib_ports", title, PASS, measured, expected)


def check_gpudirect(ib: IbFacts, nccl: Optional[NcclRun] = None) -> CheckResult:
    title = "GPUDirect RDMA (nvidia_peermem)"
    if nccl is not None and nccl.gdr:
        return CheckResult("network.gpudirect", title, PASS, "NCCL used it (`via NET/.../GDRDMA`)" + (
            "; nvidia_peermem loaded" if ib.peermem else " (DMA-BUF, without nvidia_peermem)" if ib.peermem is False
            else ""))
    fix = ("load the module: `sudo modprobe nvidia-peermem` (it ships with the NVIDIA driver; the older MLNX module "
           "is nv_peer_mem), and make it survive a reboot: `echo nvidia-peermem | sudo tee "
           "/etc/modules-load.d/nvidia-peermem.conf`; without it NCCL stages every transfer through host memory")
    said = ""
    if nccl is not None and nccl.gdr_disabled:
        said = "; NCCL said: GPU Direct RDMA Disabled for " + ", ".join(
            f"{h}" + (f" ({why})" if why else "") for h, why in nccl.gdr_disabled[:4])
    if ib.peermem:
        status = WARN if said else PASS
        return CheckResult("network.gpudirect", title, status, "nvidia_peermem loaded" + said,
                           remediation=None if status == PASS else
                           "the module is loaded but NCCL did not use it: NCCL_NET_GDR_LEVEL (or _DISABLE) in the "
                           "environment, or a GPU and a NIC too far apart (`nvidia-smi topo -m`)")
    if ib.peermem is None:
        return CheckResult("network.gpudirect", title, INFO, "unknown: the loaded modules could not be read "
                           "(/proc/modules)" + said)
    return CheckResult("network.gpudirect", title, WARN, "nvidia_peermem not loaded" + said, "loaded (nvidia_peermem)",
                       remediation=fix, detail="NCCL 2.19+ can use DMA-BUF instead on a recent kernel and driver "
                       "(`GPU Direct RDMA (DMABUF) enabled` in NCCL_DEBUG=INFO): `verify --bench` shows which")


def check_nccl_env(ib: IbFacts) -> Optional[CheckResult]:
    """NCCL_IB_HCA, NCCL_SOCKET_IFNAME, NCCL_IB_DISABLE and NCCL_NET as this host would give them to a job."""
    env = ib.env or {}
    names = [k for k in ("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE", "NCCL_NET") if env.get(k)]
    if ib.error and not names:
        return None
    title = "NCCL's network variables"
    if not names:
        return CheckResult("network.nccl_env", title, PASS if ib.present else INFO,
                           "none set: NCCL picks " + ("every IB device" if ib.present else "the interfaces itself"))
    shown = ", ".join(f"{k}={env[k]}" for k in names)
    fails, warns = [], []
    hca = parse_nccl_list(env.get("NCCL_IB_HCA"))
    if hca is not None:
        devices = ib.devices
        ports = {(p.device, p.port) for p in ib.ports}
        missing = hca.unmatched(devices)
        if not hca.exclude and not devices:
            warns.append(f"NCCL_IB_HCA names {', '.join(d for d, _ in hca.items)} but this host has no IB device")
        elif missing:
            (fails if not hca.exclude else warns).append(
                f"NCCL_IB_HCA names {', '.join(missing)}, which this host does not have (it has "
                f"{_span(devices)})")
        bad_ports = [f"{d}:{p}" for d, p in hca.items if p is not None and not any(
            pd == d or (not hca.exact and pd.startswith(d)) for pd, pp in ports if pp == p) and d not in missing]
        if bad_ports:
            fails.append(f"NCCL_IB_HCA names port(s) {', '.join(bad_ports)} that do not exist")
        chosen = [p for p in ib.ports if hca.selects(p.device, p.port)]
        if devices and not chosen:
            fails.append("NCCL_IB_HCA leaves NCCL no IB device: it falls back to TCP sockets")
        elif hca.exact and not hca.exclude and any(not p.active for p in chosen):  # a prefix: NCCL skips it
            warns.append("NCCL_IB_HCA selects a port that is not Active: " + ", ".join(
                p.name for p in chosen if not p.active))
    ifn = parse_nccl_list(env.get("NCCL_SOCKET_IFNAME"))
    if ifn is not None and ib.netdevs is not None:
        missing = ifn.unmatched(ib.netdevs)
        chosen = [n for n in ib.netdevs if ifn.selects(n)]
        if not ifn.exclude and not chosen:
            fails.append(f"NCCL_SOCKET_IFNAME={env['NCCL_SOCKET_IFNAME']} names no interface of this host (it has "
                         f"{', '.join(ib.netdevs)}): NCCL's bootstrap finds no interface and the job fails at "
                         "init_process_group")
        elif missing and not ifn.exclude:
            warns.append(f"NCCL_SOCKET_IFNAME names {', '.join(missing)}, which this host does not have")
    if ib.present and str(env.get("NCCL_IB_DISABLE", "")).strip() not in ("", "0"):
        warns.append("NCCL_IB_DISABLE turns InfiniBand off for NCCL: a multi-node run goes over TCP sockets")
    if ib.present and str(env.get("NCCL_NET", "")).strip().lower() == "socket":
        warns.append("NCCL_NET=Socket makes NCCL use TCP sockets although this host has InfiniBand")
    if fails or warns:
        return CheckResult("network.nccl_env", title, FAIL if fails else WARN, shown,
                           "names that exist on this host", detail="; ".join(fails + warns),
                           remediation="set them to this host's names (`ibstat` or `ls /sys/class/infiniband` for "
                           "NCCL_IB_HCA, `ip -br link` for NCCL_SOCKET_IFNAME), or unset them and let NCCL choose; "
                           "where they come from: the profile's env:, --env, the preset, /etc/nccl.conf")
    return CheckResult("network.nccl_env", title, PASS, shown, "names that exist on this host")


def check_transport(ib: IbFacts, nccl: NcclRun, multi_node: bool) -> CheckResult:
    title = "NCCL's transport between hosts"
    t = nccl.transport
    said = _nccl_words(nccl)
    if not multi_node:
        return CheckResult("network.nccl_transport", title, INFO, f"one host: {said}")
    if t == "IB":
        return CheckResult("network.nccl_transport", title, PASS if nccl.gdr else WARN, said, "IB",
                           remediation=None if nccl.gdr else
                           "IB without GPUDirect RDMA: every transfer is copied through host memory; load "
                           "nvidia_peermem (network.gpudirect)")
    if t == "Socket" and ib.present and ib.ib_ports:
        return CheckResult("network.nccl_transport", title, FAIL, said, "IB (the hosts have InfiniBand)",
                           remediation=_TRANSPORT_FIX, detail="the classic multi-node failure: nothing breaks, "
                           "training is only several times slower")
    if t == "Socket":
        return CheckResult("network.nccl_transport", title, INFO, said + " (no InfiniBand on this host: TCP is all "
                           "there is; expect a fraction of an IB fabric's bandwidth)")
    if t is None:
        return CheckResult("network.nccl_transport", title, WARN, said, "a network transport between the hosts",
                           remediation="NCCL's lines name no connection between hosts: run with NCCL_DEBUG=INFO "
                           "(and NCCL_DEBUG_SUBSYS=INIT,NET) to see its choice")
    return CheckResult("network.nccl_transport", title, PASS, said, "IB or the cluster's network plugin")


def _nccl_words(n: NcclRun) -> str:
    parts = []
    if n.network:
        parts.append(f"Using network {n.network}")
    if n.no_ib_device:
        parts.append("NET/IB : No device found")
    if n.ib_disabled:
        parts.append("NCCL_IB_DISABLE set by environment")
    if n.ib_devices:
        parts.append("IB devices " + _span([d for d, _, _ in n.ib_devices]))
    if n.socket_ifaces:
        parts.append("sockets on " + ", ".join(n.socket_ifaces))
    vias = ", ".join(f"{k} x{v}" for k, v in sorted(n.via.items()) if k.startswith("NET/"))
    if vias:
        parts.append(f"connections via {vias}")
    elif n.via:
        parts.append("no connection over a network (" + ", ".join(sorted(k.split("/")[0] for k in n.via)) + ")")
    return "; ".join(parts) + (f" (NCCL {n.version})" if n.version else "") if parts else "NCCL said nothing of it"


def reference_row(reference: dict, gpu_name: Optional[str], gpus_per_node: Optional[int],
                  multi_node: bool) -> Optional[dict]:
    scope = "multi-node" if multi_node else "single-node"
    for row in reference.get("references") or []:
        if row.get("scope", "multi-node") != scope or not gpu_name or not re.search(row["gpu"], gpu_name):
            continue
        if gpus_per_node is not None and row.get("gpus_per_node") not in (None, gpus_per_node):
            continue
        return row
    return None


def check_busbw(ar: AllReduce, reference: dict, *, gpu_name: Optional[str], gpus_per_node: Optional[int],
                multi_node: bool) -> CheckResult:
    title = "NCCL all_reduce bus bandwidth"
    st = reference.get("settings") or {}
    big = int(st.get("large_message_bytes", 1 << 30))
    peak = ar.peak_busbw(big)
    if peak is None:
        return CheckResult("network.busbw", title, WARN, "no row in nccl-tests' table",
                           remediation="all_reduce_perf printed no result: read its output (`-b 8 -e 8G -f 2`)")
    size = ar.largest if (ar.largest or 0) < big else big
    measured = f"{peak:.1f} GB/s at {_size(size)}+" + (f" (average over sizes {ar.avg_busbw:g})" if ar.avg_busbw
                                                       else "") + (f", {ar.ranks} ranks on {len(ar.hosts)} host(s)"
                                                                   if ar.ranks else "")
    if ar.wrong:
        return CheckResult("network.busbw", title, FAIL, f"{measured}; {ar.wrong} wrong result(s)",
                           "0 wrong results", remediation="nccl-tests found corrupted results: a GPU, NVLink or NIC "
                           "is faulty; run it per node (`-g 8` on each) to find which, and take that node out")
    row = reference_row(reference, gpu_name, gpus_per_node, multi_node)
    if row is None:
        return CheckResult("network.busbw", title, INFO, measured, detail=f"no reference for {gpu_name or 'this GPU'}"
                           f" x{gpus_per_node or '?'} ({'multi' if multi_node else 'single'}-node) in "
                           "playbooks/nccl_busbw.yaml: add your cluster's own measured figure there")
    low, high = (float(x) for x in row["busbw_gbs"])
    expected = f"{low:g}-{high:g} GB/s ({row['id']})"
    if peak < low * float(st.get("fail_fraction", 0.25)):
        return CheckResult("network.busbw", title, FAIL, measured, expected, detail=row.get("source"),
                           remediation="a fraction of what this node type reaches: " + (
                               "NCCL fell back to TCP sockets (network.nccl_transport) or " if multi_node else "")
                           + "a link is down; NCCL_DEBUG=INFO shows the transport of every channel")
    if peak < low * float(st.get("warn_fraction", 0.8)):
        return CheckResult("network.busbw", title, WARN, measured, expected, detail=row.get("source"),
                           remediation="below this node type's published figure: a slow or down rail "
                           "(network.ib_ports), GPUDirect RDMA off (network.gpudirect), or a GPU and its NIC on "
                           "different sockets (`nvidia-smi topo -m`)")
    return CheckResult("network.busbw", title, PASS, measured, expected)


def _gbps(v: Optional[float]) -> str:
    return "?" if v is None else f"{v:g} Gb/sec"


def _size(n: Optional[int]) -> str:
    if n is None:
        return "?"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"


def _span(names: list) -> str:
    names = sorted(set(names), key=lambda s: [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", s)])
    return f"{names[0]} .. {names[-1]} ({len(names)})" if len(names) > 3 else ", ".join(names) or "none"
