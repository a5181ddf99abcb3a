"""Held-out pair accuracy: the figures from log-probs by hand, which pairs are held out, the
trained policy scored by the train stage (resumably), and its line in `offline-agent status`."""

from __future__ import annotations

import math
import re

import pytest
import torch

from offline_agent.training import heldout
from offline_agent.training.config import TrainConfig
from offline_agent.training.heldout import pair_accuracies, score_pairs, scored_logps
from pipelines.cli import main
from pipelines.config import RunConfig
from pipelines.progress import read_progress
from pipelines.runner import run
from pipelines.stages import train as train_stage
from pipelines.stages.train import held_out_pairs, policy_rows
from storage import Store
from tests.test_train_stage import TRAIN, config, make_run
from tests.test_training import step_pair


# ---- the figures from log-probs (pure) --------------------------------------------------------
def test_accuracies_from_hand_made_log_probs():
    # (chosen, rejected) per pair; the policy prefers the chosen in pairs 0, 1, 3 (pair 2 ties)
    policy = torch.tensor([[-1.0, -2.0], [-3.0, -5.0], [-4.0, -4.0], [-2.0, -6.0]])
    # the reference prefers it in pairs 1, 3 only; training moved toward the chosen where
    # pi(c) - ref(c) > pi(r) - ref(r): 0 (0 > -1), 2 (1 > 0), not 1 (0 = 0), not 3 (-1 < 0)
    reference = torch.tensor([[-1.0, -1.0], [-3.0, -5.0], [-5.0, -4.0], [-1.0, -6.0]])
    out = pair_accuracies(policy, reference)
    assert (out["n"], out["pair_accuracy"], out["reward_accuracy"],
            out["base_pair_accuracy"]) == (4, 0.75, 0.5, 0.5)
    # Wilson 3/4 and 2/4 by hand (z = 1.96)
    for name, k in (("pair_accuracy", 3), ("reward_accuracy", 2), ("base_pair_accuracy", 2)):
        p, z = k / 4, 1.959963984540054
        centre = (p + z * z / 8) / (1 + z * z / 4)
        half = z * math.sqrt(p * (1 - p) / 4 + z * z / 64) / (1 + z * z / 4)
        assert out[f"{name}_ci95"] == pytest.approx([centre - half, centre + half], abs=1e-4)


def test_no_pair_gives_none_not_nan():
    out = pair_accuracies(torch.zeros(0, 2), torch.zeros(0, 2))
    assert out == {"n": 0, "pair_accuracy": None, "pair_accuracy_ci95": None,
                   "reward_accuracy": None, "reward_accuracy_ci95": None,
                   "base_pair_accuracy": None, "base_pair_accuracy_ci95": None}
    with pytest.raises(ValueError, match="must be"):
        pair_accuracies(torch.zeros(3, 2), torch.zeros(2, 2))


# ---- which pairs are held out -----------------------------------------------------------------
def test_held_out_pairs_are_the_mined_ones_the_sample_left_out(tmp_path):
    make_run(tmp_path / "r", n_step=10, trajectory=True)
    with Store(tmp_path / "r" / "store.duckdb") as store:
        trained = {r["pair_id"] for r in policy_rows(store, "dpo_step", 6, 0)}
        source, mined, held = held_out_pairs(store, "dpo_step", 6, 0)
        assert (source, len(mined), len(trained), len(held)) == ("dpo_step", 10, 6, 4)
        ids = {r["pair_id"] for r in held}
        assert not ids & trained and ids | trained == {r["pair_id"] for r in mined}
        assert {r["pair_id"] for r in held_out_pairs(store, "rft", 6, 0)[2]} == ids  # dpo_step's
        both = held_out_pairs(store, "dpo_step_outcome", 6, 0)
        assert len(both[1]) == 11 and len(both[2]) == 5  # step and trajectory pairs
        assert held_out_pairs(store, "dpo_step", 0, 0)[2] == []  # trained on all
        assert held_out_pairs(store, "dpo_step", 10, 0)[2] == []


# ---- a trained policy scored ------------------------------------------------------------------
def _untrained_adapter(model_dir: str, folder) -> str:
    from offline_agent.training.model import add_lora, load_base

    cfg = TrainConfig()
    model, _ = load_base(model_dir, cfg, "cpu")
    add_lora(model, cfg).save_pretrained(folder)
    return str(folder)


def test_an_untrained_adapter_scores_as_its_base_and_moves_no_reward(tiny_model_dir, tmp_path):
    """A fresh LoRA adapter (B = 0) is the base: the same pair accuracy, and every implicit
    reward margin 0, a tie, so reward accuracy 0."""
    rows = [step_pair(i) for i in range(4)]
    out = score_pairs(rows, tiny_model_dir, _untrained_adapter(tiny_model_dir, tmp_path / "a"),
                      TrainConfig())
    assert out["n"] == 4 and out["reward_accuracy"] == 0.0
    assert out["pair_accuracy"] == out["base_pair_accuracy"]


def test_scoring_reports_each_forward_of_both_passes(tiny_model_dir, tmp_path, capsys):
    """A few hundred pairs take minutes on a CPU: each packed forward is heard, the policy's
    pass then the reference's, up to 2N, and a bar counts them."""
    rows = [step_pair(i) for i in range(3)]
    heard = []
    score_pairs(rows, tiny_model_dir, _untrained_adapter(tiny_model_dir, tmp_path / "a"),
                TrainConfig(pack_tokens=1), on_scored=lambda *counts: heard.append(counts))
    assert heard == [(k, 6) for k in range(1, 7)]  # a pair per forward at this budget
    assert "held-out pairs: 100%" in capsys.readouterr().err


@pytest.mark.parametrize("quantization", ["none", "4bit"])
def test_scoring_builds_the_model_training_ran(tiny_model_dir, tmp_path, quantization):
    """Scored on the pairs it trained on, the reference is exactly the one training stored
    (the same network, the same forward), and the trained adapter is what moved."""
    from offline_agent.training.dpo import REFERENCE
    from offline_agent.training.fit import fit_policy

    cfg = TrainConfig(quantization=quantization, lr=3e-2, warmup_steps=0, batch_size=2,
                      max_steps=2, save_every=100)
    rows = [step_pair(1), step_pair(2)]
    fit_policy("dpo_step", rows, tiny_model_dir, cfg, tmp_path / "p")
    policy, reference = scored_logps(rows, tiny_model_dir, str(tmp_path / "p" / "final"), cfg)
    assert torch.equal(reference, torch.load(tmp_path / "p" / REFERENCE)["logps"])
    assert (policy - reference).abs().max() > 1e-3


def test_the_train_stage_scores_each_policy_on_the_pairs_it_left_out(tiny_model_dir, tmp_path):
    """dpo_step trained on 6 of 10 step pairs toward the chosen click (every rejected is
    click[back]) moves the 4 it never saw toward theirs too; RFT is scored on the same 4."""
    make_run(tmp_path / "r", n_step=10, rft=True)
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=6, batch_size=2, max_pairs=6,
                                     policies=["dpo_step", "rft"]))
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]
    step, rft = stats["dpo_step"]["held_out"], stats["rft"]["held_out"]
    assert (step["left_out_of"], step["kinds"], step["mined"], step["n"]) == (
        "dpo_step", ["step"], 10, 4)
    assert (rft["left_out_of"], rft["n"], rft["base_pair_accuracy"]) == (
        "dpo_step", 4, step["base_pair_accuracy"])
    assert step["reward_accuracy"] == 1.0
    assert step["pair_accuracy"] >= step["base_pair_accuracy"]
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert store.checkpoint("train", "", "dpo_step/final")["held_out"] == step
    counters = read_progress(tmp_path / "r")["counters"]  # what `status` showed last
    assert (counters["policy"], counters["pairs_scored"], counters["pair_scores"]) == (
        "rft/held-out", 8, 8)


def test_trained_on_all_pairs_records_n_0_and_a_crash_before_scoring_scores_once(
        tiny_model_dir, tmp_path, monkeypatch, capsys):
    make_run(tmp_path / "r", n_step=4, trajectory=True)
    cfg = RunConfig.from_dict(config(tiny_model_dir, max_steps=1, batch_size=2, max_pairs=3,
                                     policies=["dpo_outcome", "dpo_step"]))
    real, calls = heldout.score_pairs, []

    def crash_on_second(*args, **kwargs):
        calls.append(len(args[0]))
        if len(calls) == 2:
            raise RuntimeError("killed while scoring")
        return real(*args, **kwargs)

    monkeypatch.setattr(heldout, "score_pairs", crash_on_second)
    with pytest.raises(RuntimeError, match="killed while scoring"):
        run(cfg, tmp_path / "r", TRAIN)
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert "held_out" not in store.checkpoint("train", "", "dpo_step/final")
    monkeypatch.setattr(train_stage, "_train_policy", lambda *a: pytest.fail("retrained"))
    calls.clear()
    stats = run(cfg, tmp_path / "r", TRAIN)["train"]["stats"]
    assert calls == [1]  # dpo_outcome's figures kept, only dpo_step's scored again
    assert stats["dpo_outcome"]["held_out"] == {
        "left_out_of": "dpo_outcome", "kinds": ["trajectory"], "mined": 1,
        **pair_accuracies(torch.zeros(0, 2), torch.zeros(0, 2))}
    assert stats["dpo_step"]["held_out"]["n"] == 1
    capsys.readouterr()  # the runner's own lines
    assert main(["status", str(tmp_path / "r"), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "held-out pairs dpo_outcome: none held out (dpo_outcome's sample took all 1)" in out
    assert "held-out pairs dpo_step: " in out and "of 1 (base " in out
    assert "pair_accuracy_ci95" not in out  # the figures once, as a line, not the dict
    assert main(["status", str(tmp_path / "r")]) == 0  # the headline: dpo_step's accuracy
    assert re.search(r"dpo_step \d+ steps? on \d+ rows, loss [\d.]+, held-out acc [\d.]+% of 1",
                     capsys.readouterr().out)
