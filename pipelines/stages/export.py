"""Stage `export`: the mined data as a Hugging Face dataset folder, RUN_DIR/export/.

`offline-agent export RUN_DIR --out DIR | --hub REPO` writes the same folder elsewhere or
pushes it; see pipelines/export.py for the layout.
"""

from __future__ import annotations

import sys

from pipelines.config import make_env
from pipelines.export import export, left_out
from pipelines.headlines import export_rows
from pipelines.runner import StageContext


def run_export(ctx: StageContext) -> dict:
    cfg = ctx.cfg
    env = make_env(cfg)
    out = ctx.run_dir / "export"
    counts = export(ctx.store, out, env.tools, cfg.to_dict())
    print(f"dataset: {out}  rows: {export_rows(counts, cfg.mine.rft_hindsight)}", flush=True)
    for line in left_out(ctx.store, counts):
        print(line, file=sys.stderr, flush=True)
    stats = {"folder": str(out), **counts, "rft_hindsight": cfg.mine.rft_hindsight}
    with ctx.store.transaction():
        ctx.mark_done(stats)
    return stats
