"""Training end to end on the tiny random model: a real learning signal, adapters that the
policy backend loads, QLoRA and the merged model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from offline_agent.chat import render_prompt
from offline_agent.policy.adapters import quiet_peft
from offline_agent.training.config import TrainConfig
from offline_agent.training.fit import fit_policy
from offline_agent.training.logprobs import messages
from tests.test_training import step_pair, trajectory_pair

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)


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
    final = tmp_path / "dpo" / "final"
    assert json.loads((final / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == tiny_model_dir  # a folder is named as given
    card = (final / "README.md").read_text()
    assert card.startswith(f"---\nbase_model: {tiny_model_dir}\nlibrary_name: peft\n")
    assert "Model Card for Model ID" not in card and "4 pairs" in card  # not PEFT's template


@pytest.mark.e2e
def test_an_embedded_models_adapter_names_its_hub_base_and_loads_offline(embedded_dir, tmp_path,
                                                                         monkeypatch):
    """adapter_config.json and the card name the embedded model by its Hub id, not the cache
    folder; PeftModel.from_pretrained(base, adapter) loads it with the Hub out of reach
    (AutoPeftModelForCausalLM would fetch the base from the Hub)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from offline_agent.policy.models import DEFAULT_MODEL

    cfg = TrainConfig(lr=1e-2, warmup_steps=0, batch_size=1, max_steps=1)
    fit_policy("dpo_step", [step_pair(1)], DEFAULT_MODEL, cfg, tmp_path / "e")
    final = tmp_path / "e" / "final"
    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert json.loads((final / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == hub
    card = (final / "README.md").read_text()
    assert card.startswith(f"---\nbase_model: {hub}\nlibrary_name: peft\n") and "Q4_1" in card
    assert embedded_dir not in card
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base = AutoModelForCausalLM.from_pretrained(embedded_dir)
    ids = torch.tensor([list(range(100, 120))])
    with torch.no_grad(), quiet_peft():
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, final)(ids).logits
    assert (adapted - plain).abs().max() > 1e-3  # the trained adapter is applied


def test_rft_lowers_the_nll_of_the_actions(tiny_model_dir, tmp_path):
    pair = trajectory_pair()
    examples = [{"example_id": 1, "messages": pair["prompt"] + pair["chosen"]}]
    cfg = TrainConfig(lr=1e-2, batch_size=1, epochs=6, warmup_steps=0, save_every=100)
    seen = []
    fit_policy("rft", examples, tiny_model_dir, cfg, tmp_path / "rft",
               on_metrics=lambda step, m: seen.append(m["loss"]))
    assert seen[-1] < 0.8 * seen[0]
    assert (tmp_path / "rft" / "final" / "adapter_model.safetensors").exists()


@pytest.fixture
def avx512_bf16(monkeypatch):
    """4-bit layers built from here on are told the CPU has avx512_bf16, as bitsandbytes
    tells them on such a CPU (its packed-weight inference path), whatever this CPU has."""
    import bitsandbytes

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: True)


def test_qlora_trains_and_merge_writes_base_plus_adapter(tiny_model_dir, tmp_path, avx512_bf16):
    """QLoRA on the tiny model (hidden size 32, below bitsandbytes' packing blocksize) as on
    a CPU with avx512_bf16, where it failed in the reference pass; the merged model computes
    what the full-precision base with the adapter enabled computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from offline_agent.training.model import write_merged

    cfg = TrainConfig(quantization="4bit", lr=3e-2, warmup_steps=0, batch_size=2, max_steps=2,
                      save_every=100)
    out = fit_policy("dpo_step", [step_pair(1), step_pair(2)], tiny_model_dir, cfg,
                     tmp_path / "q")
    assert out["step"] == 2
    write_merged(tiny_model_dir, str(tmp_path / "q" / "final"), str(tmp_path / "q" / "merged"),
                 cfg)
    ids = torch.tensor([list(range(100, 140))])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "q" / "merged")
    with torch.no_grad(), quiet_peft():
        plain = base(ids).logits
        adapted = PeftModel.from_pretrained(base, tmp_path / "q" / "final")(ids).logits
        logits = merged(ids).logits
    assert (adapted - plain).abs().max() > 0.05  # the adapter changes the model
    torch.testing.assert_close(logits, adapted, rtol=1e-4, atol=1e-4)


def reference_and_grads(model_dir: str) -> tuple:
    """QLoRA's DPO reference log-probs of two pairs, then the LoRA gradient of the first
    training forward (the policy's summed log-probs of the same sequences)."""
    import torch

    from offline_agent.training.dpo import reference_logps
    from offline_agent.training.logprobs import encode_pair, pack, sequence_logps
    from offline_agent.training.model import add_lora, load_base

    cfg = TrainConfig(quantization="4bit")
    model, tokenizer = load_base(model_dir, cfg, "cpu")
    model = add_lora(model, cfg)
    items = [list(encode_pair(tokenizer, step_pair(i))) for i in (1, 2)]
    reference = reference_logps(model, items, cfg.pack_tokens)
    model.train()
    sequence_logps(model, pack([s for pair in items for s in pair])).sum().backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
    return reference, grads


def check_avx512_bf16_makes_no_difference(model_dir: str, monkeypatch) -> None:
    """Reference log-probs and gradients equal with bitsandbytes told the CPU has avx512_bf16
    and told it has not (the packed path forced or kept off, on any CPU)."""
    import bitsandbytes
    import torch

    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: False)
    without = reference_and_grads(model_dir)
    monkeypatch.setattr(bitsandbytes.nn.modules, "has_avx512bf16", lambda: True)
    with_it = reference_and_grads(model_dir)
    assert without[1].abs().max() > 0
    assert torch.equal(with_it[0], without[0]) and torch.equal(with_it[1], without[1])


def test_qlora_reference_and_gradients_do_not_depend_on_avx512_bf16(tiny_model_dir,
                                                                     monkeypatch):
    check_avx512_bf16_makes_no_difference(tiny_model_dir, monkeypatch)


@pytest.mark.e2e
def test_embedded_qlora_reference_and_gradients_do_not_depend_on_avx512_bf16(embedded_dir,
                                                                              monkeypatch):
    """The real model's dims are ones bitsandbytes packs: there, its packed layers would give
    other reference log-probs and pass no gradient to their inputs (docs/training.md);
    load_4bit keeps every layer off that path."""
    check_avx512_bf16_makes_no_difference(embedded_dir, monkeypatch)


def test_a_lora_run_prints_no_bitsandbytes_note_and_no_peft_deprecation(tiny_model_dir,
                                                                        tmp_path):
    """What a user sees while a LoRA policy trains (a fresh process, as `make demo`): neither
    bitsandbytes' kernel note (its avx512_bf16 path, never run; on CPUs without avx512_bf16
    it is never printed) nor the FutureWarning of peft's `is_gradient_checkpointing` read."""
    script = ("import sys\nfrom offline_agent.training.config import TrainConfig\n"
              "from offline_agent.training.fit import fit_policy\n"
              "from tests.test_training import step_pair\n"
              "fit_policy('dpo_step', [step_pair(1)], sys.argv[1], TrainConfig(max_steps=1), "
              "sys.argv[2])\n")
    proc = subprocess.run([sys.executable, "-c", script, tiny_model_dir, str(tmp_path / "lora")],
                          capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "lora" / "final" / "adapter_model.safetensors").exists()
    assert "gemm_4bit_forward" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr


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
