"""docs/results.md and README's results lines are generated from results/ (pipelines/
results_page.py): the committed pages equal what the script prints from the committed
artifacts, and the blocks carry a real report's numbers."""

from __future__ import annotations

import json

import pytest
import yaml

from offline_agent.evaluation import EvalConfig
from pipelines.report import build_report
from pipelines.results_page import ROOT, fill, headline, main, stages
from storage import Store
from tests.test_report import fill as fill_store

PAGE = """# Results
<!-- results: toy headline -->
stale text
<!-- /results -->
prose kept
<!-- results: toy choices -->
<!-- /results -->
<!-- results: toy readme -->
<!-- /results -->
<!-- results: toy checkpoints -->
<!-- /results -->
<!-- results: toy stages -->
<!-- /results -->
"""


@pytest.fixture
def root(tmp_path):
    """A repo-like folder whose results/toy/ holds a real report of a small store."""
    candidates = [{"step": s, "folder": f"c/{s}", "policy": f"rft/step-{s}", "n_tasks": 4,
                   "success_rate": r, "mean_reward": m}
                  for s, r, m in ((2, 0.5, 0.6), (4, 0.25, 0.4))]
    selected = {"by": "val", "step": 2, "last_step": 4, "why": "x", "candidates": candidates}
    with Store(tmp_path / "store.duckdb") as store:
        fill_store(store)
        store.start_stage("report", "", "h", {})  # as the report stage sees itself
        store.set_checkpoint("train", "", "rft/final", {"folder": "c/2", "step": 4,
                                                        "selected": selected})
        report = build_report(store, EvalConfig(bootstrap=500))
    exp = tmp_path / "results" / "toy"
    exp.mkdir(parents=True)
    (exp / "report.json").write_text(json.dumps(report))
    (exp / "config.yaml").write_text(yaml.safe_dump({"model": {"dtype": "bfloat16"}}))
    (exp / "choices.yaml").write_text(yaml.safe_dump({"choices": [{"what": "train.lr", "tried": [
        {"config": "lr 1e-4", "success": 0.25, "ci95": [0.1, 0.4], "mean_reward": 0.5,
         "command": "offline-agent run c.yaml", "taken": True},
        {"config": "lr 3e-4", "success": 0.2, "mean_reward": 0.45, "command": "x"}]}]}))
    return tmp_path


def test_blocks_are_regenerated_from_the_artifacts_and_prose_is_kept(root):
    page = fill(PAGE, root)
    assert "stale text" not in page and "prose kept" in page
    assert "| row (bfloat16) |" in page  # the dtype the run used, named in the table
    # dpo_step solves every even task of 40, base every 4th: 50% vs 25%, +25 points paired
    assert "| step DPO (Agent Q) | 40 | 50.0 [" in page and "| +25.0 [" in page
    assert ", 10:0, p 0.002 (1 tried) |" in page  # wins:losses beside the difference
    assert "| train.lr | lr 1e-4 | 25.0 [10.0, 40.0] | 0.500 | **yes** |" in page
    assert "step DPO (Agent Q) 50.0 [" in page and "vs base" in page  # the readme sentence
    # rft's two checkpoints on the validation tasks, the first one taken
    assert "| RFT | 2: 50.0, 0.600; 4: 25.0, 0.400 (n 4) | step 2 of 4 |" in page
    # the stages done, not the report stage that was writing report.json
    assert "| search | done |" in page and "| report |" not in page
    assert fill(page, root) == page  # idempotent


def test_a_searched_row_shows_its_test_against_base_and_against_its_greedy_apart():
    """A +MCTS row is paired twice: each comparison keeps its own wins:losses and p."""
    def delta(points, wins, losses, p):
        return {"success_rate": points, "ci95": [points - 0.05, points + 0.05], "wins": wins,
                "losses": losses, "mcnemar_p": p}
    row = {"policy": "grpo", "mode": "mcts", "n_tasks": 100, "success_rate": 0.4,
           "ci95": [0.3, 0.5], "mean_reward": 0.7, "delta_vs_base": delta(0.15, 17, 2, 0.0007),
           "delta_vs_greedy": delta(0.1, 13, 3, 0.021)}
    line = headline({"report": {"policies": [row]}, "config": {}}).splitlines()[-1]
    assert line.split(" | ")[3:5] == ["+15.0 [+10.0, +20.0], 17:2, p 7e-04 (1 tried)",
                                      "+10.0 [+5.0, +15.0], 13:3, p 0.021 (1 tried)"]


def test_the_stage_table_follows_the_pipeline_and_shows_what_a_partial_run_has_left():
    """Copied out after round 1's eval, a two-round run lists its stages in pipeline order
    (not the order the store recorded them in) and the rest as not run yet."""
    rows = [{"stage": s, "shard": "", "status": "done", "seconds": 2.0}
            for s in ("tasks", "eval", "grpo", "train")]
    table = stages({"report": {"stages": rows}, "config": {"run": {"iterations": 2}}})
    names = [line.split(" | ")[0][2:] for line in table.splitlines()[2:]]
    assert names[:2] == ["tasks", "baseline"] and names.index("grpo") < names.index("eval")
    assert names[-2:] == ["eval@2", "mcts"] and "report" not in names
    assert "| grpo | done | 2 |" in table and "| search@2 | not run yet | - |" in table


def test_an_experiment_without_artifacts_says_so(tmp_path):
    page = fill("<!-- results: none headline -->\n<!-- /results -->", tmp_path)
    assert "No evaluation yet" in page


def test_an_unknown_block_is_an_error(root):
    with pytest.raises(ValueError, match="unknown results block 'nosuch'"):
        fill("<!-- results: toy nosuch -->\n<!-- /results -->", root)


def test_committed_pages_match_the_committed_artifacts():
    """No figure on docs/results.md or README.md can drift from results/: regenerate and
    compare (`python -m pipelines.results_page` rewrites them)."""
    assert (ROOT / "results").is_dir()
    assert main(["--check"]) == 0
