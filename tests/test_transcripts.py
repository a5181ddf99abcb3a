"""The report's episodes of what changed: which tasks each side shows, and what a
transcript holds (pipelines/transcripts.py), on a page too."""

from __future__ import annotations

from offline_agent.evaluation import EvalConfig
from pipelines.report import build_report, write_report
from pipelines.transcripts import OBSERVATION_CHARS, PER_SIDE, transcripts
from storage import EvalEpisodeRow, Store
from tests.test_report import fill


def row(policy: str, task: str, success: bool, mode: str = "greedy",
        observation: str = "page") -> EvalEpisodeRow:
    steps = [{"action": f"search[{task}]", "observation": observation, "reward": 0.0,
              "invalid": not success},
             {"action": "buy", "observation": "bought", "reward": float(success),
              "invalid": False}]
    return EvalEpisodeRow(policy=policy, mode=mode, task_id=task, steps=steps,
                          reward=1.0 if success else 0.0, success=success)


def test_wins_and_losses_in_task_order_with_both_episodes():
    base = [row("base", f"t{i}", i in (0, 5, 6)) for i in range(8)]
    policy = [row("dpo", f"t{i}", i in (1, 2, 3, 4, 7) or i == 0) for i in range(8)]
    other = [row("dpo", "t1", False, mode="mcts")]  # not greedy: not shown
    out = transcripts(base + policy + other, {"t1": "buy a lamp"})
    assert set(out) == {"dpo"}
    dpo = out["dpo"]
    assert (dpo["n_wins"], dpo["n_losses"]) == (5, 2)
    assert [t["task_id"] for t in dpo["wins"]] == ["t1", "t2", "t3"][:PER_SIDE]
    assert [t["task_id"] for t in dpo["losses"]] == ["t5", "t6"]
    win = dpo["wins"][0]
    assert win["instruction"] == "buy a lamp"
    assert win["policy"]["success"] and not win["base"]["success"]
    assert win["policy"]["steps"][0] == {"action": "search[t1]", "observation": "page",
                                         "reward": 0.0, "invalid": False}
    assert win["base"]["steps"][0]["invalid"] and win["base"]["reward"] == 0.0


def test_long_observations_are_cut_and_no_base_means_nothing_to_show():
    long = row("base", "t0", False, observation="x" * (OBSERVATION_CHARS + 10))
    shown = transcripts([long, row("p", "t0", True)], {})["p"]["wins"][0]["base"]
    assert shown["steps"][0]["observation"].endswith("[... 10 more characters]")
    assert transcripts([row("p", "t0", True)], {}) == {"p": {"n_wins": 0, "n_losses": 0,
                                                             "wins": [], "losses": []}}


def test_report_json_and_page_show_the_transcripts(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        fill(store)
        report = build_report(store, EvalConfig(bootstrap=500))
    step = report["transcripts"]["dpo_step"]  # even tasks solved, base every fourth
    assert (step["n_wins"], step["n_losses"]) == (10, 0)
    assert [t["task_id"] for t in step["wins"]] == ["t002", "t006", "t010"]
    assert report["transcripts"]["rft"]["n_wins"] == 1
    html = write_report(tmp_path, report).read_text()
    assert "<b>dpo_step</b> solved where base failed (3 of 10 shown)" in html
    assert "<b>rft</b> failed where base solved (0 of 0 shown)" in html
    assert html.count("<summary>t002: buy</summary>") == 1
