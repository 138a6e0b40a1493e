"""Rendering of verify reports: rich table, plain lines (also the saved .txt), JSON. No decisions here."""
from __future__ import annotations

from .results import AREAS, FAIL, INFO, PASS, WARN, CheckResult

MARK_PLAIN = {PASS: "PASS", WARN: "WARN", FAIL: "FAIL", INFO: "INFO"}
MARK_RICH = {PASS: "[green]✓[/]", WARN: "[yellow]![/]", FAIL: "[bold red]✗[/]", INFO: "[dim]·[/]"}


def summary_line(doc: dict) -> str:
    s = doc["summary"]
    verdict = {PASS: "PASS", WARN: "PASS with warnings", FAIL: "FAIL"}[doc["verdict"]]
    parts = [f"{s['fail']} failed", f"{s['warn']} warning(s)", f"{s['pass']} passed"]
    return (f"{verdict}: {doc['profile']} ({doc['host']}) — " + ", ".join(parts) +
            f" — {doc['remote_executions']} remote execution(s), {doc['duration_s']:.1f}s")


def _grouped(results: list[CheckResult]):
    order = list(AREAS)
    return sorted(results, key=lambda r: order.index(r.area) if r.area in order else len(order))


def plain_lines(doc: dict, results: list[CheckResult]) -> list[str]:
    lines = [f"gpuops verify {doc['profile']}  {doc['user']}@{doc['host']}:{doc['port']}  {doc['checked_at']}"]
    if doc.get("emulated"):
        lines.append("note: the GPUs on this host are EMULATED (gpuops sandbox); no real CUDA work is possible")
    area = None
    for r in _grouped(results):
        if r.area != area:
            area = r.area
            lines.append("")
            lines.append(f"[{AREAS.get(area, area)}]")
        text = f"  {MARK_PLAIN[r.status]}  {r.title}: {r.measured or '-'}"
        if r.expected:
            text += f"  (expected {r.expected})"
        lines.append(text)
        if r.detail and r.status in (WARN, FAIL):
            lines.append(f"        {r.detail}")
        if r.remediation and r.status in (WARN, FAIL):
            lines.append(f"        fix: {r.remediation}")
    lines.append("")
    lines.append(summary_line(doc))
    return lines


def render_rich(out, doc: dict, results: list[CheckResult]) -> None:
    from rich.markup import escape
    from rich.table import Table

    title = f"gpuops verify [bold]{escape(doc['profile'])}[/]  {escape(doc['user'])}@{escape(doc['host'])}:{doc['port']}"
    table = Table(title=title, title_justify="left", show_lines=False, expand=False, pad_edge=False)
    table.add_column("", width=1)
    table.add_column("Check", style="bold")
    table.add_column("Measured", overflow="fold")
    table.add_column("Expected", style="dim", overflow="fold")
    area = None
    for r in _grouped(results):
        if r.area != area:
            if area is not None:
                table.add_section()
            area = r.area
            table.add_row("", f"[cyan]{AREAS.get(area, area)}[/]", "", "")
        measured = escape(r.measured or "-")
        if r.detail and r.status in (WARN, FAIL):
            measured += f"\n[dim]{escape(r.detail)}[/]"
        table.add_row(MARK_RICH[r.status], escape(r.title), measured, escape(r.expected or ""))
    out.render(table)
    if doc.get("emulated"):
        out.render("[yellow]note:[/] the GPUs on this host are EMULATED (gpuops sandbox)")
    fixes = [r for r in _grouped(results) if r.remediation and r.status in (WARN, FAIL)]
    if fixes:
        out.render("[bold]How to fix[/]")
        for r in fixes:
            out.render(f" {MARK_RICH[r.status]} [bold]{escape(r.title)}[/]: {escape(r.remediation)}")
    color = {PASS: "green", WARN: "yellow", FAIL: "bold red"}[doc["verdict"]]
    out.render(f"[{color}]{escape(summary_line(doc))}[/]")
