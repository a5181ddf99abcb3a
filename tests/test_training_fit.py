"""Training end to end on the tiny random model: a real learning signal, adapters that the
policy backend loads, QLoRA and the merged model."""

from __future__ import annotations

import pytest

from offline_agent.chat import render_prompt
from offline_agent.training.config import TrainConfig
from offline_agent.training.fit import fit_policy
from offline_agent.training.logprobs import messages
from tests.test_training import step_pair, trajectory_pair


def margins(policy, pairs) -> list[float]:
    """log p(chosen) - log p(rejected) of each step pair's action under `policy`."""
    tok = policy.tokenizer
    prompts = [render_prompt(tok, messages(p["prompt"])) for p in pairs]
    choices = [[p[s][0]["content"] + "<|im_end|>" for s in ("chosen", "rejected")] for p in pairs]
    return [c - r for c, r in policy.choice_logprobs(prompts, choices)]


def test_dpo_raises_the_chosen_over_rejected_margin_and_the_adapter_loads(tiny_model_dir,
                                                                           tmp_path):
    from offline_agent.policy import load_policy

    pairs = [step_pair(i) for i in range(4)]
    cfg = TrainConfig(lr=3e-3, batch_size=4, epochs=6, warmup_steps=0, save_every=100, seed=1)
    seen = []
    out = fit_policy("dpo_step", pairs, tiny_model_dir, cfg, tmp_path / "dpo",
                     on_metrics=lambda step, m: seen.append(m))
    assert out["step"] == 6 and len(seen) == 6 and out["items"] == 4
    assert seen[0]["margin"] == pytest.approx(0, abs=1e-4)  # policy == reference at the start
    assert seen[-1]["margin"] > 0.1 and seen[-1]["accuracy"] == 1.0
    assert seen[-1]["loss"] < seen[0]["loss"]
    base = load_policy(tiny_model_dir, device="cpu", prefix_cache_gb=0)
    trained = load_policy(tiny_model_dir, device="cpu", prefix_cache_gb=0,
                          adapter=str(tmp_path / "dpo" / "final"))
    before, after = margins(base, pairs), margins(trained, pairs)
    assert all(a > b + 1.0 for a, b in zip(after, before)), (before, after)


def test_rft_lowers_the_nll_of_the_actions(tiny_model_dir, tmp_path):
    pair = trajectory_pair()
    examples = [{"example_id": 1, "messages": pair["prompt"] + pair["chosen"]}]
    cfg = TrainConfig(lr=1e-2, batch_size=1, epochs=6, warmup_steps=0, save_every=100)
    seen = []
    fit_policy("rft", examples, tiny_model_dir, cfg, tmp_path / "rft",
               on_metrics=lambda step, m: seen.append(m["loss"]))
    assert seen[-1] < 0.8 * seen[0]
    assert (tmp_path / "rft" / "final" / "adapter_model.safetensors").exists()


def test_qlora_trains_and_merge_writes_a_full_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    cfg = TrainConfig(quantization="4bit", batch_size=2, max_steps=1, merge=True, save_every=100)
    out = fit_policy("dpo_step", [step_pair(1), step_pair(2)], tiny_model_dir, cfg,
                     tmp_path / "q")
    assert out["step"] == 1
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "q" / "merged")
    assert merged.config.num_hidden_layers == 2


def test_no_data_is_a_clear_error(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="no training data"):
        fit_policy("dpo_step", [], tiny_model_dir, TrainConfig(), tmp_path)


def test_gradient_checkpointing_and_split_forwards_give_the_same_losses(tiny_model_dir, tmp_path):
    """Recomputing activations, or splitting a step into several packed forwards (gradient
    accumulation), changes cost, not the numbers."""
    pairs = [step_pair(i) for i in range(4)] + [trajectory_pair()]
    runs = {}
    for name, extra in (("plain", {}), ("checkpointed", {"gradient_checkpointing": True}),
                        ("split", {"pack_tokens": 1})):
        cfg = TrainConfig(lr=3e-3, batch_size=5, max_steps=2, warmup_steps=0, save_every=100,
                          **extra)
        seen = []
        fit_policy("dpo_step", pairs, tiny_model_dir, cfg, tmp_path / name,
                   on_metrics=lambda step, m, seen=seen: seen.append(m["loss"]))
        runs[name] = seen
    assert runs["plain"][0] != runs["plain"][-1]
    assert runs["checkpointed"] == pytest.approx(runs["plain"], rel=1e-5)
    assert runs["split"] == pytest.approx(runs["plain"], rel=1e-5)
