"""verify/checks_ib.py on recorded outputs (tests/data/ib/): every port Active at its rate, nvidia_peermem, NCCL's
variables naming devices that exist, IB not Socket between hosts (the silent fall back: FAIL with the fix), the bus
bandwidth against the node type's reference (playbooks/nccl_busbw.yaml); a host without IB: INFO, never FAIL."""
from __future__ import annotations

import json
import re

import pytest

from gpuops.verify import checks_ib as C
from gpuops.verify import facts_ib as F
from gpuops.verify.results import FAIL, INFO, PASS, WARN

from support import DATA

IB = DATA / "ib"
REF = C.load_reference()


def recorded(name: str) -> str:
    return "\n".join(ln for ln in (IB / name).read_text().splitlines() if not ln.startswith("## "))


def h100(**env) -> F.IbFacts:
    ib = F.from_probe(json.loads((IB / "probe-ib-h100.json").read_text()))
    ib.env = dict(env)
    return ib


def degraded() -> F.IbFacts:
    return F.IbFacts(ports=F.parse_ibstat(recorded("ibstat-degraded.txt")), source="ibstat",
                     modules={"mlx5_ib"}, netdevs=["eth0", "ibp26s0", "lo"])


def by_id(results):
    return {r.id: r for r in results}


def test_a_healthy_h100_node_with_ib_passes():
    r = by_id(C.judge(h100(), nccl=F.parse_nccl_log(recorded("nccl-ib-gdr.log")), multi_node=True,
                      allreduce=F.parse_all_reduce(recorded("all_reduce_perf-2x8-h100-ib.txt")), reference=REF,
                      gpus_per_node=8))
    assert [x.status for x in r.values()] == [PASS] * 5, r
    assert r["network.ib_ports"].measured.startswith("8/8 Active at 400 Gb/sec")
    assert r["network.busbw"].expected == "400-450 GB/s (h100-sxm-8x-ndr-multinode)"
    assert all(x.area == "network" for x in r.values())


def test_a_host_without_infiniband_is_info_not_fail():
    ib = F.from_probe(json.loads((IB / "probe-ib-none.json").read_text()))
    r = by_id(C.judge(ib))
    assert r["network.ib_ports"].status == INFO and "TCP sockets" in r["network.ib_ports"].measured
    assert "network.gpudirect" not in r and r["network.nccl_env"].status == INFO
    r = by_id(C.judge(ib, nccl=F.parse_nccl_log(recorded("nccl-socket-fallback.log")), multi_node=True))
    assert r["network.nccl_transport"].status == INFO  # sockets are all there is
    assert not any(x.status == FAIL for x in r.values())


def test_a_port_down_and_a_port_at_half_rate():
    r = C.check_ports(degraded())
    assert r.status == FAIL and "mlx5_3:1 DOWN (Polling)" in r.measured and "NCCL_IB_HCA=^=mlx5_3" in r.remediation
    ports = [p for p in degraded().ports if p.device != "mlx5_3"]
    slow = C.check_ports(F.IbFacts(ports=ports))
    assert slow.status == WARN and "mlx5_5:1 at 200 Gb/sec" in slow.measured  # slower than its peers
    assert C.check_ports(F.IbFacts(ports=ports), expect_rate_gbps=400).status == FAIL  # below the rate it should run
    assert C.check_ports(F.IbFacts(error="timed out after 5s")).status == WARN
    eth_only = F.IbFacts(ports=[p for p in F.parse_ibstat(recorded("ibstat-h100-ndr.txt")) if not p.infiniband])
    assert C.check_ports(eth_only).status == INFO


def test_gpudirect_needs_nvidia_peermem_where_there_is_ib():
    no_module = F.IbFacts(ports=degraded().ports, modules=F.parse_modules(recorded("lsmod.txt")))
    r = C.check_gpudirect(no_module)
    assert r.status == WARN and "modprobe nvidia-peermem" in r.remediation and "DMA-BUF" in r.detail
    said = C.check_gpudirect(no_module, F.parse_nccl_log(recorded("nccl-ib-no-gdr.log")))
    assert said.status == WARN and "GPU Direct RDMA Disabled for mlx5_0 (no module)" in said.measured
    dmabuf = C.check_gpudirect(no_module, F.parse_nccl_log(recorded("nccl-ib-gdr.log")))
    assert dmabuf.status == PASS and "DMA-BUF" in dmabuf.measured  # NCCL used it without the module
    assert C.check_gpudirect(h100()).status == PASS
    assert C.check_gpudirect(F.IbFacts(ports=degraded().ports, modules=None)).status == INFO


@pytest.mark.parametrize("env,status,said", [
    ({"NCCL_IB_HCA": "mlx5"}, PASS, None),
    ({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}, PASS, None),
    ({"NCCL_IB_HCA": "^=mlx5_9"}, PASS, None),
    ({"NCCL_IB_HCA": "mlx5_12,mlx5_0"}, FAIL, "names mlx5_12, which this host does not have"),
    ({"NCCL_IB_HCA": "=mlx5_0:2"}, FAIL, "port(s) mlx5_0:2 that do not exist"),
    ({"NCCL_IB_HCA": "^mlx5"}, FAIL, "leaves NCCL no IB device"),
    ({"NCCL_IB_HCA": "ibp"}, FAIL, "names ibp, which this host does not have"),
    ({"NCCL_SOCKET_IFNAME": "=ens3"}, FAIL, "names no interface of this host"),
    ({"NCCL_SOCKET_IFNAME": "enp27,bond"}, WARN, "names bond, which this host does not have"),
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, PASS, None),
    ({"NCCL_IB_DISABLE": "1"}, WARN, "turns InfiniBand off"),
    ({"NCCL_NET": "Socket"}, WARN, "NCCL_NET=Socket"),
])
def test_ncclS_variables_name_devices_and_interfaces_that_exist(env, status, said):
    r = C.check_nccl_env(h100(**env))
    assert r.status == status, r
    if said:
        assert said in r.detail, r.detail
    if status != PASS:
        assert "ibstat" in r.remediation


def test_ib_hca_selecting_a_port_that_is_down():
    r = C.check_nccl_env(F.IbFacts(ports=degraded().ports, env={"NCCL_IB_HCA": "=mlx5_2,mlx5_3"}))
    assert r.status == WARN and "not Active: mlx5_3:1" in r.detail


def test_the_silent_fall_back_to_sockets_fails_with_its_fix():
    sock = F.parse_nccl_log(recorded("nccl-socket-fallback.log"))
    r = C.check_transport(h100(), sock, multi_node=True)
    assert r.status == FAIL and r.expected == "IB (the hosts have InfiniBand)"
    assert "NET/IB : No device found" in r.measured and "connections via NET/Socket x4" in r.measured
    assert "libibverbs" in r.remediation and "NCCL_IB_DISABLE" in r.remediation
    assert C.check_transport(h100(), sock, multi_node=False).status == INFO  # one host: no network between ranks
    nogdr = C.check_transport(h100(), F.parse_nccl_log(recorded("nccl-ib-no-gdr.log")), multi_node=True)
    assert nogdr.status == WARN and "nvidia_peermem" in nogdr.remediation
    plugin = C.check_transport(h100(), F.parse_nccl_log(recorded("nccl-ibext-plugin.log")), multi_node=True)
    assert plugin.status == PASS and "Using network IBext_v8" in plugin.measured
    silent = C.check_transport(h100(), F.parse_nccl_log("h:1:1 [0] NCCL INFO Init COMPLETE\n"), multi_node=True)
    assert silent.status == WARN and "NCCL_DEBUG=INFO" in silent.remediation


def test_bus_bandwidth_against_the_node_types_reference():
    sock = F.parse_all_reduce(recorded("all_reduce_perf-2x8-h100-socket.txt"))
    r = C.check_busbw(sock, REF, gpu_name=sock.gpus[0], gpus_per_node=8, multi_node=True)
    assert r.status == FAIL and r.measured.startswith("9.5 GB/s at 1 GiB+") and "TCP sockets" in r.remediation
    good = F.parse_all_reduce(recorded("all_reduce_perf-2x8-h100-ib.txt"))
    slowish = F.AllReduce(rows=[{**row, "oop": {**row["oop"], "busbw": row["oop"]["busbw"] * 0.7},
                                 "ip": {**row["ip"], "busbw": row["ip"]["busbw"] * 0.7}} for row in good.rows])
    w = C.check_busbw(slowish, REF, gpu_name="NVIDIA H100 80GB HBM3", gpus_per_node=8, multi_node=True)
    assert w.status == WARN and "network.gpudirect" in w.remediation
    old = F.parse_all_reduce(recorded("all_reduce_perf-1x8-a100-old.txt"))
    bad = C.check_busbw(old, REF, gpu_name=old.gpus[0], gpus_per_node=8, multi_node=False)
    assert bad.status == FAIL and "2 wrong result(s)" in bad.measured  # corrupted results, whatever the speed
    unknown = C.check_busbw(good, REF, gpu_name="NVIDIA L40S", gpus_per_node=8, multi_node=True)
    assert unknown.status == INFO and "playbooks/nccl_busbw.yaml" in unknown.detail


def test_the_reference_table_is_data_with_a_source_for_every_row():
    rows = REF["references"]
    assert len({r["id"] for r in rows}) == len(rows) >= 4
    for r in rows:
        re.compile(r["gpu"])
        low, high = r["busbw_gbs"]
        assert 0 < low <= high and r["scope"] in ("single-node", "multi-node") and r.get("source"), r
    assert C.reference_row(REF, "NVIDIA H100 80GB HBM3", 8, True)["id"] == "h100-sxm-8x-ndr-multinode"
    assert C.reference_row(REF, "NVIDIA H100 80GB HBM3", 8, False)["id"] == "h100-sxm-8x-nvlink"
    assert C.reference_row(REF, "NVIDIA H100 80GB HBM3", 4, True) is None


def test_judge_is_the_one_entry_point_and_a_degraded_node_says_every_fault():
    r = by_id(C.judge(degraded(), nccl=F.parse_nccl_log(recorded("nccl-ib-no-gdr.log")), multi_node=True,
                      expect_rate_gbps=400))
    assert r["network.ib_ports"].status == FAIL and r["network.gpudirect"].status == WARN
    assert r["network.nccl_transport"].status == WARN and "network.busbw" not in r
    assert C.judge(None)[0].status == WARN  # no facts at all: said, not guessed
