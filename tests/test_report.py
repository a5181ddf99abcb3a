"""Report: report.json and index.html from a real DuckDB store, complete or partial; the
`report` verb; and a look at the page in a real browser where chromium is installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from offline_agent.evaluation import EvalConfig
from offline_agent.types import Task
from pipelines.cli import main
from pipelines.stages.report import build_report, comparison_table, write_report
from storage import ExampleRow, PairRow, Store

N = 40  # test tasks


def step(invalid: bool = False) -> dict:
    return {"action": "x", "observation": "y", "tool_call": None, "reward": 0.0, "done": False,
            "invalid": invalid, "info": {}}


def episodes(policy: str, solved: set[int], invalid_every: int = 0) -> list[dict]:
    """N episodes of 2-4 steps; task i solved when i in `solved`."""
    return [{"policy": policy, "mode": "greedy", "task_id": f"t{i:03d}",
             "steps": [step(invalid_every > 0 and i % invalid_every == 0)] + [step()] * (1 + i % 3),
             "reward": 1.0 if i in solved else 0.25, "success": i in solved}
            for i in range(N)]


def fill(store: Store, training: bool = True) -> None:
    """A run through eval: tasks, stage rows, pairs, examples, metrics, two adapters."""
    store.insert_tasks([Task(f"t{i:03d}", "minishop", "buy", "test") for i in range(N)], "tasks")
    store.record_run({"eval": {"bootstrap": 500, "seed": 3}})
    for stage, stats in (("tasks", {"test": N}), ("search", {"tasks_solved_by_search": 5,
                                                             "nodes_per_s": 0.6})):
        store.start_stage(stage, "", "h", {})
        store.mark_stage_done(stage, "", stats)
    store.insert_eval_episodes(episodes("base", set(range(0, N, 4)), invalid_every=5), "eval")
    if not training:
        return
    store.insert_pairs([PairRow(pair_id=i, task_id="t000", kind=k, prompt=[], chosen=[],
                                rejected=[]) for i, k in enumerate(["step"] * 3 + ["trajectory"])],
                       "mine")
    store.insert_examples([ExampleRow(example_id=0, task_id="t000", env="minishop",
                                      kind="rft", instruction="buy", messages=[])], "mine")
    for policy in ("dpo_step", "rft"):  # training order: dpo_step finished first
        store.set_checkpoint("train", "", f"{policy}/final", {"folder": f"x/{policy}", "step": 5})
        store._insert("metrics", [{"series": policy, "step": s,
                                   "data": {"loss": 0.7 - 0.1 * s, "margin": 0.05 * s}}
                                  for s in range(5)], stage="train")
    store.insert_eval_episodes(episodes("rft", set(range(0, N, 4)) | {1}), "eval")
    store.insert_eval_episodes(episodes("dpo_step", set(range(0, N, 2))), "eval")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    with Store(tmp_path / "store.duckdb") as store:
        fill(store)
    return tmp_path


def test_report_json_numbers(run_dir):
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        report = build_report(store, EvalConfig(bootstrap=500, seed=3))
    base, step_dpo, rft = report["policies"]
    assert [p["policy"] for p in report["policies"]] == ["base", "dpo_step", "rft"]
    assert base["n_tasks"] == N and base["success_rate"] == 0.25
    assert base["delta_vs_base"] is None
    assert base["invalid_rate"] == round(8 / sum(2 + i % 3 for i in range(N)), 4)
    lo, hi = base["ci95"]
    assert lo < 0.25 < hi
    # dpo_step solves every other task, base every fourth: +25 points, paired interval > 0
    delta = step_dpo["delta_vs_base"]
    assert delta["n_tasks"] == N and delta["success_rate"] == 0.25
    assert 0 < delta["ci95"][0] < 0.25 < delta["ci95"][1]
    assert rft["delta_vs_base"]["success_rate"] == 0.025
    assert rft["delta_vs_base"]["ci95"][0] == 0  # one extra task: never below 0 when paired
    assert report["data"]["pairs"] == {"step": 3, "trajectory": 1}
    assert report["data"]["examples"] == {"rft": 1}
    assert report["data"]["tasks"] == {"test": N}
    assert [p["step"] for p in report["training"]["rft"]] == list(range(5))
    assert report["training"]["dpo_step"][4] == {"step": 4, "loss": pytest.approx(0.3),
                                                 "margin": 0.2}
    assert [s["stage"] for s in report["stages"]] == ["tasks", "search"]
    assert report["stages"][1]["stats"]["nodes_per_s"] == 0.6


def test_report_files_and_table(run_dir):
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        report = build_report(store, EvalConfig())
    page = write_report(run_dir, report)
    assert json.loads((run_dir / "report" / "report.json").read_text()) == report
    html = page.read_text()
    assert html.count("<svg") == 2  # success chart, training curves
    for external in ("<script", "<link", "<img", "src=", "url(http", "href=\"http"):
        assert external not in html  # self-contained: nothing to fetch
    assert "dpo_step" in html and "tasks_solved_by_search" in html
    assert "&quot;bootstrap&quot;: 500" in html  # the run's config, folded away
    table = comparison_table(report).splitlines()
    assert table[0].split()[:3] == ["policy", "mode", "n"]
    assert table[2].startswith("base ") and "25.0% [" in table[2]
    assert table[3].startswith("dpo_step") and "+25.0% [+" in table[3]


def test_report_of_partial_runs(tmp_path):
    """Only base evaluated, and nothing evaluated at all: the page says what is missing."""
    (tmp_path / "a").mkdir()
    with Store(tmp_path / "a" / "store.duckdb") as store:
        fill(store, training=False)
        report = build_report(store, EvalConfig())
    assert [p["policy"] for p in report["policies"]] == ["base"]
    assert report["training"] == {} and report["data"]["pairs"] == {}
    html = write_report(tmp_path / "a", report).read_text()
    assert "No training metrics yet" in html and html.count("<svg") == 1

    (tmp_path / "b").mkdir()
    with Store(tmp_path / "b" / "store.duckdb") as store:
        report = build_report(store, EvalConfig())
    assert report["policies"] == [] and report["stages"] == []
    html = write_report(tmp_path / "b", report).read_text()
    assert "No evaluation episodes yet" in html and "<svg" not in html
    assert "No run config recorded" in html
    assert comparison_table(report) == "no evaluation episodes in this run yet"


def test_report_verb_reads_store_read_only(run_dir, capsys):
    before = (run_dir / "store.duckdb").read_bytes()
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "dpo_step" in out and f"report: {run_dir / 'report' / 'index.html'}" in out
    assert (run_dir / "store.duckdb").read_bytes() == before
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert report["config"] == {"eval": {"bootstrap": 500, "seed": 3}}


def test_report_verb_without_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "no store at" in capsys.readouterr().err


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_page_renders_in_a_browser(run_dir, tmp_path):
    """Chromium draws the page (offline) into a PNG that is neither blank nor tiny."""
    import matplotlib.image

    with Store(run_dir / "store.duckdb", read_only=True) as store:
        page = write_report(run_dir, build_report(store, EvalConfig()))
    png = tmp_path / "shot.png"
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--screenshot={png}", "--window-size=1200,2000", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (2000, 1200)
    assert pixels[:, :, :3].std() > 0.05  # text, tables and charts, not an empty page
