"""Report: report.json and index.html from a real DuckDB store, complete or partial; the
`report` verb; and a look at the page in a real browser where chromium is installed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from offline_agent.evaluation import EvalConfig
from offline_agent.types import Task
from pipelines.cli import main
from pipelines.report import build_report, write_report
from pipelines.report_table import comparison_table, paired_test_rows
from storage import (
    EvalEpisodeRow,
    ExampleRow,
    MetricRow,
    NodeRow,
    PairRow,
    Store,
    make_node_id,
)
from tests.rows import node_row

N = 40  # test tasks


def step(invalid: bool = False) -> dict:
    return {"action": "x", "observation": "y", "tool_call": None, "reward": 0.0, "done": False,
            "invalid": invalid, "info": {}}


def episodes(policy: str, solved: set[int], invalid_every: int = 0) -> list[EvalEpisodeRow]:
    """N episodes of 2-4 steps; task i solved when i in `solved`."""
    return [EvalEpisodeRow(policy=policy, mode="greedy", task_id=f"t{i:03d}",
                           steps=[step(invalid_every > 0 and i % invalid_every == 0)]
                           + [step()] * (1 + i % 3),
                           reward=1.0 if i in solved else 0.25, success=i in solved)
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
        store.insert_metrics([MetricRow(policy, s, {"loss": 0.7 - 0.1 * s, "margin": 0.05 * s})
                              for s in range(5)], "train")
    store.insert_metrics([MetricRow("grpo", s, {"reward_mean": 0.2 + 0.1 * s, "entropy": 1.0,
                                                "kl": 0.0, "clip_fraction": 0.01})
                          for s in range(1, 4)], "grpo")
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
    assert [p["step"] for p in report["grpo"]] == [1, 2, 3]
    assert report["grpo"][2]["reward_mean"] == pytest.approx(0.5)
    assert [s["stage"] for s in report["stages"]] == ["tasks", "search"]
    assert report["stages"][1]["stats"]["nodes_per_s"] == 0.6


def test_paired_tests_and_validation_episodes_kept_out_of_the_test_table(run_dir):
    with Store(run_dir / "store.duckdb") as store:
        store.insert_tasks([Task("v0", "minishop", "buy", "val")], "tasks")
        store.insert_eval_episodes([EvalEpisodeRow(policy=p, mode="greedy", task_id="v0",
                                                   steps=[step()], reward=1.0, success=True)
                                    for p in ("base", "dpo_step/step-2")], "train")
        store.set_checkpoint("train", "", "dpo_outcome/final", {"folder": "x", "step": 5})
        store.insert_eval_episodes(episodes("dpo_outcome", set(range(0, N, 4)) | {2, 6}), "eval")
        report = build_report(store, EvalConfig(bootstrap=500, configs_tried=3))
    by = {p["policy"]: p for p in report["policies"]}
    assert set(by) == {"base", "dpo_step", "rft", "dpo_outcome"}  # no validation candidate
    assert by["base"]["n_tasks"] == N and by["base"]["success_rate"] == 0.25
    # dpo_step solves the even tasks, base every fourth: 10 wins, no loss, p = 2 / 2^10
    d = by["dpo_step"]["delta_vs_base"]
    assert (d["wins"], d["losses"], d["mcnemar_p"], d["configs_tried"]) == (10, 0, 2 / 1024, 3)
    (claim,) = report["comparisons"]  # step DPO against outcome DPO: 8 wins (2 and 6 tie)
    assert (claim["policy"], claim["against"], claim["n_tasks"]) == ("dpo_step", "dpo_outcome", N)
    assert (claim["wins"], claim["losses"], claim["mcnemar_p"]) == (8, 0, 2 / 256)
    assert claim["success_rate"] == 0.2
    table = comparison_table(report)
    assert "0.00195 (10:0, 3 tried)" in table and "1 (1:0, 3 tried)" in table
    html = write_report(run_dir, report).read_text()
    assert "<td>dpo_outcome</td><td>40</td><td>+20.0% [" in html  # the paired-test row


def test_a_second_round_is_compared_with_the_first_policy_by_policy(run_dir):
    """Round 2's policies each against their own round 1 (beside round 2's step vs outcome
    claim); a round-2 policy whose round-1 self was never evaluated gets no comparison."""
    with Store(run_dir / "store.duckdb") as store:
        for policy in ("dpo_step", "dpo_outcome"):
            store.set_checkpoint("train@2", "", f"{policy}/final", {"folder": "y", "step": 5})
        store.insert_eval_episodes(episodes("dpo_step@2", set(range(0, N, 2)) | {1, 3}), "eval@2")
        store.insert_eval_episodes(episodes("dpo_outcome@2", set(range(0, N, 2))), "eval@2")
        report = build_report(store, EvalConfig(bootstrap=500))
    tests = {(c["policy"], c["against"]): c for c in report["comparisons"]}
    assert list(tests) == [("dpo_step@2", "dpo_outcome@2"), ("dpo_step@2", "dpo_step")]
    assert (tests["dpo_step@2", "dpo_outcome@2"]["wins"], tests["dpo_step@2", "dpo_outcome@2"]
            ["losses"]) == (2, 0)
    again = tests["dpo_step@2", "dpo_step"]  # round 1's dpo_step solves the even tasks too
    assert (again["wins"], again["losses"], again["success_rate"]) == (2, 0, 0.05)
    assert ["dpo_step@2", "dpo_step"] in [row[:2] for row in paired_test_rows(report)]


def test_the_checkpoint_selection_is_shown_with_its_reason(run_dir):
    candidates = [{"step": s, "folder": f"c/{s}", "policy": f"rft/step-{s}", "n_tasks": 4,
                   "success_rate": r, "mean_reward": 0.5} for s, r in ((2, 0.5), (4, 0.25))]
    selected = {"by": "val", "step": 2, "last_step": 4, "why": "step 2 of 2 checkpoints: x",
                "candidates": candidates}
    with Store(run_dir / "store.duckdb") as store:
        store.set_checkpoint("train", "", "rft/final", {"folder": "c/2", "step": 4,
                                                        "selected": selected})
        report = build_report(store, EvalConfig())
    assert report["selection"] == {"rft": selected}
    html = write_report(run_dir, report).read_text()
    assert "<td>rft</td><td>2</td><td>chosen</td><td>50.0%</td>" in html
    assert "<li>rft: step 2 of 2 checkpoints: x</li>" in html


def test_report_files_and_table(run_dir):
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        report = build_report(store, EvalConfig())
    page = write_report(run_dir, report)
    assert json.loads((run_dir / "report" / "report.json").read_text()) == report
    html = page.read_text()
    assert html.count("<svg") == 3  # success chart, training curves, GRPO
    for external in ("<script", "<link", "<img", "src=", "url(http", "href=\"http"):
        assert external not in html  # self-contained: nothing to fetch
    assert "dpo_step" in html and "tasks_solved_by_search" in html
    assert "&quot;bootstrap&quot;: 500" in html  # the run's config, folded away
    table = comparison_table(report).splitlines()
    assert table[0].split()[:3] == ["policy", "mode", "n"]
    assert table[2].startswith("base ") and "25.0% [" in table[2]
    assert table[3].startswith("dpo_step") and "+25.0% [+" in table[3]


def test_held_out_pair_accuracy_beside_each_trained_policy_hidden_when_none(run_dir):
    """The train stage's held-out figures (pipelines/stages/train.py) in report.json and a
    column of the table and page; no column while no policy held a pair out."""
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        report = build_report(store, EvalConfig(bootstrap=500))
    assert all(p["held_out"] is None for p in report["policies"])
    assert "held-out" not in comparison_table(report).splitlines()[0]
    figures = {"left_out_of": "dpo_step", "kinds": ["step"], "mined": 3, "n": 2,
               "pair_accuracy": 0.5, "pair_accuracy_ci95": [0.0945, 0.9055],
               "reward_accuracy": 1.0, "reward_accuracy_ci95": [0.3424, 1.0],
               "base_pair_accuracy": 0.0, "base_pair_accuracy_ci95": [0.0, 0.6576]}
    none = {**figures, "n": 0, **{k: None for k in figures if "accuracy" in k}}
    with Store(run_dir / "store.duckdb") as store:
        for policy, held_out in (("dpo_step", figures), ("rft", none)):
            final = store.checkpoint("train", "", f"{policy}/final")
            store.set_checkpoint("train", "", f"{policy}/final", {**final, "held_out": held_out})
        report = build_report(store, EvalConfig(bootstrap=500))
    by = {p["policy"]: p for p in report["policies"]}
    assert by["dpo_step"]["held_out"] == figures and by["base"]["held_out"] is None
    held_out = comparison_table(report).split("\n\n")[-1]  # its own block on stdout
    header, _, base, step_dpo, rft = held_out.splitlines()
    assert header.rstrip().endswith("held-out pairs: acc [95% CI] (base); reward acc")
    assert step_dpo.rstrip().endswith(
        "50.0% [9.4, 90.5] of 2 (base 0.0%); reward 100.0% [34.2, 100.0]")
    assert rft.rstrip().endswith("none held out (dpo_step's sample took all 3)")
    assert base.rstrip().endswith(" -")
    html = write_report(run_dir, report).read_text()
    assert "<td>50.0% [9.4, 90.5] of 2 (base 0.0%); reward 100.0% [34.2, 100.0]</td>" in html


def test_the_printed_table_fits_100_columns_with_every_policy_and_every_cell(tmp_path):
    """Every policy of a two-round run, GRPO, search at inference and held-out pairs: each
    line stdout gets is at most 100 columns, and it holds every cell of the page's table."""
    from pipelines.report_table import comparison_rows

    figures = {"left_out_of": "dpo_step_outcome", "kinds": ["step", "trajectory"],
               "mined": 12345, "n": 1234, "pair_accuracy": 0.5123,
               "pair_accuracy_ci95": [0.4845, 0.5401], "reward_accuracy": 0.9991,
               "reward_accuracy_ci95": [0.9953, 0.9998], "base_pair_accuracy": 0.4987,
               "base_pair_accuracy_ci95": [0.4709, 0.5265]}
    trained = {"train": ("dpo_outcome", "dpo_step", "dpo_step_outcome", "rft"),
               "train@2": ("dpo_step", "dpo_step_outcome")}
    with Store(tmp_path / "store.duckdb") as store:
        fill(store)
        for stage, policies in trained.items():
            for i, policy in enumerate(policies):
                store.set_checkpoint(stage, "", f"{policy}/final", {
                    "folder": "x", "step": 5, "held_out": figures if i % 2 else None})
        store.set_checkpoint("grpo", "", "grpo/final", {"folder": "y", "step": 3})
        names = ["dpo_outcome", "dpo_step_outcome", "grpo", "dpo_step@2", "dpo_step_outcome@2"]
        for k, name in enumerate(names):
            store.insert_eval_episodes(episodes(name, set(range(0, N, 3 + k))), "eval")
        for name in ("base", "dpo_step", "dpo_step_outcome@2"):
            store.insert_eval_episodes([replace(r, mode="mcts") for r in episodes(
                name, set(range(0, N, 2)), invalid_every=3)[:30]], "eval")
        report = build_report(store, EvalConfig(bootstrap=500, configs_tried=12))
    assert len(report["policies"]) == 11
    for width in (100, 60):  # 60: the held-out column wraps onto lines of its own
        table = comparison_table(report, width)
        assert max(len(line) for line in table.splitlines()) <= width
        words = " ".join(table.split())
        for row in comparison_rows(report["policies"]):
            assert all(" ".join(cell.split()) in words for cell in row), row


def test_search_at_inference_rows_pair_with_the_same_policy_greedy(tmp_path):
    """base+mcts on the first 10 tasks: its own row after base's, paired with base greedy on
    those 10 tasks (vs greedy) and with base greedy everywhere it has a twin (vs base)."""
    with Store(tmp_path / "store.duckdb") as store:
        fill(store, training=False)
        searched = [replace(r, mode="mcts", reward=1.0 if i % 2 == 0 else r.reward,
                            success=i % 2 == 0 or r.success)
                    for i, r in enumerate(episodes("base", set(range(0, N, 4)))[:10])]
        store.insert_eval_episodes(searched, "eval")
        report = build_report(store, EvalConfig(bootstrap=500))
    base, mcts = report["policies"]
    assert (base["name"], mcts["name"], mcts["policy"], mcts["mode"]) == (
        "base", "base+mcts", "base", "mcts")
    assert base["delta_vs_greedy"] is None and mcts["n_tasks"] == 10
    # base greedy solves tasks 0, 4, 8 of the first 10; with search 0, 2, 4, 6, 8: +20 points
    delta = mcts["delta_vs_greedy"]
    assert delta["n_tasks"] == 10 and delta["success_rate"] == pytest.approx(0.2)
    assert delta["ci95"][0] >= 0 and mcts["delta_vs_base"] == delta
    lo, hi = mcts["ci95"]
    assert lo < 0.5 < hi
    table = comparison_table(report).splitlines()
    assert "vs greedy (paired)" in table[0] and table[3].startswith("base+mcts")
    assert "+20.0% [" in table[3]


def test_paired_tests_hold_a_trained_policy_s_search_against_its_greedy(tmp_path):
    """dpo_step+mcts: tested against base and against dpo_step greedy (what search adds),
    base+mcts only against base (the same test); the table's p-value is the one vs base."""
    with Store(tmp_path / "store.duckdb") as store:
        fill(store)
        for policy in ("base", "dpo_step"):  # search solves every task of the first 10
            store.insert_eval_episodes(
                [replace(r, mode="mcts", reward=1.0, success=True)
                 for r in episodes(policy, set())[:10]], "eval")
        report = build_report(store, EvalConfig(bootstrap=500))
    rows = {(r[0], r[1]): r for r in paired_test_rows(report)}
    assert set(rows) == {("dpo_step", "base"), ("rft", "base"), ("base +mcts", "base"),
                         ("dpo_step +mcts", "base"), ("dpo_step +mcts", "dpo_step greedy")}
    # first 10 tasks: base greedy solves 0, 4, 8; dpo_step greedy 0, 2, 4, 6, 8
    vs_base, vs_greedy = rows["dpo_step +mcts", "base"], rows["dpo_step +mcts", "dpo_step greedy"]
    assert vs_base[2] == "10" and vs_base[3].startswith("+70.0% [") and vs_base[4:6] == ["7", "0"]
    assert vs_greedy[3].startswith("+50.0% [") and vs_greedy[4:6] == ["5", "0"]
    mcts_row = " ".join(line for line in comparison_table(report).splitlines()
                        if line.startswith("dpo_step+mcts"))  # its line in each block
    assert "(7:0, 1 tried)" in mcts_row and "+50.0% [" in mcts_row
    html = write_report(tmp_path, report).read_text()
    assert "<td>dpo_step +mcts</td><td>dpo_step greedy</td>" in html


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
    assert report["critic_concordance"] == {} and "No search trees yet" in html
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


def test_report_writes_every_episode_outcome_beside_report_json(run_dir):
    """report/outcomes.csv: one row per stored episode, what a paired test of any two
    policies needs (results/<experiment>/ keeps it beside report.json)."""
    import csv

    assert main(["report", str(run_dir)]) == 0
    rows = list(csv.DictReader((run_dir / "report" / "outcomes.csv").open()))
    assert len(rows) == 3 * N and {r["policy"] for r in rows} == {"base", "rft", "dpo_step"}
    step = {r["task_id"]: r for r in rows if r["policy"] == "dpo_step"}
    assert step["t002"]["success"] == "1" and step["t003"]["success"] == "0"
    assert step["t003"]["reward"] == "0.25" and step["t003"]["steps"] == str(1 + 1 + 3 % 3)
    assert {r["split"] for r in rows} == {"test"} and {r["mode"] for r in rows} == {"greedy"}
    base = {r["task_id"]: r for r in rows if r["policy"] == "base"}
    assert base["t005"]["invalid"] == "1" and base["t006"]["invalid"] == "0"


def test_report_verb_without_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert f"run directory {tmp_path / 'nothing'} does not exist" in capsys.readouterr().err


def test_report_verb_before_eval_says_so_and_writes_nothing(tmp_path, capsys):
    """A report with no evaluated policy compares nothing: exit 2 and a line saying so, not
    exit 0 and an empty page a script would publish as a result."""
    (tmp_path / "r").mkdir()
    Store(tmp_path / "r" / "store.duckdb").close()
    assert main(["report", str(tmp_path / "r")]) == 2
    assert "has no evaluation episodes yet" in capsys.readouterr().err
    assert not (tmp_path / "r" / "report").exists()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed "
                                    "(.ci/run installs Debian's chromium)")


def chromium(page: Path, tmp_path: Path, screenshot: Path | None = None) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, the console lines it printed), from headless
    Chromium offline; with `screenshot`, a 1200x2000 PNG of it there as well."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr",
             "--v=0", "--window-size=1200,2000"]
    if screenshot:
        subprocess.run(flags + [f"--screenshot={screenshot}", page.as_uri()], check=True,
                       capture_output=True, timeout=120)
    done = subprocess.run(flags + ["--dump-dom", page.as_uri()], check=True,
                          capture_output=True, text=True, timeout=120)
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_report_page_in_a_browser(run_dir, tmp_path):
    """What a person looks for: a table row per policy, one bar per policy in the chart, the
    training curves, no script errors; and a PNG that is neither blank nor tiny."""
    import matplotlib.image

    with Store(run_dir / "store.duckdb", read_only=True) as store:
        report = build_report(store, EvalConfig())
    page = write_report(run_dir, report)
    png = tmp_path / "report.png"
    dom, console = chromium(page, tmp_path, png)
    assert console == []
    policies = [p["policy"] for p in report["policies"]]
    rows = re.findall(r"<tr>(.*?)</tr>", dom, re.S)
    first_cells = [re.sub(r"<.*?>", "", re.split(r"</t[dh]>", r)[0]).strip() for r in rows]
    for policy in policies:
        assert policy in first_cells
    svgs = re.findall(r"<svg.*?</svg>", dom, re.S)
    assert len(svgs) == 3  # success chart, training curves, GRPO
    assert sorted(re.findall(r'<g id="(bar-\d+)"', svgs[0])) == [f"bar-{i}" for i in range(3)]
    for policy in policies:
        assert f">{policy}<" in svgs[0]  # each bar labelled
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[:2] == (2000, 1200)
    assert pixels[:, :, :3].std() > 0.05  # text, tables and charts, not an empty page


def tree_nodes() -> list[NodeRow]:
    """A root with two children (one a success, one invalid) and a grandchild; each node's
    action and observation name its stored id."""
    def node(i, parent, visits, value, **kw):
        nid = make_node_id(7, i)
        return node_row(7, i, parent, depth=0 if parent is None else 1 + (i == 3),
                        action=f"click[item {nid}]", observation=f"page <{nid}>",
                        visits=visits, value_sum=value, critic_score=0.5, **kw)
    return [node(0, None, 3, 1.5), node(1, 0, 2, 1.5, reward=1.0, terminal=True),
            node(2, 0, 1, 0.0, invalid=True), node(3, 1, 0, 0.0)]


@needs_chromium
def test_tree_page_in_a_browser(tmp_path):
    """The tree page draws a circle per node and, clicked, shows that node's action and
    observation (escaped), with no script errors."""
    from pipelines.treeview import render_html

    page = render_html(tree_nodes(), "task t007")
    click = ("<script>document.querySelectorAll('circle')[1]"
             ".dispatchEvent(new MouseEvent('click'));</script></body>")
    path = tmp_path / "tree.html"
    path.write_text(page.replace("</body>", click))
    dom, console = chromium(path, tmp_path)
    assert console == []
    circles = re.findall(r"<circle [^>]*>", dom)
    assert len(circles) == 4
    clicked = re.search(r'data-id="(\d+)"', circles[1]).group(1)
    assert [c for c in circles if 'class="sel"' in c] == [circles[1]]
    info = dom[dom.index('id="info"'):]
    assert f"node {clicked}</b>" in info
    assert f"click[item {clicked}]" in info and f"page &lt;{clicked}&gt;" in info  # escaped
