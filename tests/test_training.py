"""Training core: the DPO loss by hand, packed log-probs vs plain forwards, masks and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from offline_agent.chat import render_prompt
from offline_agent.policy.base import encode_prompt
from offline_agent.training.config import TrainConfig
from offline_agent.training.logprobs import (
    Encoded,
    encode_example,
    encode_pair,
    groups,
    messages,
    pack,
    sequence_logps,
)
from offline_agent.training.losses import dpo_loss, sft_loss

SYSTEM = {"role": "system", "content": "You shop. Tools: search[q], click[x], buy."}
USER = {"role": "user", "content": "i need a blue power bank under 50 dollars"}


def step_pair(i: int) -> dict:
    """A step pair: earlier turns in the prompt, one assistant action per side."""
    prompt = [SYSTEM, USER, {"role": "assistant", "content": "search[power bank]"},
              {"role": "tool", "content": f"Results: P000{i} blue power bank $30; P0009 red $20"}]
    return {"pair_id": i, "prompt": prompt,
            "chosen": [{"role": "assistant", "content": f"click[P000{i}]"}],
            "rejected": [{"role": "assistant", "content": "click[back]"}]}


def trajectory_pair() -> dict:
    """A trajectory pair: whole episodes after [system, user], observations between actions."""
    def episode(item, page):
        return [{"role": "assistant", "content": "search[blue power bank]"},
                {"role": "tool", "content": f"Results: {item} blue power bank $30"},
                {"role": "assistant", "content": f"click[{item}]"},
                {"role": "tool", "content": page},
                {"role": "assistant", "content": "buy"}]
    return {"pair_id": 100, "prompt": [SYSTEM, USER],
            "chosen": episode("P0001", "blue power bank, 2 pack. click buy to buy"),
            "rejected": episode("P0009", "red power bank. Options: color [red]")}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


# ---- the loss ----------------------------------------------------------------------------------
def test_dpo_loss_equals_hand_computed_values():
    pc, pr = torch.tensor([-10.0, -4.0]), torch.tensor([-12.0, -3.0])
    rc, rr = torch.tensor([-11.0, -5.0]), torch.tensor([-11.5, -2.0])
    beta = 0.5
    # pair 0: h = (-10 + 11) - (-12 + 11.5) = 1.5; pair 1: h = (-4 + 5) - (-3 + 2) = 2.0
    out = dpo_loss(pc, pr, rc, rr, beta=beta)
    expected = [math.log1p(math.exp(-0.75)), math.log1p(math.exp(-1.0))]  # -log sigmoid(beta h)
    assert out.losses.tolist() == pytest.approx(expected, rel=1e-6)
    assert out.chosen_rewards.tolist() == pytest.approx([0.5, 0.5])
    assert out.rejected_rewards.tolist() == pytest.approx([-0.25, -0.5])
    ipo = dpo_loss(pc, pr, rc, rr, beta=beta, kind="ipo")
    assert ipo.losses.tolist() == pytest.approx([(1.5 - 1.0) ** 2, (2.0 - 1.0) ** 2])
    rpo = dpo_loss(pc, pr, rc, rr, beta=beta, kind="rpo", rpo_alpha=2.0,
                   chosen_tokens=torch.tensor([5.0, 4.0]))
    assert rpo.losses.tolist() == pytest.approx([expected[0] + 2 * 10 / 5, expected[1] + 2 * 4 / 4])
    with pytest.raises(ValueError, match="chosen_tokens"):
        dpo_loss(pc, pr, rc, rr, beta=beta, kind="rpo")


def test_sft_loss_is_mean_nll_per_action_token_of_the_step():
    assert sft_loss(torch.tensor([-6.0, -2.0]), total_tokens=16).item() == pytest.approx(0.5)


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError, match="unknown policy 'dpo'"):
        TrainConfig(policies=["dpo"])
    with pytest.raises(ValueError, match="train.loss"):
        TrainConfig(loss="hinge")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)


# ---- packing -----------------------------------------------------------------------------------
def plain_logps(model, seq) -> float:
    """Summed action log-prob of one sequence by a plain full forward."""
    with torch.no_grad():
        logp = model(torch.tensor([seq.ids])).logits[0, :-1].float().log_softmax(-1)
    picked = logp.gather(1, torch.tensor(seq.ids[1:])[:, None])[:, 0]
    return float((picked * torch.tensor(seq.mask[1:])).sum())


def test_packed_logps_equal_separate_forwards(tiny, tokenizer):
    items = [encode_pair(tokenizer, step_pair(i)) for i in range(3)]
    items.append(encode_pair(tokenizer, trajectory_pair()))
    seqs = [s for item in items for s in item]
    packed = pack(seqs)
    # shared prompts are computed once: far fewer tokens than the sequences hold
    assert packed.ids.shape[1] < 0.6 * sum(len(s.ids) for s in seqs)
    with torch.no_grad():
        got = sequence_logps(tiny, packed).tolist()
    assert got == pytest.approx([plain_logps(tiny, s) for s in seqs], abs=1e-4)


def test_a_sequence_is_packed_only_up_to_its_last_action_token(tiny, tokenizer):
    """The episode's last observation feeds no loss: it is left out of the forward, and the
    log-probs are those of the whole sequence."""
    pair = trajectory_pair()
    done = {"role": "tool", "content": "You bought P0001 blue power bank. Done. " * 5}
    seq = encode_example(tokenizer, {"messages": pair["prompt"] + pair["chosen"] + [done],
                                     "info": {"prompt_messages": len(pair["prompt"])}})
    last = max(i for i, m in enumerate(seq.mask) if m)
    assert len(seq.ids) - last > 30  # the observation and end-of-turn tokens
    packed = pack([seq])
    assert packed.ids[0].tolist() == seq.ids[:last]
    with torch.no_grad():
        got = sequence_logps(tiny, packed).item()
    assert got == pytest.approx(plain_logps(tiny, seq), abs=1e-4)


def dense_logps(model, packed) -> torch.Tensor:
    """The packed forward with one dense (L, L) additive mask through SDPA: the oracle of the
    blocked trie attention (it was sequence_logps before it)."""
    keep, where = torch.unique(packed.rows, return_inverse=True)
    bias = torch.zeros(packed.allowed.shape).masked_fill_(~packed.allowed, torch.finfo().min)
    logits = model(input_ids=packed.ids, position_ids=packed.positions, use_cache=False,
                   attention_mask=bias[None, None], logits_to_keep=keep).logits[0]
    token_logps = logits[where, packed.targets] - logits.logsumexp(-1)[where]
    return torch.zeros(packed.num_seqs).index_add(0, packed.owner, token_logps)


def test_blocked_trie_attention_equals_one_dense_mask_in_value_and_gradient(tiny_model_dir,
                                                                            tokenizer,
                                                                            monkeypatch):
    from transformers import AutoModelForCausalLM

    from offline_agent.training import trie_attention
    from offline_agent.training.model import add_lora

    monkeypatch.setattr(trie_attention, "BLOCK", 16)  # many blocks on a small trie
    items = [encode_pair(tokenizer, step_pair(i)) for i in range(3)]
    packed = pack([s for item in items for s in item] + list(encode_pair(tokenizer,
                                                                         trajectory_pair())))
    plan = trie_attention.plan(packed.allowed, torch.float32, "cpu")
    assert len(plan.sizes) > 4
    scored = sum(b.numel() for b in plan.biases)
    assert scored < 0.6 * packed.allowed.numel()  # masked keys of other branches not scored
    cfg = TrainConfig(lora_r=4)
    model = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg)
    for p in model.parameters():  # LoRA B is zero at init: give the adapter a gradient path
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    grads = []
    for run in (sequence_logps, dense_logps):
        model.zero_grad()
        logps = run(model, packed)
        (logps * torch.linspace(-1, 1, len(logps))).sum().backward()
        grads.append((logps.detach(), torch.cat([p.grad.flatten() for p in model.parameters()
                                                 if p.requires_grad])))
    (blocked, g_blocked), (dense, g_dense) = grads
    assert blocked.tolist() == pytest.approx(dense.tolist(), abs=1e-4)
    assert (g_blocked - g_dense).abs().max() <= 1e-4 * g_dense.abs().max()
    ids = packed.ids[:, :40]  # afterwards a plain forward is SDPA's, as before
    with torch.no_grad():
        after = model(ids).logits
        model.config._attn_implementation = "sdpa"
        assert (model(ids).logits == after).all()


def test_groups_respect_the_token_budget(tokenizer):
    items = [list(encode_pair(tokenizer, step_pair(i))) for i in range(6)]
    one = len(pack(items[0]).ids[0])
    out = groups(items, budget=one + 20)  # room for a pair and a bit
    assert [i for g in out for i in g] == list(range(6))
    assert all(len(pack([s for i in g for s in items[i]]).ids[0]) <= one + 20 for g in out)
    assert len(out) > 1
    assert groups(items, budget=1) == [[i] for i in range(6)]  # too big: each goes alone


def test_groups_count_a_sequence_without_action_tokens_whole():
    """The learned critic budgets its states (no action tokens) with `groups`."""
    items = [[Encoded(list(range(i * 10, i * 10 + 10)), [])] for i in range(4)]
    assert groups(items, budget=25) == [[0, 1], [2, 3]]


def test_trajectory_logprob_is_sum_over_action_tokens_by_a_plain_loop_over_turns(tiny, tokenizer):
    """Observations are context, never targets: each action's tokens given everything before."""
    pair = trajectory_pair()
    chosen, _ = encode_pair(tokenizer, pair)
    with torch.no_grad():
        packed = sequence_logps(tiny, pack([chosen]))[0].item()
    conversation = messages(pair["prompt"] + pair["chosen"])
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    total, actions = 0.0, 0
    for i, m in enumerate(conversation):
        if m.role != "assistant":
            continue
        context = encode_prompt(tokenizer, render_prompt(tokenizer, conversation[:i]))
        action = tokenizer(m.content, add_special_tokens=False).input_ids + [end]
        for t, token in enumerate(action):
            with torch.no_grad():
                logits = tiny(torch.tensor([context + action[:t]])).logits[0, -1]
            total += logits.float().log_softmax(-1)[token].item()
        actions += len(action)
    assert chosen.action_tokens == actions
    assert packed == pytest.approx(total, abs=1e-4)


def test_step_pair_trains_on_the_generated_ids_in_the_policys_context(tiny, tokenizer):
    """An action sampled as ids that are not the tokenizer's split of its text ("click" as
    one token per letter) is scored on those ids, given the prompt as the policy saw it."""
    pair = step_pair(1)
    text = pair["chosen"][0]["content"]
    generated = [i for ch in text for i in tokenizer(ch, add_special_tokens=False).input_ids]
    assert generated != tokenizer(text, add_special_tokens=False).input_ids
    pair["chosen"][0]["token_ids"] = generated
    earlier = pair["prompt"][2]  # the prompt's actions are context: their text counts
    earlier["token_ids"] = [i for ch in earlier["content"]
                            for i in tokenizer(ch, add_special_tokens=False).input_ids]
    chosen, rejected = encode_pair(tokenizer, pair)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert [t for t, m in zip(chosen.ids, chosen.mask) if m] == generated + [end]
    context = encode_prompt(tokenizer, render_prompt(tokenizer, messages(pair["prompt"])))
    assert chosen.ids[:len(context)] == context == rejected.ids[:len(context)]
    with torch.no_grad():
        packed = sequence_logps(tiny, pack([chosen]))[0].item()
        logits = tiny(torch.tensor([context + generated])).logits[0, len(context) - 1:]
    logps = logits.float().log_softmax(-1)
    loop = sum(logps[t, token].item() for t, token in enumerate(generated + [end]))
    assert packed == pytest.approx(loop, abs=1e-4)


# ---- gradients ---------------------------------------------------------------------------------
def final_hidden_grads(model, seqs, loss_of):
    """Gradient of the loss w.r.t. each trie token's final hidden state (what feeds the LM head
    only at that token): zero exactly where the next token is not an action token."""
    captured = {}

    def hook(module, args, out):
        out.retain_grad()
        captured["h"] = out

    handle = model.get_decoder().norm.register_forward_hook(hook)
    packed = pack(seqs)
    try:
        loss_of(sequence_logps(model, packed)).backward()
    finally:
        handle.remove()
    return packed, captured["h"].grad[0].abs().sum(-1)


@pytest.mark.parametrize("objective", ["dpo", "rft"])
def test_gradient_is_exactly_zero_on_every_masked_token(tiny_model_dir, tokenizer, objective):
    from transformers import AutoModelForCausalLM

    from offline_agent.training.model import add_lora

    model = add_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir), TrainConfig())
    if objective == "dpo":
        seqs = [*encode_pair(tokenizer, step_pair(1)), *encode_pair(tokenizer, trajectory_pair())]

        def loss_of(lp):  # reference = policy (h = 0): the loss is far from saturated
            ref = lp.detach()
            return dpo_loss(lp[0::2], lp[1::2], ref[0::2], ref[1::2], beta=0.1).losses.sum()
    else:
        pair = trajectory_pair()
        seqs = [encode_example(tokenizer, {"messages": pair["prompt"] + pair["chosen"],
                                           "info": {"prompt_messages": len(pair["prompt"])}})]

        def loss_of(lp):
            return sft_loss(lp, total_tokens=10)

    packed, grads = final_hidden_grads(model, seqs, loss_of)
    predicts_action = torch.zeros(packed.ids.shape[1], dtype=torch.bool)
    predicts_action[packed.rows] = True
    assert (grads[~predicts_action] == 0).all()  # prompt, observations: exactly zero
    # An action token that chosen and rejected share (same token after the same prefix:
    # "click[" of click[P0001] / click[back]) enters h with +1 and -1 and cancels exactly;
    # every other action token carries gradient.
    targets = list(zip(packed.rows.tolist(), packed.targets.tolist()))
    once = [row for row, t in targets if targets.count((row, t)) == 1]
    assert len(once) > 5 and (grads[once] > 0).all()
    lora = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert lora and any(g is not None and g.abs().sum() > 0 for g in lora)
    assert all(p.grad is None for n, p in model.named_parameters() if "lora_" not in n)


def test_rft_never_trains_on_the_demonstrations_actions(tokenizer):
    """An RFT example starts with the env's worked demonstration (real assistant turns): only
    the actions after the prompt are the policy's own and carry loss."""
    chat = [{"role": "system", "content": "You shop."},
            {"role": "user", "content": "Demo task"}, {"role": "assistant", "content": "search[demo]"},
            {"role": "tool", "content": "Results"},
            {"role": "user", "content": "Real task"}, {"role": "assistant", "content": "buy"},
            {"role": "tool", "content": "Bought"}]
    enc = encode_example(tokenizer, {"messages": chat, "info": {"prompt_messages": 5}})
    trained = tokenizer.decode([i for i, m in zip(enc.ids, enc.mask) if m])
    assert trained.startswith("buy") and "demo" not in trained
    old_row = encode_example(tokenizer, {"messages": chat})  # mined before the count was kept
    assert "search[demo]" in tokenizer.decode([i for i, m in zip(old_row.ids, old_row.mask) if m])


# ---- QLoRA's requirement, the adapter's card ---------------------------------------------------
def test_qlora_without_bitsandbytes_is_one_line_naming_the_extra(tiny_model_dir, monkeypatch):
    import sys

    from offline_agent.training.model import load_base

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` fails
    with pytest.raises(ImportError) as err:
        load_base(tiny_model_dir, TrainConfig(quantization="4bit"), "cpu")
    assert str(err.value) == ("train.quantization=4bit (QLoRA) needs bitsandbytes, which is not "
                              "installed: pip install 'offline-agent[qlora]'")


def test_public_id_names_the_embedded_model_by_its_hub_id():
    from offline_agent.policy.models import copy_note, public_id

    assert public_id("embedded:smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert public_id("Qwen/Qwen2.5-0.5B-Instruct") == "Qwen/Qwen2.5-0.5B-Instruct"
    assert public_id("/models/mine") == "/models/mine"
    assert "Q4_1" in copy_note("embedded:smollm2-135m-instruct") and copy_note("org/m") == ""
    with pytest.raises(ValueError, match="unknown embedded model 'nope'"):
        public_id("embedded:nope")


def front_matter(card: str) -> dict:
    import yaml

    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_card_names_base_policy_run_and_config_in_peft_form():
    from offline_agent.training.card import POLICY_TEXT, Provenance, card
    from offline_agent.training.config import POLICIES

    assert set(POLICY_TEXT) == set(POLICIES)
    cfg = TrainConfig(lr=3e-4, quantization="4bit")
    stats = {"step": 7, "loss": 0.61234, "items": 12, "action_tokens": 90}
    text = card("org/base", "dpo_step", Provenance("org/base", run_id="abc123"), cfg, stats)
    header = front_matter(text)
    assert header["base_model"] == "org/base" and header["library_name"] == "peft"
    assert {"base_model:adapter:org/base", "lora", "dpo", "qlora"} <= set(header["tags"])
    assert "run `abc123`" in text and "policy\n`dpo_step`" in text and "12 pairs" in text
    assert "lr: 0.0003" in text and "0.6123" in text and "offline-agent report" in text
    assert "merged" not in text
    rft = card("org/base", "rft", Provenance("org/base"), TrainConfig(), stats)
    assert "sft" in front_matter(rft)["tags"] and "12 examples" in rft


def test_card_of_a_later_round_says_what_was_merged_into_the_base():
    from offline_agent.training.card import Provenance, card

    provenance = Provenance("org/base", ["the final adapter of policy `dpo_step`"],
                            run_id="abc123", round=2)
    stats = {"step": 1, "loss": 0.5, "items": 1, "action_tokens": 3}
    text = card("/runs/r/checkpoints/search@2/iterate", "dpo_step", provenance, TrainConfig(),
                stats)
    assert front_matter(text)["base_model"] == "org/base"
    assert "round 2" in text and "1. the final adapter of policy `dpo_step`" in text
    assert "not to the base alone" in text and "`/runs/r/checkpoints/search@2/iterate`" in text
