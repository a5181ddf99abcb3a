"""The train stage for real: a DuckDB store, the tiny random model, SIGKILL and resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import RunConfig
from pipelines.runner import run
from pipelines.stages import STAGES
from storage import ExampleRow, MetricRow, PairRow, Store
from tests.test_training import step_pair, trajectory_pair

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

TRAIN = [s for s in STAGES if s.name == "train"]


def config(model_dir: str, **train) -> dict:
    return {"model": {"id": model_dir, "device": "cpu"},
            "train": {"warmup_steps": 0, "lr": 3e-3, "save_every": 100, **train}}


def make_run(run_dir: Path, n_step: int = 4, trajectory: bool = False, rft: bool = False) -> None:
    """A run directory whose store holds mined data, written as mining writes it."""
    run_dir.mkdir(parents=True)
    rows = [PairRow(**step_pair(i), task_id=f"t{i}", env="minishop", kind="step",
                    chosen_q=0.8, rejected_q=0.1, margin=0.7) for i in range(n_step)]
    if trajectory:
        rows.append(PairRow(**trajectory_pair(), task_id="t9", env="minishop",
                            kind="trajectory"))
    with Store(run_dir / "store.duckdb") as store:
        store.insert_pairs(rows, "mine")
        if rft:
            pair = trajectory_pair()
            store.insert_examples([ExampleRow(
                example_id=1, task_id="t9", env="minishop", kind="rft",
                instruction="i need a blue power bank under 50 dollars",
                messages=pair["prompt"] + pair["chosen"], reward=1.0)], stage="mine")


def losses(run_dir: Path, policy: str) -> dict[int, float]:
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        return {r.step: r.data["loss"] for r in store.metrics("train", policy)}


def test_train_stage_trains_each_policy_records_checkpoints_and_skips_when_done(
        tiny_model_dir, tmp_path):
    make_run(tmp_path / "r", trajectory=True, rft=True)
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=2, batch_size=2,
                                     policies=["rft", "dpo_outcome", "dpo_step_outcome"]))
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]
    assert set(stats) == {"rft", "dpo_outcome", "dpo_step_outcome"}
    assert stats["dpo_step_outcome"]["items"] == 5 and stats["dpo_outcome"]["items"] == 1
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        for policy in stats:
            final = store.checkpoint("train", "", f"{policy}/final")
            assert (tmp_path / "r" / final["folder"] / "adapter_model.safetensors").exists()
            assert [r.step for r in store.metrics("train", policy)] == list(
                range(1, final["step"] + 1))
        data = store.metrics("train", "dpo_step_outcome")[0].data
        card = (tmp_path / "r" / final["folder"] / "README.md").read_text()
        assert f"trained on offline-agent run `{store.run_id}`" in card
    assert {"loss", "margin", "accuracy", "lr", "tokens_per_s"} <= set(data)
    again = run(cfg, tmp_path / "r", TRAIN)["train"]
    assert again["status"] == "skipped"


def bar_states(err: str, desc: str) -> list[str]:
    """The states a tqdm bar named `desc` drew on stderr (each redraw starts with a carriage
    return), in order."""
    return [s.strip() for s in err.replace("\n", "\r").split("\r") if s.startswith(desc + ":")]


def test_each_policy_shows_a_bar_of_its_steps_with_the_loss(tiny_model_dir, tmp_path,
                                                            capsys):
    """What a person sees while train runs: per policy, a bar of its optimizer steps out of the
    total, each step's loss and elapsed<remaining time; progress.json holds step and steps."""
    import re

    from pipelines.progress import read_progress

    make_run(tmp_path / "r", rft=True)  # 4 step pairs: 2 steps of 2; 1 RFT example: 1 step
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=2, batch_size=2,
                                     policies=["rft", "dpo_step"]))
    run(cfg, tmp_path / "r", TRAIN)
    err = capsys.readouterr().err
    for policy, total in (("rft", 1), ("dpo_step", 2)):
        states = bar_states(err, f"train {policy}")
        shown = [re.search(r"\| (\d+)/(\d+) \[(.*)\]$", s).groups() for s in states]
        assert {int(t) for _, t, _ in shown} == {total}
        last = {int(n): tail for n, _, tail in shown}  # a step's last redraw, in step order
        assert list(last) == list(range(total + 1))
        for n in range(1, total + 1):  # after each step: elapsed<remaining, rate, its loss
            assert re.fullmatch(r"\d\d:\d\d<\d\d:\d\d, .*step.*, loss=-?\d+\.\d{4}", last[n])
            assert last[n].endswith(f"loss={losses(tmp_path / 'r', policy)[n]:.4f}")
    counters = read_progress(tmp_path / "r")["counters"]
    assert (counters["policy"], counters["step"], counters["steps"]) == ("dpo_step", 2, 2)


def test_a_policy_without_data_is_skipped_with_the_reason(tiny_model_dir, tmp_path):
    make_run(tmp_path / "r", n_step=2)
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=1, policies=["dpo_outcome"]))
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]
    assert stats["dpo_outcome"]["skipped"] == (
        "no training data: no trajectory pairs were mined, as no train task has both a solved "
        "and a failed episode")


def test_a_grpo_init_without_data_stops_train_before_it_trains_anything(tiny_model_dir,
                                                                         tmp_path):
    """Mining left dpo_step nothing to train on: the train stage names grpo.init at once,
    not after training the other policies, for grpo to stop on it two stages later."""
    from pipelines.errors import RunError

    make_run(tmp_path / "r", n_step=0, trajectory=True, rft=True)
    cfg = RunConfig.from_dict({**config(tiny_model_dir, max_steps=1,
                                        policies=["rft", "dpo_step"]),
                               "grpo": {"enabled": True, "init": "dpo_step"}})
    with pytest.raises(RunError, match="grpo.init=dpo_step, but stage train cannot train "
                                       "'dpo_step', no training data: no step pairs were mined"):
        run(cfg, tmp_path / "r", TRAIN)
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert store.checkpoint("train", "", "rft/final") is None  # nothing trained
        assert store.stage("train").status == "failed"
    fixed = RunConfig.from_dict({**cfg.to_dict(), "grpo": {**cfg.to_dict()["grpo"],
                                                           "init": "rft"}})
    stats = run(fixed, tmp_path / "r", TRAIN)["train"]["stats"]  # train reads no grpo key
    assert "step" in stats["rft"] and "no step pairs" in stats["dpo_step"]["skipped"]


def test_resume_after_sigkill_continues_at_the_saved_step_with_the_same_next_loss(
        tiny_model_dir, tmp_path):
    settings = config(tiny_model_dir, policies=["dpo_step"], batch_size=2, max_steps=4,
                      save_every=2)
    for name in ("killed", "whole"):
        make_run(tmp_path / name)
    script = ("import json, os, signal, sys\nfrom pipelines.config import RunConfig\n"
              "from pipelines.runner import run\nfrom pipelines.stages import STAGES\n"
              "from offline_agent.training import trainer\n"
              "trainer.after_step = lambda step: step == 3 and os.kill(os.getpid(), "
              "signal.SIGKILL)\n"
              "run(RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], "
              "[s for s in STAGES if s.name == 'train'])\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(settings),
                           str(tmp_path / "killed")], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).parent.parent)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    with Store(tmp_path / "killed" / "store.duckdb", read_only=True) as store:
        saved = store.checkpoint("train", "", "dpo_step")
        assert store.checkpoint("train", "", "dpo_step/final") is None
    assert saved["step"] == 2 and saved["folder"].endswith("step-2")
    killed = losses(tmp_path / "killed", "dpo_step")
    assert sorted(killed) == [1, 2, 3]  # step 3 ran, but after the last checkpoint
    with Store(tmp_path / "killed" / "store.duckdb") as store:  # a mark a restart would erase
        store.insert_metrics([MetricRow("dpo_step", 1, {"loss": -1.0})], "train")

    cfg = RunConfig.from_dict(settings)
    run(cfg, tmp_path / "killed", TRAIN)  # resumes from step-2
    run(cfg, tmp_path / "whole", TRAIN)
    resumed, whole = losses(tmp_path / "killed", "dpo_step"), losses(tmp_path / "whole", "dpo_step")
    assert sorted(resumed) == [1, 2, 3, 4] and resumed[1] == -1.0  # steps 1-2 not redone
    assert whole[3] != whole[2]  # the loss moves, so equality below means something
    assert resumed[3] == pytest.approx(whole[3], rel=1e-6, abs=1e-7)
    assert resumed[4] == pytest.approx(whole[4], rel=1e-6, abs=1e-7)
    assert killed[3] == pytest.approx(whole[3], rel=1e-6, abs=1e-7)


def test_adapter_folders_are_recorded_relative_to_the_run_dir(tiny_model_dir, tmp_path,
                                                              monkeypatch):
    """A run started with a relative --run-dir records folders the eval stage (and a moved
    run directory) can find: relative to the run directory, not to the working directory."""
    from pipelines.artifacts import eval_policies

    monkeypatch.chdir(tmp_path)
    make_run(Path("runs/r"))
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=2, batch_size=2,
                                     policies=["dpo_step"], save_every=1))
    run(cfg, Path("runs/r"), TRAIN)
    with Store(Path("runs/r/store.duckdb"), read_only=True) as store:
        final = store.checkpoint("train", "", "dpo_step/final")["folder"]
        assert final == "checkpoints/train/dpo_step/final"
        assert store.checkpoint("train", "", "dpo_step")["folder"].startswith("checkpoints/")
        moved = tmp_path / "elsewhere"
        Path("runs/r").rename(moved)
    with Store(moved / "store.duckdb", read_only=True) as store:
        folder = eval_policies(store, moved)["dpo_step"]
    assert (Path(folder) / "adapter_config.json").is_file()


def test_a_later_rounds_card_names_the_public_base_and_the_adapters_merged_into_it(tmp_path):
    from pipelines.artifacts import ITERATE
    from pipelines.stages.train import provenance

    cfg = RunConfig.from_dict({"model": {"adapter": "/adapters/start"}})
    with Store(tmp_path / "store.duckdb") as store:
        for k, policy, adapter in ((2, "dpo_step", "checkpoints/train/dpo_step/final"),
                                   (3, "rft@2", "checkpoints/train@2/rft/final")):
            store.set_checkpoint(f"search@{k}", "", ITERATE, {
                "folder": f"checkpoints/search@{k}/iterate", "policy": policy,
                "adapter": adapter})
        first, third = provenance(cfg, store, 1), provenance(cfg, store, 3)
        run_id = store.run_id
    assert first.base == third.base == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert first.merged == ["`/adapters/start` (model.adapter)"] and first.round == 1
    assert third.run_id == run_id and third.round == 3 and "Q4_1" in third.note
    assert third.merged[0] == first.merged[0] and len(third.merged) == 3
    assert "policy `dpo_step`" in third.merged[1]
    assert "`checkpoints/train/dpo_step/final`" in third.merged[1]
    assert "policy `rft@2`" in third.merged[2]
    assert "`checkpoints/train@2/rft/final`" in third.merged[2]


def select_run(run_dir: Path, model_dir: str, **train) -> RunConfig:
    """A mined run with two validation tasks, and a config that trains dpo_step for 3 steps,
    a checkpoint each step, and selects on validation."""
    from dataclasses import replace as with_

    from tests.fakes import ShortMiniShop

    make_run(run_dir)
    with Store(run_dir / "store.duckdb") as store:
        store.insert_tasks([with_(t, split="val") for t in ShortMiniShop().tasks("train", 2)],
                           "tasks")
    settings = config(model_dir, policies=["dpo_step"], batch_size=2, max_steps=3,
                      save_every=1, select="val", **train)
    settings["env"] = {"name": "tests.fakes:ShortMiniShop", "kwargs": {"max_steps": 2},
                       "val_tasks": 2}
    return RunConfig.from_dict(settings)


def test_select_val_picks_the_best_checkpoint_on_validation_and_resumes(tiny_model_dir,
                                                                        tmp_path, monkeypatch):
    from pipelines import play as playing
    from pipelines.headlines import headline
    from pipelines.progress import read_progress

    cfg = select_run(tmp_path / "r", tiny_model_dir)
    real_play, played = playing.play, []

    def crash_on_the_second(ctx, model, adapter, tasks, on_done):
        played.append(Path(adapter).name)
        if len(played) == 2:
            raise KeyboardInterrupt  # killed after step 1's episodes, before step 2's
        real_play(ctx, model, adapter, tasks, on_done)

    monkeypatch.setattr(playing, "play", crash_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, tmp_path / "r", TRAIN)
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert "selected" not in store.checkpoint("train", "", "dpo_step/final")
        assert {r.policy for r in store.eval_episodes()} == {"dpo_step/step-1"}
    kept = sorted(p.name for p in (tmp_path / "r/checkpoints/train/dpo_step/candidates").iterdir())
    assert kept == ["step-1", "step-2"]  # adapters only: no optimizer state
    assert not (tmp_path / "r/checkpoints/train/dpo_step/candidates/step-1/trainer_state.pt"
                ).exists()

    progress = read_progress(tmp_path / "r")["counters"]  # what `status` showed when killed
    assert (progress["policy"], progress["episodes_done"], progress["episodes"]) == (
        "dpo_step/step-2", 2, 6)  # step 1's 2 of the 3 candidates x 2 validation tasks

    played.clear()
    monkeypatch.setattr(playing, "play", lambda *a: (played.append(Path(a[2]).name),
                                                       real_play(*a)))
    monkeypatch.setattr("offline_agent.training.fit.fit_policy",
                        lambda *a, **k: pytest.fail("trained again"))
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]["dpo_step"]
    assert played == ["step-2", "final"]  # step 1's episodes were kept, training too
    progress = read_progress(tmp_path / "r")["counters"]
    assert (progress["policy"], progress["episodes_done"], progress["episodes"]) == (
        "dpo_step/step-3", 6, 6)
    chosen = stats["selected"]
    assert [c["step"] for c in chosen["candidates"]] == [1, 2, 3]
    assert all(c["n_tasks"] == 2 for c in chosen["candidates"])
    best = max(chosen["candidates"], key=lambda c: (c["success_rate"], c["mean_reward"],
                                                    c["step"]))
    assert chosen["step"] == best["step"] and stats["folder"] == best["folder"]
    assert f"step {best['step']} of 3 checkpoints" in chosen["why"]
    assert headline("train", {"dpo_step": stats}).endswith(  # what `status` shows
        f", val {best['success_rate']:.1%} of 2 at step {best['step']} of 3")
    assert (tmp_path / "r" / stats["folder"] / "adapter_config.json").is_file()
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert store.checkpoint("train", "", "dpo_step/final") == stats
        assert len(store.eval_episodes(stage="train")) == 6  # 3 candidates x 2 tasks


def test_merge_writes_the_selected_checkpoint_not_the_last_step(tiny_model_dir, tmp_path,
                                                                monkeypatch):
    """train.merge with select: val merges the adapter the policy's record points at: here
    step 1 of 3 (selection made to take the first), whose logits differ from step 3's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from offline_agent.policy.adapters import quiet_peft
    from pipelines import selection

    cfg = select_run(tmp_path / "r", tiny_model_dir, merge=True)
    monkeypatch.setattr(selection, "choose", lambda scores: scores[0])
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]["dpo_step"]
    assert stats["selected"]["step"] == 1
    assert stats["merged"] == "checkpoints/train/dpo_step/merged"
    ids = torch.tensor([list(range(100, 140))])
    with torch.no_grad(), quiet_peft():
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "r" / stats["merged"])(ids)
        chosen, last = (PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "r" / folder)(ids)
            for folder in (stats["folder"], "checkpoints/train/dpo_step/final"))
    assert (chosen.logits - last.logits).abs().max() > 1e-3  # the two adapters differ
    torch.testing.assert_close(merged.logits, chosen.logits, rtol=1e-4, atol=1e-4)


def test_select_val_needs_validation_tasks():
    from pipelines.config import ConfigError

    with pytest.raises(ConfigError, match="train.select=val needs validation tasks"):
        RunConfig.from_dict({"train": {"select": "val"}})
    with pytest.raises(ConfigError, match="train.select must be one of last, val"):
        RunConfig.from_dict({"train": {"select": "best"}})
    with pytest.raises(ConfigError, match="grpo.select=val needs validation tasks"):
        RunConfig.from_dict({"grpo": {"select": "val"}})
    with pytest.raises(ConfigError, match="grpo.select must be one of last, val"):
        RunConfig.from_dict({"grpo": {"select": "best"}})


def test_choose_prefers_success_then_reward_then_the_later_step():
    from pipelines.selection import choose, reason

    def score(step, success, reward):
        return {"step": step, "success_rate": success, "mean_reward": reward, "n_tasks": 8}

    scores = [score(2, 0.25, 0.5), score(4, 0.5, 0.4), score(6, 0.25, 0.9)]
    assert choose(scores)["step"] == 4
    assert reason(choose(scores), scores) == ("step 4 of 3 checkpoints: highest validation "
                                              "success (50.0% of 8 tasks, mean reward 0.400)")
    tied = [score(2, 0.5, 0.6), score(4, 0.5, 0.4)]
    assert choose(tied)["step"] == 2
    assert "mean reward broke the tie" in reason(choose(tied), tied)
    same = [score(2, 0.5, 0.4), score(4, 0.5, 0.4)]
    assert choose(same)["step"] == 4 and "the later step" in reason(choose(same), same)
