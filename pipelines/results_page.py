"""The tables of docs/results.md (and README's results lines), generated from the committed
artifacts under results/, so that no figure on the page can drift from what a run measured.

An experiment's folder (`results/<name>/`) holds what its run directory's report wrote
(`report.json`, `outcomes.csv`), its resolved `config.yaml`, `choices.yaml` (every setting
chosen on validation tasks, each configuration tried with its validation score and command)
and `dtype_val.json` (benchmarks/dtype_val.py: the base policy in bfloat16 vs float32 on the
validation tasks, the check that let the run use bfloat16).
A page marks each generated block with a pair of comments:

    <!-- results: minishop headline -->
    ...generated, never edited by hand...
    <!-- /results -->

`fill(page, root)` regenerates every block; `python -m pipelines.results_page` rewrites
docs/results.md and README.md in place (`--check`: exit 1 if either would change, what the
test suite asserts). Blocks: `headline` (the comparison table), `readme` (its rows as
sentences), `choices` (the configurations tried), `checkpoints` (each policy's checkpoints
on the validation tasks, from report.json's selection), `stages` (each stage of the
run's pipeline, its time and status, or not run yet), `dtype` (the bfloat16 check).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

from pipelines.stages import in_pipeline_order

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/results.md", "README.md")
BLOCK = re.compile(r"(<!-- results: (\S+) (\S+) -->\n)(.*?)(<!-- /results -->)", re.S)

# the headline's rows: a policy's greedy entry by its name in report.json, in the paper's order
LABELS = {"base": "base", "rft": "RFT", "dpo_outcome": "outcome DPO",
          "dpo_step": "step DPO (Agent Q)", "dpo_step_outcome": "step + outcome DPO"}


def load(folder: Path) -> dict:
    """An experiment's artifacts: report, config and choices (empty where not yet written)."""
    def read(name: str, parse) -> dict:
        path = folder / name
        return parse(path.read_text()) if path.is_file() else {}
    return {"report": read("report.json", json.loads),
            "config": read("config.yaml", yaml.safe_load) or {},
            "choices": read("choices.yaml", yaml.safe_load) or {},
            "dtype": read("dtype_val.json", json.loads)}


def pct(value: float | None, ci: list[float] | None = None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    text = f"{value * 100:{sign}.1f}"
    return text + (f" [{ci[0] * 100:{sign}.1f}, {ci[1] * 100:{sign}.1f}]" if ci else "")


def p_value(d: dict | None) -> str:
    if not d or d.get("mcnemar_p") is None:
        return "-"
    p = d["mcnemar_p"]
    text = f"{p:.3f}" if p >= 0.001 else f"{p:.0e}"
    return f"{d['wins']}:{d['losses']}, p {text} ({d.get('configs_tried', 1)} tried)"


def paired(d: dict | None) -> str:
    """A paired difference with its interval, then wins:losses and McNemar p."""
    return f"{pct(d['success_rate'], d['ci95'], True)}, {p_value(d)}" if d else "-"


def label(entry: dict) -> str:
    """The row's name for a reader: the method, then where it came from."""
    policy, mode = entry["policy"], entry["mode"]
    name, _, round_ = policy.partition("@")
    text = LABELS.get(name, name.upper() if name == "grpo" else name)
    if round_:
        text = f"round {round_}: {text}"
    return text + (" + MCTS" if mode != "greedy" else "")


def in_order(entries: list[dict]) -> list[dict]:
    """Greedy rows first, in training order, then the searches at inference."""
    return sorted(entries, key=lambda e: e["mode"] != "greedy")


def headline(exp: dict) -> str:
    """The comparison table: every evaluated row, greedy first in training order, then the
    searches at inference, with n, Wilson and paired bootstrap intervals and McNemar p."""
    entries = exp["report"].get("policies", [])
    if not entries:
        return "_No evaluation yet: the run has not reached its eval stage._\n"
    dtype = exp["config"].get("model", {}).get("dtype", "?")
    lines = [f"| row ({dtype}) | n | success % [95% CI] | vs base, paired: points [95% CI], "
             "wins:losses, McNemar p | vs same policy greedy, paired | mean reward [95% CI] |",
             "|---|---|---|---|---|---|"]
    for e in in_order(entries):
        ci = e.get("mean_reward_ci95")
        reward = f"{e['mean_reward']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
        lines.append(" | ".join([
            f"| {label(e)}", str(e["n_tasks"]), pct(e["success_rate"], e["ci95"]),
            paired(e.get("delta_vs_base")), paired(e.get("delta_vs_greedy")), reward]) + " |")
    return "\n".join(lines) + "\n"


def readme(exp: dict) -> str:
    """Each row as a sentence with n and its interval, for README's results paragraph."""
    entries = exp["report"].get("policies", [])
    if not entries:
        return "No test figures yet: the run has not reached its eval stage.\n"
    parts = []
    for e in in_order(entries):
        d = e.get("delta_vs_greedy") or e.get("delta_vs_base")
        against = "its own greedy" if e.get("delta_vs_greedy") else "base"
        delta = f", {pct(d['success_rate'], d['ci95'], True)} vs {against}" if d else ""
        parts.append(f"{label(e)} {pct(e['success_rate'], e['ci95'])}{delta}")
    n = max(e["n_tasks"] for e in entries)
    return f"Success % on up to {n} test tasks [95% CI]: " + "; ".join(parts) + ".\n"


def choices(exp: dict) -> str:
    """Every choice made on validation tasks: the configurations tried and the one taken."""
    made = exp["choices"].get("choices", [])
    if not made:
        return "_No setting chosen on validation yet._\n"
    lines = ["| choice | configuration | validation success % [95% CI] | mean reward | "
             "taken | command |", "|---|---|---|---|---|---|"]
    for c in made:
        for t in c["tried"]:
            lines.append(f"| {c['what']} | {t['config']} | {pct(t['success'], t.get('ci95'))} "
                         f"| {t['mean_reward']:.3f} | {'**yes**' if t.get('taken') else ''} "
                         f"| `{t['command']}` |")
    return "\n".join(lines) + "\n"


def checkpoints(exp: dict) -> str:
    """Each trained policy's checkpoints played on the validation tasks, and the one taken
    (train.select / grpo.select: val): success first, mean reward breaking ties."""
    selected = exp["report"].get("selection", {})
    if not selected:
        return "_No checkpoint chosen on validation yet._\n"
    lines = ["| policy | checkpoints: step, validation success %, mean reward | taken |",
             "|---|---|---|"]
    for policy, s in selected.items():
        tried = "; ".join(f"{c['step']}: {c['success_rate'] * 100:.1f}, {c['mean_reward']:.3f}"
                          for c in s["candidates"])
        n = s["candidates"][0]["n_tasks"] if s["candidates"] else 0
        lines.append(f"| {label({'policy': policy, 'mode': 'greedy'})} | {tried} (n {n}) "
                     f"| step {s['step']} of {s['last_step']} |")
    return "\n".join(lines) + "\n"


def stages(exp: dict) -> str:
    """Every stage of the run's pipeline in order, from its config's run.iterations (but
    `report`, pipelines/report.py): status and seconds over its attempts, or `not run yet`,
    so a page copied out of a run still going shows what it has still to do."""
    rows = exp["report"].get("stages", [])
    if not rows:
        return "_No stage recorded yet._\n"
    iterations = exp["config"].get("run", {}).get("iterations", 1)
    lines = ["| stage | status | seconds |", "|---|---|---|"]
    for name in in_pipeline_order(iterations, [r["stage"] for r in rows]):
        if name == "report":
            continue
        lines += [f"| {name} | {r['status']} | "
                  + ("-" if r["seconds"] is None else f"{r['seconds']:,.0f}") + " |"
                  for r in rows if r["stage"] == name] or [f"| {name} | not run yet | - |"]
    return "\n".join(lines) + "\n"


def dtype(exp: dict) -> str:
    """The bfloat16 check: both dtypes' base success on the validation tasks, the paired
    difference, and how many episodes changed at all."""
    check = exp["dtype"]
    if not check:
        return "_No dtype check recorded._\n"
    d = check["difference"]
    lines = ["| base, greedy | n | success % [95% CI] | mean reward | seconds |",
             "|---|---|---|---|---|"]
    for name in ("float32", "bfloat16"):
        s = check[name]["summary"]
        lines.append(f"| {name} | {s['n_tasks']} | {pct(s['success_rate'], s['ci95'])} | "
                     f"{s['mean_reward']:.3f} | {check[name]['seconds']:,.0f} |")
    lines.append(f"| bfloat16 - float32, paired | {d['n_tasks']} | "
                 f"{pct(d['success_rate'], d['ci95'], True)} | {d['mean_reward']:+.3f} | "
                 f"{check['speed_ratio']:.2f}x the speed |")
    return ("\n".join(lines) + f"\n\nEpisodes whose actions differ at all: {d['changed']} of "
            f"{d['n_tasks']} ({pct(d['changed_rate'], d['changed_ci95'])} %); "
            f"{d['wins']}:{d['losses']} in success, McNemar p {d['mcnemar_p']:.3f}.\n")


BLOCKS = {"headline": headline, "readme": readme, "choices": choices,
          "checkpoints": checkpoints, "stages": stages, "dtype": dtype}


def fill(page: str, root: Path) -> str:
    """`page` with every generated block rewritten from results/<experiment>/ under `root`."""
    def one(m: re.Match) -> str:
        exp, block = m.group(2), m.group(3)
        if block not in BLOCKS:
            raise ValueError(f"unknown results block {block!r}; known: {', '.join(BLOCKS)}")
        return m.group(1) + BLOCKS[block](load(root / "results" / exp)) + m.group(5)
    return BLOCK.sub(one, page)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Regenerate the results tables of "
                                             + " and ".join(PAGES) + " from results/.")
    ap.add_argument("--check", action="store_true", help="exit 1 if a page would change")
    args = ap.parse_args(argv)
    stale = []
    for name in PAGES:
        path = ROOT / name
        old = path.read_text()
        new = fill(old, ROOT)
        if new != old:
            stale.append(name)
            if not args.check:
                path.write_text(new)
    if args.check and stale:
        print(f"out of date with results/: {', '.join(stale)}; run python -m "
              "pipelines.results_page", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
