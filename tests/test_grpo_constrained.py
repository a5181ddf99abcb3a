"""GRPO under model.constrain: tools: the masks the hf decoder drew each token under, rebuilt
by replaying the grammar over the sampled ids (GrammarMasks.replay), exactly as it applied
them; the ratio and KL renormalise over them (docs/training.md)."""

from __future__ import annotations

import math

import pytest
import torch

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import load_env
from offline_agent.policy.grammar import prompt_grammars
from offline_agent.policy.hf import HFPolicy
from offline_agent.rollout import action_sampling
from offline_agent.training.config import TrainConfig
from offline_agent.training.grpo.config import GRPOConfig
from offline_agent.training.grpo.rollouts import member_seeds, sample_groups
from offline_agent.training.grpo.train import train_grpo
from offline_agent.training.grpo.update import _chunks, make_batch
from offline_agent.training.logprobs import masked_logprobs, token_logps
from offline_agent.training.model import add_lora
from tests.pick_env import PickLong, biased_tiny_model

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (make install)")


def test_merged_tokens_count_toward_the_token_they_were_turned_into():
    # allowed {0, 1, 2}; a draw of 2 came out as 1 (settle's redirect): p(1) = (e + 1) / Z
    logits = torch.tensor([[2.0, 1.0, 0.0, 5.0]])
    allowed = torch.tensor([[True, True, True, False]])
    merged = torch.tensor([[False, False, True, True]])  # 3 is not allowed: never counted
    got = masked_logprobs(logits, allowed, torch.tensor([1]), merged)
    z = math.exp(2) + math.e + 1
    assert got.item() == pytest.approx(math.log((math.e + 1) / z))
    assert masked_logprobs(logits, allowed, torch.tensor([1])).item() == pytest.approx(1 - math.log(z))


class Recorder:
    """Wraps a policy's GrammarMasks: records, while on, each decode step's allowed tokens
    (one row per call) and whether settle redirected the draw."""

    def __init__(self, grammars, monkeypatch):
        self.on, self.allowed, self.redirected = False, [], []
        real_mask, real_settle = grammars.mask, grammars.settle

        def mask(logits, rows, left):
            out = real_mask(logits, rows, left)
            if self.on:
                self.allowed.append((out[0] > float("-inf")).cpu())
            return out

        def settle(tokens, rows):
            before = tokens.clone()
            out = real_settle(tokens, rows)
            if self.on:
                self.redirected.append(bool((out != before).any()))
            return out
        monkeypatch.setattr(grammars, "mask", mask)
        monkeypatch.setattr(grammars, "settle", settle)


def _check_replay(policy, env, seeds, monkeypatch) -> int:
    """Samples one reply per seed at the env's first state and checks the replayed masks
    equal the decoder's at every token; returns how many draws settle redirected."""
    g = policy.grammars
    rec = Recorder(g, monkeypatch)
    env.reset(env.tasks("train", 1)[0])
    prompt = render_prompt(policy.tokenizer, history_messages(
        env.system_prompt(), env.task.instruction, "start", [], env.demonstration()))
    redirects = 0
    for seed in seeds:
        sampling = action_sampling(env, 1.0, seed, [env.call_tools()])
        rec.on, rec.allowed, rec.redirected = True, [], []
        completion = policy.sample([prompt], 1, sampling)[0][0]
        rec.on = False
        assert completion.constrained and len(rec.allowed) == len(completion.token_ids)
        grammar = prompt_grammars(sampling, 1)[0]
        masks = g.replay(grammar, completion.token_ids, sampling.max_new_tokens)
        vocab = len(rec.allowed[0])
        for t, (mask, want, redirected) in enumerate(zip(masks, rec.allowed, rec.redirected)):
            allowed, merged = mask.unpack(vocab)
            assert torch.equal(allowed, want), (seed, t)
            if redirected:  # the redirected tokens' mass counts as the token's
                assert merged.any() and not merged[completion.token_ids[t]]
        redirects += sum(rec.redirected)
    return redirects


@pytest.mark.parametrize("env_name", ["minishop", "math", "python"])
def test_replayed_masks_are_the_ones_the_decoder_applied(tiny_model_dir, env_name, monkeypatch):
    policy = HFPolicy.from_pretrained(tiny_model_dir, constrain="tools")
    env = load_env(env_name)
    if env_name == "python":
        env.max_action_tokens = 96  # a random model's calls run to the budget: closing steers
    _check_replay(policy, env, range(6), monkeypatch)


@pytest.mark.parametrize("env_name", ["math", "python"])
def test_replay_through_redirected_ends(tiny_model_dir, env_name, monkeypatch):
    """A model that always wants to end its turn: settle redirects its end inside the call to
    the call's close; the replay counts the redirected tokens' mass and closes the row."""
    policy = HFPolicy.from_pretrained(tiny_model_dir, constrain="tools")
    bias = torch.zeros(policy.model.get_output_embeddings().weight.shape[0])
    bias[policy.tokenizer.eos_token_id] = 1e4
    policy.model.get_output_embeddings().register_forward_hook(lambda m, i, out: out + bias)
    assert _check_replay(policy, load_env(env_name), range(4), monkeypatch) > 0


def _constrained_setup(tokenizer):
    model = add_lora(biased_tiny_model(tokenizer), TrainConfig(lora_r=8, seed=0))
    return model, HFPolicy(model, tokenizer, max_batch=32, seed=0, constrain="tools")


def test_constrained_rollouts_train_on_the_masked_distribution(tokenizer):
    model, policy = _constrained_setup(tokenizer)
    tasks = PickLong().tasks("train", 2)
    rollouts = sample_groups(policy, PickLong, tasks, 4, 1.0,
                             [member_seeds(0, 0, 0, 4) for _ in tasks], 8, policy.grammars)
    assert all(t.masks is not None and len(t.masks) == len(t.action)
               for r in rollouts for t in r.turns)
    adv = [torch.zeros(len(r.turns)) for r in rollouts]
    batch = make_batch(rollouts, adv)
    _, packs, grammar = _chunks(batch, 3072, model.get_output_embeddings().weight.shape[0])
    model.eval()
    with torch.no_grad():
        masked, _ = token_logps(model, packs[0], 1.0, masks=grammar[0]())
        free, _ = token_logps(model, packs[0], 1.0)
    assert torch.isfinite(masked).all()
    # renormalising over the grammar's tokens raises every log-prob; some strictly
    assert (masked >= free - 1e-5).all() and (masked > free + 1e-3).any()
    assert masked.max() <= 1e-6


def test_constrained_grpo_step_has_ratio_one_and_a_finite_loss(tokenizer, tmp_path):
    model, policy = _constrained_setup(tokenizer)
    seen = []
    cfg = GRPOConfig(enabled=True, init="base", steps=2, group_size=4, tasks_per_step=2,
                     lr=1e-3, max_resample=1, save_every=1000)
    train_grpo(model, policy, PickLong, PickLong().tasks("train", 4), cfg, tmp_path, seed=0,
               batch_size=16, pack_tokens=3072, max_tokens=16, grammars=policy.grammars,
               on_metrics=lambda s, m: seen.append(m))
    updated = [m for m in seen if "ratio" in m]
    assert updated, "no step had a group with a signal"
    for m in updated:
        assert m["ratio"] == pytest.approx(1.0, abs=1e-6) and math.isfinite(m["loss"])
        assert math.isfinite(m["entropy"])



def test_the_stage_runs_grpo_under_the_grammar(tokenizer, tmp_path):
    """model.constrain: tools through the stage: the rollout policy decodes under the grammar
    and the update renormalises over the replayed masks (ratio 1 at the first update)."""
    from pipelines.config import RunConfig
    from pipelines.runner import run
    from pipelines.stages import STAGES
    from storage import Store

    model_dir = tmp_path / "model"
    biased_tiny_model(tokenizer).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    cfg = RunConfig.from_dict({
        "model": {"id": str(model_dir), "device": "cpu", "max_batch": 16, "constrain": "tools"},
        "env": {"name": "tests.pick_env:PickLong", "train_tasks": 8, "test_tasks": 2},
        "train": {"lora_r": 8},
        "grpo": {"enabled": True, "init": "base", "steps": 2, "group_size": 4,
                 "tasks_per_step": 2, "lr": 1e-3, "save_every": 1000}})
    run(cfg, tmp_path / "r", [s for s in STAGES if s.name in ("tasks", "grpo")])
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        data = [r.data for r in store.metrics("grpo", "grpo")]
    assert len(data) == 2 and any("ratio" in d for d in data)
    for d in data:
        assert "ratio" not in d or d["ratio"] == pytest.approx(1.0, abs=1e-6)
