"""verify's report on a Slurm cluster as plain lines (pure): the cluster's own lines, the fleet checks across the
nodes, the summary. Each node's own report is verify's rendering (verify/report.py), unchanged."""
from __future__ import annotations

MARK = {"pass": "PASS", "warn": "WARN", "fail": "FAIL", "info": "INFO"}


def _check_lines(checks: list[dict]) -> list[str]:
    lines = []
    for c in checks:
        text = f"  {MARK.get(c['status'], c['status'].upper()):4}  {c['title']}: {c.get('measured') or '-'}"
        if c.get("expected") and c["status"] in ("warn", "fail"):
            text += f"  (expected {c['expected']})"
        lines.append(text)
        if c.get("detail") and c["status"] in ("warn", "fail"):
            lines.append(f"        {c['detail']}")
        if c.get("remediation") and c["status"] in ("warn", "fail"):
            lines.append(f"        fix: {c['remediation']}")
    return lines


def cluster_lines(doc: dict) -> list[str]:
    s = doc.get("slurm") or {}
    head = (f"=== cluster: {doc['profile']}  login {doc['user']}@{doc['host']}:{doc['port']}"
            + (f"  Slurm {s['version']}" if s.get("version") else "")
            + (f"  partition {s['partition']}" if s.get("partition") else "") + " ===")
    return [head] + _check_lines(doc.get("checks") or [])


def fleet_lines(doc: dict) -> list[str]:
    fleet = (doc.get("fleet") or {}).get("checks") or []
    n = len(doc.get("hosts") or [])
    lines = [f"=== the {n} nodes together ==="] + _check_lines(fleet) if fleet else []
    for f in doc.get("failed_nodes") or []:
        lines.append(f"  FAIL  node {f['node']} failed verify: {', '.join(f['failed']) or 'see its report'}")
        lines.append(f"        fix: {f['fix']}")
    return lines


def summary_line(doc: dict) -> str:
    hosts = doc.get("hosts") or []
    ok = sum(1 for h in hosts if h["code"] == 0)
    failed = [h["host"] for h in hosts if h["code"] != 0]
    verdict = {"pass": "PASS", "warn": "PASS with warnings", "fail": "FAIL"}[doc["verdict"]]
    if doc["code"] != 0 and verdict != "FAIL":
        verdict = "FAIL"
    s = doc.get("slurm") or {}
    text = (f"{verdict}: {doc['profile']} (Slurm, partition {s.get('partition') or '-'}) — {ok}/{len(hosts)} nodes "
            f"passed" + (f" (failed: {', '.join(failed)})" if failed else "")
            + f", cluster checks {s.get('verdict', '-')}, fleet checks {(doc.get('fleet') or {}).get('verdict', '-')}"
            f" — {doc['remote_executions']} remote execution(s) over one connection, {doc.get('srun_steps', 0)} srun "
            f"step{'' if doc.get('srun_steps', 0) == 1 else 's'}, {doc['duration_s']:.1f}s")
    return text
