"""The comparison table of a report: its columns and each policy entry's cells, shared by the
text table on stdout and the page (report_html.py), so both always show the same numbers.

An entry is one of report.json's `policies` (pipelines/report.py `policy_results`).
"""

from __future__ import annotations


def _pct(value: float | None, ci: list[float] | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    text = f"{value * 100:{sign}.1f}%"
    return text + (f" [{ci[0] * 100:{sign}.1f}, {ci[1] * 100:{sign}.1f}]" if ci else "")


def _num(value: float | None, ci: list[float] | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    return f"{value:{sign}.3f}" + (f" [{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]" if ci else "")


def comparison_cells(entry: dict) -> list[str]:
    """One row of the comparison table as text cells (shared by stdout and the page)."""
    d = entry["delta_vs_base"] or {}
    return [
        entry["policy"], entry["mode"], str(entry["n_tasks"]),
        _pct(entry["success_rate"], entry["ci95"]),
        _pct(d.get("success_rate"), d.get("ci95"), signed=True) if d else "-",
        _num(entry["mean_reward"], entry["mean_reward_ci95"]),
        _num(d.get("mean_reward"), d.get("mean_reward_ci95"), signed=True) if d else "-",
        _pct(entry["invalid_rate"], None),
        _num(entry["mean_steps"], None),
    ]


COLUMNS = ["policy", "mode", "n", "success [95% CI]", "vs base (paired)",
           "mean reward [95% CI]", "vs base (paired)", "invalid", "steps"]


def comparison_table(report: dict) -> str:
    """The policies side by side as fixed-width text."""
    if not report["policies"]:
        return "no evaluation episodes in this run yet"
    rows = [COLUMNS] + [comparison_cells(e) for e in report["policies"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
