"""The report's Diagnostics (pipelines/diagnostics.py) on real DuckDB stores: a healthy run
is green on every line, a run built to fail trips each line red, an empty one judges
nothing; and the section on the page."""

from __future__ import annotations

import re

import pytest

from offline_agent.evaluation import EvalConfig
from offline_agent.types import Task
from pipelines.diagnostics import LOOP_RUN, diagnose, longest_run
from pipelines.report import build_report, write_report
from pipelines.report_table import diagnostics_text
from storage import EvalEpisodeRow, MetricRow, Store
from tests.test_report import chromium, needs_chromium

N = 10  # episodes per policy


def step(action: str, tool: str | None = None, invalid: bool = False, observation: str = "ok",
         truncated: bool = False) -> dict:
    return {"action": action, "observation": observation, "reward": 0.0, "done": truncated,
            "invalid": invalid, "info": {"truncated": True} if truncated else {},
            "tool_call": {"name": tool, "arguments": {}} if tool else None}


def healthy(policy: str) -> list[EvalEpisodeRow]:
    """Search, click, buy: no loop, valid calls spread over three tools, some reward."""
    steps = [step("search[lamp]", "search"), step("click[P1]", "click"), step("buy", "buy")]
    return [EvalEpisodeRow(policy=policy, mode="greedy", task_id=f"t{i}", steps=steps,
                           reward=1.0 if i % 2 else 0.5, success=bool(i % 2)) for i in range(N)]


def broken(policy: str) -> list[EvalEpisodeRow]:
    """Every episode: an unknown tool called LOOP_RUN times in a row, two unparseable
    replies, then search twice, cut by the step limit, reward 0."""
    unknown = step("frobnicate[x]", invalid=True,
                   observation="Invalid action: unknown tool 'frobnicate'; available: search")
    garbage = step("I think I should", invalid=True,
                   observation="Invalid action: no tool call found; write one of: search[q]")
    steps = [unknown] * LOOP_RUN + [garbage] * 2 + [step("search[a]", "search"),
                                                   step("search[b]", "search", truncated=True)]
    return [EvalEpisodeRow(policy=policy, mode="greedy", task_id=f"t{i}", steps=steps,
                           reward=0.0, success=False) for i in range(N)]


def grpo_metrics(tied: int, kl: list[float], entropy: list[float], clip: float) -> list:
    return [MetricRow("grpo", s + 1, {"tied_groups": tied, "kl": k, "entropy": e,
                                      "clip_fraction": clip, "reward_mean": 0.3})
            for s, (k, e) in enumerate(zip(kl, entropy))]


def fill(store: Store, bad: bool) -> None:
    store.insert_tasks([Task(f"t{i}", "minishop", "buy", "test") for i in range(N)], "tasks")
    store.record_run({"grpo": {"tasks_per_step": 4}})
    store.insert_eval_episodes(healthy("base"), "eval")
    store.insert_eval_episodes((broken if bad else healthy)("dpo_step"), "eval")
    rising = [0.01 * s for s in range(6)]
    store.insert_metrics(grpo_metrics(3, [1.0 + k for k in rising], [2.0, 2, 2, 0.5, 0.4, 0.3],
                                      0.35) if bad else
                         grpo_metrics(1, rising, [2.0, 2, 2, 1.9, 1.8, 1.8], 0.05), "grpo")
    store.set_checkpoint("train", "", "dpo_step/final", {
        "folder": "x", "step": 4, "trained_tokens": 500, "agent_tokens": 480 if bad else 500})


def lines(tmp_path, bad: bool | None) -> dict[str, dict]:
    with Store(tmp_path / "store.duckdb") as store:
        if bad is not None:
            fill(store, bad)
        return {d["check"]: d for d in diagnose(store)}


CHECKS = ["reward_zero", "step_limit", "loops", "unknown_tool", "format", "invalid",
          "tool_share", "grpo_tied", "grpo_kl", "grpo_entropy", "grpo_clip", "mask"]


def test_a_healthy_run_is_green_on_every_line(tmp_path):
    got = lines(tmp_path, bad=False)
    assert list(got) == CHECKS
    assert {c: d["ok"] for c, d in got.items()} == dict.fromkeys(CHECKS, True)
    assert got["reward_zero"]["figure"] == "0.0% (0 of 10 episodes, base)"
    assert got["tool_share"]["detail"].startswith("base: search 33.3%, click 33.3%, buy 33.3%")
    assert got["grpo_tied"]["value"] == pytest.approx(6 / 24)
    assert got["mask"]["figure"] == "100.0% (500 of 500 tokens)"


def test_a_broken_run_trips_each_line(tmp_path):
    got = lines(tmp_path, bad=True)
    assert {c: d["ok"] for c, d in got.items()} == dict.fromkeys(CHECKS, False)
    values = {c: d["value"] for c, d in got.items()}
    assert values["reward_zero"] == values["step_limit"] == values["loops"] == 1.0
    assert values["unknown_tool"] == 4 / 8 and values["format"] == 2 / 8
    assert values["invalid"] == 6 / 8 and values["tool_share"] == 1.0
    assert values["grpo_tied"] == 3 / 4 and values["grpo_clip"] == pytest.approx(0.35)
    assert values["grpo_entropy"] == pytest.approx(0.4)  # mean of the last three steps
    assert values["mask"] == 480 / 500
    # the worst policy decides, every policy is listed
    assert got["invalid"]["figure"] == "75.0% (60 of 80 steps, dpo_step)"
    assert got["invalid"]["detail"] == "base 0.0% (0/30), dpo_step 75.0% (60/80)"
    assert got["tool_share"]["figure"] == "100.0% search (dpo_step)"


def test_an_empty_run_judges_nothing(tmp_path):
    got = lines(tmp_path, bad=None)
    assert list(got) == CHECKS and all(d["ok"] is None for d in got.values())
    assert diagnostics_text(list(got.values())) == ("diagnostics: 0 of 0 judged checks past "
                                                    "their threshold")
    assert got["mask"]["figure"] == "no trained policy yet"
    assert got["grpo_kl"]["figure"] == "no GRPO steps in this run"


def test_validation_episodes_and_older_trainings_are_not_judged(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        store.insert_tasks([Task(f"t{i}", "minishop", "buy", "val") for i in range(N)], "tasks")
        store.insert_eval_episodes(broken("dpo_step/step-2"), "train")  # validation only
        store.set_checkpoint("train", "", "rft/final", {"folder": "x", "step": 4})
        got = {d["check"]: d for d in diagnose(store)}
    assert got["invalid"]["ok"] is None
    assert got["mask"]["ok"] is None and "not recorded" in got["mask"]["figure"]


def test_longest_run():
    assert longest_run([]) == (0, "")
    assert longest_run(["a", "b ", "b", "b", "a", "a"]) == (3, "b")


def test_the_section_on_the_page_and_in_report_json(tmp_path):
    with Store(tmp_path / "store.duckdb") as store:
        fill(store, bad=True)
        report = build_report(store, EvalConfig(bootstrap=500))
    assert [d["check"] for d in report["diagnostics"]] == CHECKS
    assert diagnostics_text(report["diagnostics"]).startswith(
        "diagnostics: 12 of 12 judged checks past their threshold: reward_zero, step_limit, ")
    html = write_report(tmp_path, report).read_text()
    section = html[html.index("<h2>Diagnostics</h2>"):]
    assert section.count("class='mark bad'") == len(CHECKS)
    assert "12 of 12 checks past their threshold" in section
    assert "<td>calls to tools that do not exist</td><td>50.0% (40 of 80 steps" in section


@needs_chromium
def test_the_section_in_a_browser(tmp_path):
    """Rendered by Chromium: one row per check, each red in a broken run, the transcripts
    folded, no script errors; the PNG is not blank."""
    import matplotlib.image

    with Store(tmp_path / "store.duckdb") as store:
        fill(store, bad=True)
        report = build_report(store, EvalConfig(bootstrap=500))
    page = write_report(tmp_path, report)
    png = tmp_path / "report.png"
    dom, console = chromium(page, tmp_path, png)
    assert console == []
    section = dom[dom.index(">Diagnostics</h2>"):dom.index(">Success by policy</h2>")]
    assert len(re.findall(r'<td class="mark bad">', section)) == len(CHECKS)
    assert "<summary><b>dpo_step</b> failed where base solved (3 of 5 shown)</summary>" in dom
    pixels = matplotlib.image.imread(png)
    assert pixels[:, :, :3].std() > 0.05
