"""Stage `report`: report/report.json and report/index.html (pipelines/report.py) from what
the run stored; `offline-agent report RUN_DIR` re-renders them at any time."""

from __future__ import annotations

from pipelines.report import build_report, outcomes, write_report
from pipelines.report_table import comparison_table, diagnostics_text
from pipelines.runner import StageContext


def run_report(ctx: StageContext) -> dict:
    report = build_report(ctx.store, ctx.cfg.eval)
    path = write_report(ctx.run_dir, report, outcomes(ctx.store))
    print(comparison_table(report), flush=True)
    print(diagnostics_text(report["diagnostics"]), flush=True)
    print(f"report: {path}", flush=True)
    stats = {"policies": len(report["policies"]), "html": str(path)}
    with ctx.store.transaction():
        ctx.mark_done(stats)
    return stats
