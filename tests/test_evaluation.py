"""Evaluation: the interval arithmetic (hand values, coverage, pairing), summaries, and the
eval stage for real (DuckDB, MiniShop, a tiny random model and a real LoRA adapter), with
resume after a crash."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from offline_agent.evaluation import (
    Episode,
    EvalConfig,
    bootstrap_ci,
    compare,
    mcnemar_exact,
    paired_difference,
    rates,
    summarize,
    wilson,
)
from offline_agent.types import Step, Trajectory
from pipelines.config import ConfigError, RunConfig
from pipelines.progress import Progress
from storage import EvalEpisodeRow, Store

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)


# ---- statistics -----------------------------------------------------------------------------
def test_wilson_hand_values():
    # p = 0.8, n = 10: centre (0.8 + z²/20) / (1 + z²/10), half z·sqrt(.016 + z²/400) / (1 + z²/10)
    assert wilson(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson(0, 20) == pytest.approx((0.0, 0.1611), abs=1e-4)
    lo, hi = wilson(20, 20)
    assert hi == 1.0 and lo == pytest.approx(1 - 0.1611, abs=1e-4)
    assert wilson(0, 0) is None
    with pytest.raises(ValueError, match="3 successes out of 2"):
        wilson(3, 2)


def test_mcnemar_exact_hand_values():
    # two-sided: 2 * P(Binomial(n, 1/2) <= min(wins, losses)), n = wins + losses
    assert mcnemar_exact(5, 0) == 2 / 32  # 2 * C(5,0) / 2^5
    assert mcnemar_exact(0, 10) == 2 / 1024
    assert mcnemar_exact(8, 2) == 2 * (1 + 10 + 45) / 1024  # 0.109375
    assert mcnemar_exact(2, 9) == 2 * (1 + 11 + 55) / 2048  # 0.0654296875, symmetric in sides
    assert mcnemar_exact(9, 2) == mcnemar_exact(2, 9)
    assert mcnemar_exact(3, 3) == 1.0 and mcnemar_exact(1, 0) == 1.0  # capped at 1
    assert mcnemar_exact(0, 0) == 1.0  # nothing discordant: no evidence either way
    assert mcnemar_exact(600, 400) < 1e-9  # big n: exact integers, no overflow
    with pytest.raises(ValueError, match="negative"):
        mcnemar_exact(-1, 2)


def test_intervals_cover_the_truth_about_95_percent_of_the_time():
    """200 seeded samples of 60 tasks (success p=0.3, reward uniform): each interval holds
    the true value in 90-99% of them. Too narrow or too wide an interval fails this."""
    rng = np.random.default_rng(7)
    hits_wilson = hits_boot = 0
    for i in range(200):
        wins = int((rng.random(60) < 0.3).sum())
        lo, hi = wilson(wins, 60)
        hits_wilson += lo <= 0.3 <= hi
        lo, hi = bootstrap_ci(rng.random(60), samples=1000, seed=i)
        hits_boot += lo <= 0.5 <= hi
    assert 180 <= hits_wilson <= 198
    assert 180 <= hits_boot <= 198


def test_bootstrap_is_seeded_and_exact_on_constants():
    values = [0.1, 0.9, 0.4, 0.4, 1.0, 0.0]
    assert bootstrap_ci(values, seed=1) == bootstrap_ci(values, seed=1)
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)
    assert bootstrap_ci([0.5] * 9) == (0.5, 0.5)
    assert bootstrap_ci([]) is None


def test_bootstrap_ratio_pools_steps_per_episode():
    """invalid / steps resampled by episode: ten 1-step episodes all invalid, ten 9-step ones
    all valid. The interval is around the pooled rate 10/100, not the mean of the
    per-episode rates (0.5)."""
    invalid, steps = [1] * 10 + [0] * 10, [1] * 10 + [9] * 10
    lo, hi = bootstrap_ci(invalid, steps)
    assert lo < 0.1 < hi < 0.3
    assert bootstrap_ci(invalid, [1] * 20) == bootstrap_ci(invalid)  # weights 1: the mean
    with pytest.raises(ValueError, match="weights must be positive"):
        bootstrap_ci([1, 0], [1, 0])


def test_paired_interval_sees_a_small_gain_an_unpaired_one_misses():
    """Tasks vary a lot (difficulty), the policy adds +0.05 on each: paired, the interval
    excludes 0; the spread of the policy's own mean is far wider than the gain."""
    rng = random.Random(0)
    base = [rng.random() for _ in range(50)]
    policy = [b + 0.05 + rng.uniform(-0.02, 0.02) for b in base]
    mean, (lo, hi) = paired_difference(policy, base, seed=0)
    assert mean == pytest.approx(np.mean(policy) - np.mean(base))
    assert 0.04 < lo <= mean <= hi < 0.06  # the gain, well clear of 0
    plo, phi = bootstrap_ci(policy, seed=0)
    assert phi - plo > 5 * (hi - lo)
    with pytest.raises(ValueError, match="differ in length"):
        paired_difference([1.0], [1.0, 0.0])


# ---- summaries ------------------------------------------------------------------------------
def ep(task: str, reward: float, steps: int = 2, invalid: int = 0) -> Episode:
    return Episode(task, reward, reward >= 1, steps, invalid)


def test_summarize_and_compare_on_hand_made_episodes():
    cfg = EvalConfig(bootstrap=500)
    base = [ep("a", 1.0, 2, 1), ep("b", 0.5, 6), ep("c", 0.0, 4, 2)]
    s = summarize(base, cfg)
    assert s["n_tasks"] == 3 and s["success_rate"] == round(1 / 3, 4)
    assert s["mean_reward"] == 0.5 and s["mean_steps"] == 4.0
    assert s["invalid_rate"] == 0.25  # 3 invalid of 12 steps, pooled
    assert s["ci95"] == [round(x, 4) for x in wilson(1, 3)]
    assert s["mean_reward_ci95"][0] <= 0.5 <= s["mean_reward_ci95"][1]
    # the policy played a, b and d: compared on a and b only
    d = compare([ep("a", 1.0), ep("b", 1.0), ep("d", 0.0)], base, cfg)
    assert d["n_tasks"] == 2 and d["success_rate"] == 0.5 and d["mean_reward"] == 0.25
    assert d["ci95"] == [0.0, 1.0]
    # b: only the policy solved it; a: both did; so one win, no loss
    assert (d["wins"], d["losses"], d["mcnemar_p"]) == (1, 0, 1.0)
    assert d["configs_tried"] == 1
    tried = compare([ep(t, 0.0) for t in "abc"], base, EvalConfig(bootstrap=500,
                                                                  configs_tried=7))
    assert (tried["wins"], tried["losses"], tried["configs_tried"]) == (0, 1, 7)
    empty = summarize([], cfg)
    assert empty["n_tasks"] == 0 and empty["success_rate"] is None and empty["ci95"] is None
    assert compare([], base, cfg)["ci95"] is None


def test_episode_from_a_stored_row():
    row = EvalEpisodeRow(policy="base", mode="greedy", task_id="t", reward=0.75, success=False,
                         steps=[{"action": a, "invalid": bad} for a, bad in
                                [("x", True), ("y", False), ("z", False)]])
    assert Episode.from_row(row) == Episode("t", 0.75, False, 3, 1, ("x", "y", "z"))


def test_changed_episodes_count_tasks_whose_actions_differ_from_base():
    """Same success, other actions: the change shows here before it shows in success."""
    cfg = EvalConfig(bootstrap=200)
    base = [Episode("a", 0.0, False, 2, 0, ("search[x]", "buy")),
            Episode("b", 0.0, False, 1, 0, ("buy",)), Episode("c", 1.0, True, 1, 0, ("done",))]
    same = compare(base, base, cfg)
    assert (same["changed"], same["changed_rate"], same["success_rate"]) == (0, 0.0, 0.0)
    other = [Episode("a", 0.0, False, 2, 0, ("search[y]", "buy")), base[1],
             Episode("c", 1.0, True, 2, 0, ("done", "done"))]
    moved = compare(other, base, cfg)
    assert (moved["changed"], moved["changed_rate"], moved["success_rate"]) == (2, 0.6667, 0.0)
    low, high = moved["changed_ci95"]
    assert 0 < low < 0.6667 < high < 1
    assert compare([], base, cfg)["changed_rate"] is None


def test_episode_from_a_trajectory_and_the_rates_the_summary_shares():
    steps = [Step("x", "y", invalid=True), Step("x", "y"), Step("x", "y", done=True)]
    played = Trajectory("t", "math", "do it", "", steps, reward=1.0)
    assert Episode.from_trajectory(played) == Episode("t", 1.0, True, 3, 1, ("x", "x", "x"))
    base = [ep("a", 1.0, 2, 1), ep("b", 0.5, 6), ep("c", 0.0, 4, 2)]
    assert rates(base) == {"n_tasks": 3, "success_rate": round(1 / 3, 4), "mean_reward": 0.5,
                           "invalid_rate": 0.25, "mean_steps": 4.0}
    summary = summarize(base, EvalConfig(bootstrap=500))
    assert {k: summary[k] for k in rates(base)} == rates(base)  # one computation, two views
    assert rates([]) == {"n_tasks": 0, "success_rate": None, "mean_reward": None,
                         "invalid_rate": None, "mean_steps": None}


def test_eval_config_section():
    cfg = RunConfig.load(None, ["eval.bootstrap=500"])
    assert cfg.eval.bootstrap == 500
    assert cfg.hash(["eval"]) == RunConfig().hash(["eval"])  # only shapes the report
    with pytest.raises(ConfigError, match="eval.bootstrap must be >= 100"):
        RunConfig.load(None, ["eval.bootstrap=10"])
    assert RunConfig.load(None, ["eval.configs_tried=4"]).hash(["eval"]) == RunConfig().hash(
        ["eval"])  # a count for the reader, not a setting of the episodes
    with pytest.raises(ConfigError, match="configs_tried must be >= 1"):
        RunConfig.load(None, ["eval.configs_tried=0"])


# ---- the stage, for real ----------------------------------------------------------------------
CONFIG = """\
run: {{name: eval, seed: 0}}
model: {{id: {model}, device: cpu, max_batch: 8}}
env: {{name: minishop, kwargs: {{max_steps: 3}}, train_tasks: 1, test_tasks: 3}}
search: {{simulations: 1, k: 2, max_depth: 2, trees_per_batch: 1}}
"""


def make_adapter(model_dir: str, out: Path) -> None:
    """A real PEFT LoRA adapter on the tiny model, B not zero so it changes the policy."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out)


@pytest.fixture
def trained_run(tmp_path, tiny_model_dir) -> tuple[RunConfig, Path]:
    """A run through search, then one adapter recorded as the train stage records it."""
    from pipelines.runner import run
    from pipelines.stages import STAGES

    (tmp_path / "cfg.yaml").write_text(CONFIG.format(model=tiny_model_dir))
    cfg = RunConfig.load(tmp_path / "cfg.yaml")
    run_dir = tmp_path / "run"
    run(cfg, run_dir, STAGES, until="search")
    make_adapter(tiny_model_dir, run_dir / "checkpoints" / "train" / "dpo_step" / "final")
    with Store(run_dir / "store.duckdb") as store:
        store.set_checkpoint("train", "", "dpo_step/final",
                             {"folder": "checkpoints/train/dpo_step/final", "step": 2})
    return cfg, run_dir


def test_eval_stage_plays_base_and_adapter_and_resumes(trained_run, monkeypatch, capsys):
    from pipelines.runner import run
    from pipelines.stages import STAGES

    cfg, run_dir = trained_run
    inserted = []
    real_insert = Store.insert_eval_episodes

    def crash_after_four(self, rows, stage):
        if len(inserted) == 4:
            raise KeyboardInterrupt  # killed mid-policy: base done, adapter 1 of 3
        inserted.extend(r.task_id for r in rows)
        real_insert(self, rows, stage)

    monkeypatch.setattr(Store, "insert_eval_episodes", crash_after_four)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, run_dir, STAGES, until="eval")
    with Store(run_dir / "store.duckdb") as store:
        first = store.eval_episodes()
        assert store.stage("eval").status == "interrupted"  # a Ctrl-C, not a failure
    assert [(r.policy, r.task_id) for r in first][:3] == [
        ("base", t) for t in ("minishop-test-00000", "minishop-test-00001",
                              "minishop-test-00002")]
    assert len(first) == 4

    monkeypatch.setattr(Store, "insert_eval_episodes", real_insert)
    updates, real_update = [], Progress.update

    def spy(self, **counters):
        updates.append(counters)
        real_update(self, **counters)

    monkeypatch.setattr(Progress, "update", spy)
    results = run(cfg, run_dir, STAGES)
    with Store(run_dir / "store.duckdb") as store:
        rows = store.eval_episodes()
        of_eval = store.eval_episodes(stage="eval")
    assert len(rows) == 6 and rows[:4] == first  # resumed: nothing replayed or changed
    # the resumed stage's first word to `offline-agent status`: where it stands, before playing
    assert next(u for u in updates if "policy" in u) == {"policy": "dpo_step",
                                                         "episodes_done": 4, "episodes": 6}
    assert {r.policy for r in rows} == {"base", "dpo_step"}
    assert rows == of_eval and all(r.mode == "greedy" and r.steps for r in rows)
    base_actions = [[s["action"] for s in r.steps] for r in rows if r.policy == "base"]
    lora_actions = [[s["action"] for s in r.steps] for r in rows if r.policy != "base"]
    assert base_actions != lora_actions  # the adapter was applied
    stats = results["eval"]["stats"]
    assert stats["base"]["n_tasks"] == 3 and stats["dpo_step"]["n_tasks"] == 3
    out = capsys.readouterr().out
    assert "dpo_step" in out and "vs base (paired)" in out  # the report's table
    assert (run_dir / "report" / "index.html").is_file()


def test_eval_stage_refuses_a_missing_adapter(tmp_path, tiny_model_dir):
    from pipelines.runner import run
    from pipelines.stages import STAGES

    (tmp_path / "cfg.yaml").write_text(CONFIG.format(model=tiny_model_dir))
    cfg = RunConfig.load(tmp_path / "cfg.yaml")
    run(cfg, tmp_path / "run", STAGES, until="search")
    with Store(tmp_path / "run" / "store.duckdb") as store:
        store.set_checkpoint("train", "", "rft/final", {"folder": str(tmp_path / "gone")})
    with pytest.raises(FileNotFoundError, match="policy 'rft'.*holds no adapter_config.json"):
        run(cfg, tmp_path / "run", STAGES, until="eval")


@pytest.mark.parametrize("commit", ["path", "step"])
def test_search_at_inference_is_stored_per_task_and_resumes(trained_run, monkeypatch, commit):
    """eval.mcts on 2 of the 3 test tasks, in the mcts stage after eval: killed after base's
    first searched task, the resumed stage searches only base's second, then the adapter's
    two; no greedy episode is played again."""
    import offline_agent.search.inference as inference
    from pipelines.runner import run
    from pipelines.stages import STAGES

    cfg, run_dir = trained_run
    cfg = RunConfig.from_dict({**cfg.to_dict(), "eval": {"mcts": True, "mcts_simulations": 2,
                                                         "mcts_tasks": 2, "mcts_commit": commit}})
    searched, real_search = [], inference.search_and_commit

    def spy(policy, make_env, tasks, searcher, batch_size, on_done, *, commit):
        searched.append([t.id for t in tasks])
        assert not searcher.cfg.verifier and searcher.cfg.simulations == 2
        return real_search(policy, make_env, tasks, searcher, batch_size, on_done,
                           commit=commit)

    inserted, real_insert = [], Store.insert_eval_episodes

    def crash_on_the_eighth(self, rows, stage):
        if len(inserted) == 7:  # eval: base and dpo_step, 3 greedy each; mcts: base's first
            raise KeyboardInterrupt
        inserted.extend((r.policy, r.mode, r.task_id) for r in rows)
        real_insert(self, rows, stage)

    monkeypatch.setattr(inference, "search_and_commit", spy)
    monkeypatch.setattr(Store, "insert_eval_episodes", crash_on_the_eighth)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, run_dir, STAGES, until="mcts")
    assert [r[1] for r in inserted] == ["greedy"] * 6 + ["mcts"]
    assert inserted[6] == ("base", "mcts", "minishop-test-00000")
    monkeypatch.setattr(Store, "insert_eval_episodes", real_insert)
    results = run(cfg, run_dir, STAGES, until="mcts")
    first, second = "minishop-test-00000", "minishop-test-00001"
    assert searched == [[first, second], [second], [first, second]]
    with Store(run_dir / "store.duckdb") as store:
        rows = store.eval_episodes(mode="mcts")
    assert [(r.policy, r.task_id) for r in rows] == [
        ("base", first), ("base", second), ("dpo_step", first), ("dpo_step", second)]
    assert results["eval"]["status"] == "skipped"  # done before the crash: nothing replayed
    stats = results["mcts"]["stats"]
    assert stats["base+mcts"]["n_tasks"] == 2 and stats["critic"] == "frozen"
    simulations = stats["dpo_step+mcts"]["search"]["simulations"]
    if commit == "path":  # 2 per task
        assert simulations == 4
    else:  # 2 per committed step: at least one step per task
        assert simulations >= 4 and simulations % 2 == 0


def test_search_at_inference_is_chosen_after_eval_without_replaying_greedy(trained_run):
    """eval.mcts's keys shape only the mcts stage: turned on (and changed) after a finished
    eval, nothing greedy is refused, cleared or played again; `best` is the policy best on
    the validation tasks, and an unknown name is an error naming what was evaluated."""
    from pipelines.errors import RunError
    from pipelines.headlines import headline
    from pipelines.runner import run
    from pipelines.stages import STAGES

    cfg, run_dir = trained_run
    run(cfg, run_dir, STAGES, until="mcts")
    with Store(run_dir / "store.duckdb") as store:
        greedy = store.eval_episodes()
        final = store.checkpoint("train", "", "dpo_step/final")
        store.set_checkpoint("train", "", "dpo_step/final", {**final, "selected": {
            "step": 2, "candidates": [{"step": 2, "success_rate": 0.5, "mean_reward": 0.6}]}})
    mcts = {"mcts": True, "mcts_tasks": 1, "mcts_policies": ["best"]}
    cfg = RunConfig.from_dict({**cfg.to_dict(), "eval": mcts})
    results = run(cfg, run_dir, STAGES, until="mcts")
    assert results["eval"]["status"] == "skipped"
    assert list(results["mcts"]["stats"]) == ["dpo_step+mcts", "critic"]
    assert headline("mcts", results["mcts"]["stats"]).startswith(  # what status shows
        "search at inference on 1 test tasks (frozen critic): dpo_step+mcts ")
    with Store(run_dir / "store.duckdb") as store:
        assert [r for r in store.eval_episodes() if r.mode == "greedy"] == greedy
        assert [(r.policy, r.task_id) for r in store.eval_episodes(mode="mcts")] == [
            ("dpo_step", "minishop-test-00000")]
    cfg = RunConfig.from_dict({**cfg.to_dict(), "eval": {**mcts, "mcts_policies": ["rft"]}})
    with pytest.raises(RunError, match="names 'rft', which this run has not evaluated; "
                                       "evaluated: base, dpo_step"):
        run(cfg, run_dir, STAGES, until="mcts", force=True)
    with Store(run_dir / "store.duckdb") as store:
        assert [r for r in store.eval_episodes() if r.mode == "greedy"] == greedy


def test_search_at_inference_takes_the_learned_critic_only_where_one_was_fitted(tmp_path):
    """search.critic learned: eval.mcts values leaves with the round's fitted value model,
    and refuses to fall back silently to the frozen one where none was fitted."""
    from types import SimpleNamespace

    from offline_agent.envs.base import load_env
    from offline_agent.search.frozen_critic import FrozenCritic
    from pipelines.errors import RunError
    from pipelines.play import inference_critic

    env = load_env("minishop", seed=0, max_steps=3)
    with Store(tmp_path / "store.duckdb") as store:
        ctx = SimpleNamespace(cfg=RunConfig.from_dict({}), store=store, run_dir=tmp_path, round=1)
        assert isinstance(inference_critic(ctx, None, env), FrozenCritic)
        ctx.cfg = RunConfig.from_dict({"search": {"critic": "learned"}})
        with pytest.raises(RunError, match="'critic' has fitted no critic"):
            inference_critic(ctx, None, env)
