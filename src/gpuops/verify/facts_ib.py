"""InfiniBand, GPUDirect and NCCL's transport, the facts (pure): parsers of what the tools print and the probe's `ib`
fact (remote/probe.py ib_facts: sysfs, the loaded modules, the interfaces, NCCL's variables). Judged by
verify/checks_ib.py, the same way for a single 8-GPU host with IB and for every node of a Slurm allocation.

  - the HCA ports: sysfs (`/sys/class/infiniband/<dev>/ports/<n>/{state,phys_state,rate,link_layer}`), `ibstat`,
    `ibv_devinfo [-v]`;
  - the modules (`lsmod` or /proc/modules): nvidia_peermem (or the older nv_peer_mem) for GPUDirect RDMA;
  - NCCL's device and interface lists (NCCL_IB_HCA, NCCL_SOCKET_IFNAME) in NCCL's own syntax: prefixes by default,
    `^` excludes, `=` matches exactly, `dev:port`;
  - what NCCL chose, from its NCCL_DEBUG=INFO lines (`NET/IB : Using [0]mlx5_0:1/IB ...`, `Using network Socket`,
    `via NET/IB/0/GDRDMA`, `GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)`);
  - nccl-tests' `all_reduce_perf` table: the rows per size, `#wrong`, and its average bus bandwidth.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


@dataclass
class IbPort:
    device: str  # mlx5_0 (or a persistent name: ibp26s0)
    port: int
    state: Optional[str] = None  # ACTIVE, DOWN, INIT, ARMED
    phys_state: Optional[str] = None  # LinkUp, Polling, Disabled
    rate_gbps: Optional[float] = None
    link_layer: Optional[str] = None  # InfiniBand | Ethernet (RoCE)
    rate_text: Optional[str] = None  # as the tool said it: `400 Gb/sec (4X NDR)`

    @property
    def active(self) -> bool:
        return (self.state or "").upper() == "ACTIVE"

    @property
    def infiniband(self) -> bool:
        return (self.link_layer or "InfiniBand").lower() == "infiniband"

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"


def parse_rate(text: Optional[str]) -> Optional[float]:
    """Gb/s of a port's rate: `400 Gb/sec (4X NDR)` (sysfs), `400` (ibstat), `100.0 Gbps` (ibv_devinfo -v)."""
    m = re.match(r"\s*(\d+(?:\.\d+)?)", text or "")
    return float(m.group(1)) if m else None


def _word(text: Optional[str]) -> Optional[str]:
    """`4: ACTIVE` -> ACTIVE, `5: LinkUp` -> LinkUp, `PORT_ACTIVE (4)` -> ACTIVE, `Active` -> ACTIVE."""
    text = (text or "").strip()
    if not text:
        return None
    text = re.sub(r"^\d+:\s*", "", text)
    text = re.sub(r"\s*\(\d+\)$", "", text)
    return text[5:] if text.startswith("PORT_") else text


def ports_from_sysfs(sysfs: dict) -> list[IbPort]:
    """The probe's sysfs map ({device: {port: {state, phys_state, rate, link_layer}}})."""
    out = []
    for dev, ports in sorted((sysfs or {}).items()):
        for port, f in sorted((ports or {}).items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            f = f or {}
            state = _word(f.get("state"))
            out.append(IbPort(dev, int(port) if str(port).isdigit() else 0, state.upper() if state else None,
                              _word(f.get("phys_state")), parse_rate(f.get("rate")), f.get("link_layer"),
                              f.get("rate")))
    return out


def parse_ibstat(text: str) -> list[IbPort]:
    """`ibstat`: `CA 'mlx5_0'` blocks, each with `Port N:` blocks (State, Physical state, Rate, Link layer)."""
    out: list[IbPort] = []
    dev, cur = None, None
    for line in (text or "").splitlines():
        m = re.match(r"^CA '([^']+)'", line.strip())
        if m:
            dev, cur = m.group(1), None
            continue
        m = re.match(r"^\s*Port (\d+):\s*$", line)
        if m and dev:
            cur = IbPort(dev, int(m.group(1)))
            out.append(cur)
            continue
        if cur is None or ":" not in line:
            continue
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "State":
            cur.state = (_word(value) or "").upper() or None
        elif key == "Physical state":
            cur.phys_state = value
        elif key == "Rate":
            cur.rate_gbps, cur.rate_text = parse_rate(value), value
        elif key == "Link layer":
            cur.link_layer = value
    return out


def parse_ibv_devinfo(text: str) -> list[IbPort]:
    """`ibv_devinfo` (`hca_id:` blocks, `port: N` blocks: state PORT_ACTIVE (4), link_layer); with -v also
    active_width (4X) and active_speed (100.0 Gbps), whose product is the rate."""
    out: list[IbPort] = []
    dev, cur, width = None, None, None
    for line in (text or "").splitlines():
        s = line.strip()
        if s.startswith("hca_id:"):
            dev, cur = s.split(":", 1)[1].strip(), None
            continue
        m = re.match(r"^port:\s*(\d+)$", s)
        if m and dev:
            cur, width = IbPort(dev, int(m.group(1))), None
            out.append(cur)
            continue
        if cur is None or ":" not in s:
            continue
        key, _, value = s.partition(":")
        value = value.strip()
        if key == "state":
            cur.state = (_word(value) or "").upper() or None
        elif key == "phys_state":
            cur.phys_state = {"LINK_UP": "LinkUp", "POLLING": "Polling", "DISABLED": "Disabled"}.get(
                _word(value) or "", _word(value))
        elif key == "link_layer":
            cur.link_layer = value
        elif key == "active_width":
            m = re.match(r"(\d+)X", value)
            width = int(m.group(1)) if m else None
        elif key == "active_speed":
            speed = parse_rate(value)
            if speed is not None and width:
                cur.rate_gbps, cur.rate_text = speed * width, f"{width}X {value}"
    return out


def parse_modules(text: str) -> set[str]:
    """Module names of `lsmod` (its header skipped) or /proc/modules: the first word of each line."""
    return {ln.split()[0] for ln in (text or "").splitlines() if ln.strip() and not ln.startswith("Module ")}


# -- NCCL's lists of devices and interfaces ---------------------------------------------------------------------------
@dataclass
class NcclList:
    """NCCL_IB_HCA / NCCL_SOCKET_IFNAME as NCCL reads them: `^` excludes, `=` matches names exactly (else as
    prefixes), each item `name[:port]`."""
    exclude: bool = False
    exact: bool = False
    items: list = field(default_factory=list)  # [(name, port or None)]

    def matches(self, name: str, port: Optional[int] = None) -> bool:
        """An item names this device (and port): the selection before `^` turns it around."""
        for item, p in self.items:
            if (name == item if self.exact else name.startswith(item)) and (p is None or port is None or p == port):
                return True
        return False

    def selects(self, name: str, port: Optional[int] = None) -> bool:
        return self.matches(name, port) != self.exclude

    def unmatched(self, names: list[str]) -> list[str]:
        """Items that name nothing among `names` (with their port when they give one)."""
        out = []
        for item, p in self.items:
            if not any((n == item if self.exact else n.startswith(item)) for n in names):
                out.append(item + (f":{p}" if p is not None else ""))
        return out


def parse_nccl_list(value: Optional[str]) -> Optional[NcclList]:
    """`mlx5`, `=mlx5_0:1,mlx5_1:1`, `^=mlx5_1,mlx5_4`, `^docker,lo`, `=eth0`; None when unset or empty."""
    v = (value or "").strip()
    if not v:
        return None
    out = NcclList()
    if v.startswith("^"):
        out.exclude, v = True, v[1:]
    if v.startswith("="):
        out.exact, v = True, v[1:]
    for item in v.split(","):
        item = item.strip()
        if not item:
            continue
        name, _, port = item.partition(":")
        out.items.append((name, int(port) if port.isdigit() else None))
    return out


def parse_nccl_conf(text: str) -> dict[str, str]:
    """/etc/nccl.conf or ~/.nccl.conf: `NAME=value` lines (# comments), which NCCL reads as if they were set in the
    environment (the environment wins)."""
    out = {}
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        k, sep, v = line.partition("=")
        if sep and k.strip().startswith("NCCL_"):
            out[k.strip()] = v.strip()
    return out


# -- what NCCL chose (NCCL_DEBUG=INFO) ------------------------------------------------------------------------------
_USING_IB = re.compile(r"NET/IB\w* : Using (.*?)(?:;\s*OOB|$)")
_IB_DEV = re.compile(r"\[\d+\]([\w.-]+):(\d+)/(IB|RoCE)")
_USING_SOCKET = re.compile(r"NET/Socket : Using (.*)$")
_SOCKET_IF = re.compile(r"\[\d+\]([\w.-]+):")
_NETWORK = re.compile(r"Using network (\S.*?)\s*$")
_VIA = re.compile(r"via (NET/[\w.]+(?:/\d+)?(?:/GDRDMA)?|P2P/[\w/]+|SHM/[\w/]+|NVLS|COLLNET\w*)")
_GDR = re.compile(r"GPU Direct RDMA (?:\(DMABUF\) )?(Enabled|enabled|Disabled|disabled) for HCA \d+ '([^']+)'"
                  r"(?: \(([^)]*)\))?")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_HOST = re.compile(r"^([\w.-]+):\d+:\d+ \[\d+\] NCCL")
_PREFIX = re.compile(r"^\s*(?:\d+:\s|\[[^\]]{1,40}\]:?\s*)+")  # srun --label's `1: `, torchrun's `[rank8]:`, `[0] `


@dataclass
class NcclRun:
    """What one run's NCCL_DEBUG=INFO lines say about its network."""
    version: Optional[str] = None
    network: Optional[str] = None  # `Using network X`: IB, Socket, IBext, IBext_v8, AWS Libfabric...
    ib_devices: list = field(default_factory=list)  # [(device, port, IB|RoCE)] NCCL opened
    socket_ifaces: list = field(default_factory=list)
    no_ib_device: bool = False  # `NET/IB : No device found.`
    ib_disabled: bool = False  # `NCCL_IB_DISABLE set by environment to 1`
    gdr_enabled: list = field(default_factory=list)  # HCAs with GPU Direct RDMA
    gdr_disabled: list = field(default_factory=list)  # [(HCA, why)] without it (`no module`)
    via: dict = field(default_factory=dict)  # transport of each connection line -> count (NET/IB/0/GDRDMA: 16)
    hosts: set = field(default_factory=set)
    warnings: list = field(default_factory=list)  # NCCL WARN lines

    @property
    def transport(self) -> Optional[str]:
        """IB (InfiniBand or RoCE through verbs, a plugin's IBext included), Socket (TCP), another plugin's name,
        or None when no connection crossed a network (one host: NVLink, P2P, SHM)."""
        nets = [k for k in self.via if k.startswith("NET/")]
        if any(k.startswith("NET/IB") for k in nets):
            return "IB"
        if any(k.startswith("NET/Socket") for k in nets):
            return "Socket"
        if nets:
            return nets[0].split("/")[1]
        if self.network:
            return "IB" if self.network.startswith("IB") else self.network
        return None

    @property
    def gdr(self) -> bool:
        """Some network connection used GPUDirect RDMA (`.../GDRDMA`)."""
        return any(k.endswith("/GDRDMA") for k in self.via)

    @property
    def net_connections(self) -> int:
        return sum(n for k, n in self.via.items() if k.startswith("NET/"))


def parse_nccl_log(text: str) -> NcclRun:
    """NCCL_DEBUG=INFO lines (with whatever prefix torchrun, srun --label or mpirun put before them)."""
    run = NcclRun()
    for line in (text or "").splitlines():
        if "NCCL" not in line and "via " not in line:
            continue
        m = _HOST.search(_PREFIX.sub("", line))
        if m:
            run.hosts.add(m.group(1))
        if (m := _VERSION.search(line)) and not run.version:
            run.version = m.group(1)
        if (m := _USING_IB.search(line)):
            for dev, port, kind in _IB_DEV.findall(m.group(1)):
                if (dev, int(port), kind) not in run.ib_devices:
                    run.ib_devices.append((dev, int(port), kind))
        if (m := _USING_SOCKET.search(line)):
            for name in _SOCKET_IF.findall(m.group(1)):
                if name not in run.socket_ifaces:
                    run.socket_ifaces.append(name)
        if "NET/IB : No device found" in line:
            run.no_ib_device = True
        if re.search(r"NCCL_IB_DISABLE set by environment to [1-9]", line):
            run.ib_disabled = True
        if (m := _NETWORK.search(line)) and not run.network:
            run.network = m.group(1)
        if (m := _GDR.search(line)) and "NET/IB" in line:
            if m.group(1).lower() == "enabled":
                if m.group(2) not in run.gdr_enabled:
                    run.gdr_enabled.append(m.group(2))
            elif (m.group(2), m.group(3) or "") not in run.gdr_disabled:
                run.gdr_disabled.append((m.group(2), m.group(3) or ""))
        for v in _VIA.findall(line):
            key = re.sub(r"^(NET/[\w.]+)/\d+", r"\1", v)  # NET/IB/3/GDRDMA -> NET/IB/GDRDMA: by kind, not by NIC
            run.via[key] = run.via.get(key, 0) + 1
        if " NCCL WARN " in line:
            run.warnings.append(line.split(" NCCL WARN ", 1)[1].strip()[:300])
    return run


# -- nccl-tests' all_reduce_perf --------------------------------------------------------------------------------------
@dataclass
class AllReduce:
    rows: list = field(default_factory=list)  # {"size", "count", "type", "oop": {time, algbw, busbw, wrong}, "ip": {...}}
    avg_busbw: Optional[float] = None  # `# Avg bus bandwidth : X` (all sizes: small ones pull it down)
    ranks: int = 0
    hosts: list = field(default_factory=list)
    gpus: list = field(default_factory=list)  # the GPU of each rank, as nccl-tests names it
    out_of_bounds: Optional[int] = None

    @property
    def wrong(self) -> int:
        """Results that did not check out (nccl-tests' #wrong / error column): a data corruption, never noise."""
        n = 0
        for r in self.rows:
            for side in ("oop", "ip"):
                w = (r.get(side) or {}).get("wrong")
                n += int(w) if isinstance(w, (int, float)) and w >= 1 else 0
        return n

    def peak_busbw(self, min_size: int = 0) -> Optional[float]:
        """The best bus bandwidth (GB/s) of the rows at least `min_size` bytes (of every row when none is that
        large), out-of-place or in-place: what the links carry once latency no longer counts."""
        rows = [r for r in self.rows if r["size"] >= min_size] or self.rows
        vals = [(r.get(s) or {}).get("busbw") for r in rows for s in ("oop", "ip")]
        vals = [v for v in vals if isinstance(v, (int, float))]
        return max(vals) if vals else None

    @property
    def largest(self) -> Optional[int]:
        return max((r["size"] for r in self.rows), default=None)


def _num(text: str):
    try:
        return float(text)
    except ValueError:
        return None


_RANK = re.compile(r"#\s+Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+\d+\s+on\s+(\S+)\s+device\s+\d+\s+\[[^\]]*\]\s+(.*)$")


def parse_all_reduce(text: str) -> AllReduce:
    """nccl-tests' table: the columns named by its header line (`size count type redop [root] time algbw busbw
    #wrong|error time algbw busbw #wrong|error`, which changed over its releases), a row per message size."""
    out = AllReduce()
    cols: Optional[list] = None
    for line in (text or "").splitlines():
        s = line.strip()
        if (m := _RANK.match(s)):
            out.ranks += 1
            if m.group(2) not in out.hosts:
                out.hosts.append(m.group(2))
            out.gpus.append(m.group(3).strip())
            continue
        if s.startswith("#") and re.search(r"\bsize\b.*\bcount\b", s):
            cols = s.lstrip("#").split()
            continue
        if (m := re.match(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)", s)):
            out.avg_busbw = float(m.group(1))
            continue
        if (m := re.match(r"#\s*Out of bounds values\s*:\s*(\d+)", s)):
            out.out_of_bounds = int(m.group(1))
            continue
        parts = s.split()
        if s.startswith("#") or len(parts) < 6 or not parts[0].isdigit() or not parts[1].isdigit():
            continue
        names = cols or _guess_columns(parts)
        if len(names) != len(parts):
            names = _guess_columns(parts)
        row: dict = {"size": int(parts[0]), "count": int(parts[1]), "type": parts[2], "oop": {}, "ip": {}}
        side = "oop"
        for name, value in zip(names[3:], parts[3:]):
            key = {"#wrong": "wrong", "error": "wrong"}.get(name, name)
            if key in ("time", "algbw", "busbw", "wrong"):
                if key in row[side] and side == "oop":
                    side = "ip"
                row[side][key] = _num(value)
            elif key in ("redop", "root"):
                row[key] = value
        out.rows.append(row)
    return out


def _guess_columns(parts: list) -> list:
    """Columns of a row without a header: an op (sum, prod...) after the type, then a root when 13 fields."""
    names = ["size", "count", "type"]
    i = 3
    if len(parts) > 3 and not re.match(r"^-?[\d.]+(e[+-]?\d+)?$", parts[3]):
        names.append("redop")
        i += 1
    if len(parts) - i == 9:
        names.append("root")
    return names + ["time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong"]


# -- the probe's fact -------------------------------------------------------------------------------------------------
@dataclass
class IbFacts:
    """One host's InfiniBand and NCCL facts (a node of a Slurm allocation, or a single host)."""
    ports: list = field(default_factory=list)  # IbPort
    source: str = "none"  # sysfs | ibstat | ibv_devinfo | none
    modules: Optional[set] = None  # None: not readable
    peermem_paths: list = field(default_factory=list)  # the files NCCL looks for (nv_mem, nvidia_peermem)
    netdevs: Optional[list] = None  # network interfaces
    env: dict = field(default_factory=dict)  # NCCL_* (the environment over the config files)
    error: Optional[str] = None  # why the fact could not be gathered

    @property
    def present(self) -> bool:
        """The host has an RDMA adapter (InfiniBand, or RoCE on Ethernet) NCCL could use."""
        return bool(self.ports)

    @property
    def ib_ports(self) -> list:
        return [p for p in self.ports if p.infiniband]

    @property
    def devices(self) -> list[str]:
        return sorted({p.device for p in self.ports})

    @property
    def peermem(self) -> Optional[bool]:
        """GPUDirect RDMA's kernel module is loaded (nvidia_peermem, or nv_peer_mem); None when unknown."""
        if self.peermem_paths or (self.modules is not None and set(PEERMEM_MODULES) & self.modules):
            return True
        return None if self.modules is None else False


def from_probe(doc: dict) -> IbFacts:
    """The probe document's `ib` fact ({"ok", "value"|"error"}) as IbFacts; a failed or absent fact gives IbFacts
    with its error (and no ports: nothing is claimed)."""
    entry = (doc or {}).get("ib")
    if not isinstance(entry, dict):
        return IbFacts(error="not gathered")
    if not entry.get("ok"):
        return IbFacts(error=entry.get("error") or "failed")
    v = entry.get("value") or {}
    env: dict = {}
    for text in (v.get("conf") or {}).values():
        env.update(parse_nccl_conf(text))
    env.update(v.get("env") or {})  # the environment wins over the files, as in NCCL
    ports = ports_from_sysfs(v.get("sysfs") or {})
    mods = v.get("modules")
    return IbFacts(ports=ports, source="sysfs" if ports else "none", modules=set(mods) if mods is not None else None,
                   peermem_paths=list(v.get("peermem_paths") or []), netdevs=v.get("netdevs"), env=env)
