"""The report's data model and files: report.json (`build_report`, a dict of plain values, the
contract other tools read) and index.html beside it (`write_report`, the page from
report_html.py), from what a run stored, whatever stage it reached.

Everything is recomputed from the store's rows (evaluation episodes, stage rows, metrics,
counts, search trees), so a stopped run, a run without training or one evaluated only for
base renders too: a missing part is an empty list or mapping, and the page says it is
missing. The comparison table, which stdout and the page both show, is report_table.py's.
The `report` stage (pipelines/stages/report.py) and `offline-agent report RUN_DIR` both
write it.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path

from offline_agent.evaluation import (
    BASE,
    MODE,
    TEST,
    VAL,
    Episode,
    EvalConfig,
    compare,
    summarize,
)
from offline_agent.search.concordance import concordance
from offline_agent.training.config import POLICIES
from pipelines.artifacts import CONCORDANCE, FROZEN, HELD_OUT, trained_policies
from pipelines.diagnostics import diagnose
from pipelines.report_html import render
from pipelines.rounds import round_name, stored_rounds
from pipelines.transcripts import transcripts
from storage import Store


def eval_config(store: Store) -> EvalConfig:
    """The interval settings the run was last started with (defaults for older runs)."""
    runs = store.runs()
    return EvalConfig(**(runs[-1]["config"].get("eval", {}) if runs else {}))


def build_report(store: Store, cfg: EvalConfig) -> dict:
    runs = store.runs()
    return {
        "run_id": store.run_id,
        "generated_at": datetime.now().astimezone().isoformat(timespec="seconds"),
        "config": runs[-1]["config"] if runs else None,
        "policies": policy_results(store, cfg),
        "comparisons": comparisons(store, cfg),
        "stages": stage_rows(store),
        CONCORDANCE: critic_concordance(store),
        "data": {
            "tasks": store.count_by("tasks", "split"),
            "trajectories": store.count_by("trajectories", "source"),
            "pairs": store.count_by("pairs", "kind"),
            "examples": store.count_by("examples", "kind"),
        },
        "training": training_curves(store),
        "grpo": [{"step": r.step, **r.data} for r in store.metrics("grpo")],
        "transcripts": episode_transcripts(store),
        "diagnostics": diagnose(store),
        "selection": checkpoint_selection(store),
    }


def policy_results(store: Store, cfg: EvalConfig) -> list[dict]:
    """One entry per evaluated (policy, mode), named `<policy>` (greedy) or `<policy>+mcts`:
    base first, then trained policies in the order training finished them, each policy's
    search at inference after its greedy row; each but base greedy with its paired difference
    to base greedy, and a search row with its paired difference to the same policy greedy on
    the same tasks (`delta_vs_greedy`). Test tasks only (test_episodes). A trained policy's
    greedy row carries its pair accuracy on the mined pairs it did not train on (`held_out`,
    pipelines/stages/train.py; None for base, search rows and policies trained before it)."""
    runs = test_episodes(store)
    finals = trained_policies(store)
    rank = {name: i for i, name in enumerate([BASE, *finals])}
    order = sorted(runs, key=lambda k: (rank.get(k[0], len(rank)), k[0], k[1] != MODE, k[1]))
    base = runs.get((BASE, MODE))
    out = []
    for policy, mode in order:
        name = policy if mode == MODE else f"{policy}+{mode}"
        entry = {"name": name, "policy": policy, "mode": mode,
                 **summarize(runs[policy, mode], cfg)}
        is_base = (policy, mode) == (BASE, MODE)
        entry["delta_vs_base"] = (compare(runs[policy, mode], base, cfg)
                                  if base and not is_base else None)
        greedy = runs.get((policy, MODE))
        entry["delta_vs_greedy"] = (compare(runs[policy, mode], greedy, cfg)
                                    if greedy and mode != MODE else None)
        entry[HELD_OUT] = finals.get(policy, {}).get(HELD_OUT) if mode == MODE else None
        out.append(entry)
    return out


def test_episodes(store: Store) -> dict[tuple[str, str], list[Episode]]:
    """{(policy, mode): its episodes on the test tasks}: validation episodes (the train
    stage's checkpoint selection, on split "val") never enter the test table."""
    runs: dict[tuple[str, str], list[Episode]] = {}
    for row in store.eval_episodes(split=TEST):
        runs.setdefault((row.policy, row.mode), []).append(Episode.from_row(row))
    return runs


# the paired tests beside "each policy vs base": the paper's central claim, step-level DPO
# against outcome DPO (each round's, when both were trained), then what each later round
# adds: every trained policy of round r against its own round r-1
CLAIMS = (("dpo_step", "dpo_outcome"),)


def comparisons(store: Store, cfg: EvalConfig) -> list[dict]:
    """Each of those pairs both of whose policies were evaluated (greedy): the first minus
    the second on the tasks both played, as `compare` gives it (paired intervals, wins,
    losses, McNemar's p, eval.configs_tried)."""
    runs = test_episodes(store)
    rounds = stored_rounds(store.final_checkpoints, "train") or [1]
    pairs = [(round_name(a, r), round_name(b, r)) for r in rounds for a, b in CLAIMS]
    pairs += [(round_name(p, r), round_name(p, r - 1)) for r in rounds[1:] for p in POLICIES]
    return [{"policy": a, "against": b, **compare(runs[a, MODE], runs[b, MODE], cfg)}
            for a, b in pairs if (a, MODE) in runs and (b, MODE) in runs]


def checkpoint_selection(store: Store) -> dict[str, dict]:
    """{policy: which checkpoint train.select (or grpo.select) = val chose and why, with every
    candidate's validation score} for each policy selected that way (pipelines/selection.py)."""
    finals = {**trained_policies(store), **store.final_checkpoints("grpo")}
    return {name: final["selected"] for name, final in finals.items() if "selected" in final}


def episode_transcripts(store: Store) -> dict[str, dict]:
    """pipelines/transcripts.py's episodes, of the test tasks (validation ones left out)."""
    return transcripts(store.eval_episodes(split=TEST),
                       {t.id: t.instruction for t in store.tasks(TEST)})


def stage_rows(store: Store) -> list[dict]:
    """Each stage (and shard) with its status, seconds (all its attempts') and stats; the
    `report` stage is left out, since the report it would list is the one it is writing."""
    rows = []
    for r in (r for r in store.stages() if r.stage != "report"):
        rows.append({"stage": r.stage, "shard": r.shard, "status": r.status,
                     "seconds": None if r.seconds is None else round(r.seconds, 1),
                     "stats": r.stats})
    return rows


def critic_concordance(store: Store) -> dict[str, dict]:
    """{each round's search stage: the stored critic's concordance over its trees}, counted
    again from the trees, so a merge of shards counts all of them, and a store searched before
    the search stage recorded the figure shows it too."""
    stages = [round_name("search", r) for r in stored_rounds(store.trees, "search")]
    out = {stage: concordance(store.tree_statistics(stage)) for stage in stages}
    return {**out, **learned_concordance(store)}


def learned_concordance(store: Store) -> dict[str, dict]:
    """{"<critic stage> learned (held-out)" and "... frozen (same trees)": the concordances the
    critic stages counted on their held-out trees (pipelines/stages/critic.py)}."""
    out = {}
    for row in store.stages():
        stats = row.stats or {}
        if row.stage.split("@")[0] == "critic" and CONCORDANCE in stats:
            out[f"{row.stage}: learned, held-out trees"] = stats[CONCORDANCE]
            out[f"{row.stage}: frozen, same trees"] = stats[FROZEN]
    return out


def training_curves(store: Store) -> dict[str, list[dict]]:
    """{policy: [{"step": n, "loss": .., "margin": .., ...}]} from each round's train stage's
    metrics (round k's policies named `<policy>@k`)."""
    curves: dict[str, list[dict]] = {}
    k = 1
    while rows := store.metrics(round_name("train", k)):
        for row in rows:
            curves.setdefault(round_name(row.series, k), []).append(
                {"step": row.step, **row.data})
        k += 1
    return curves


OUTCOME_COLUMNS = ("policy", "mode", "split", "task_id", "success", "reward", "steps", "invalid")


def outcomes(store: Store) -> list[dict]:
    """One row per stored evaluation episode, test and validation (OUTCOME_COLUMNS): what a
    paired comparison of any two policies needs, small enough to keep beside report.json."""
    split = {t.id: t.split for s in ("train", TEST, VAL) for t in store.tasks(s)}
    out = []
    for row in store.eval_episodes():
        e = Episode.from_row(row)
        out.append({"policy": row.policy, "mode": row.mode, "split": split.get(e.task_id),
                    "task_id": e.task_id, "success": int(e.success),
                    "reward": round(e.reward, 4), "steps": e.steps, "invalid": e.invalid})
    return out


def outcomes_csv(rows: Sequence[dict]) -> str:
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=OUTCOME_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return text.getvalue()


def write_report(run_dir: Path, report: dict, episodes: Sequence[dict] = ()) -> Path:
    """RUN_DIR/report/report.json, index.html and outcomes.csv (`outcomes`: every evaluation
    episode's result), each replaced atomically; the page's path."""
    out = Path(run_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    for name, text in (("report.json", json.dumps(report, indent=1, default=str)),
                       ("index.html", render(report)), ("outcomes.csv", outcomes_csv(episodes))):
        tmp = out / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        os.replace(tmp, out / name)
    return out / "index.html"
