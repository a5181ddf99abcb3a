"""choice_logprobs' tree layout and the GQA attention: equal to the plain computation."""

from __future__ import annotations

import pytest
import torch

from offline_agent.policy.attention import NAME, gqa_sdpa_attention
from offline_agent.policy.base import encode_prompt
from offline_agent.policy.choices import choice_tree


@pytest.fixture(scope="module")
def policy(small_block_policy):
    return small_block_policy


def naive(model, prompt_ids, choice_ids):
    """Summed log-prob of choice_ids after prompt_ids: one plain forward, no cache, no mask."""
    ids = torch.tensor([prompt_ids + choice_ids])
    with torch.no_grad():
        logp = model(ids).logits[0].float().log_softmax(-1)
    return sum(logp[len(prompt_ids) - 1 + i, t].item() for i, t in enumerate(choice_ids))


def test_choice_tree_layout():
    tree = choice_tree([7, 8], [[(1, 2, 3), (4,), ()], [(5, 6)]], pad=0)
    assert tree.tokens.tolist() == [[7, 1, 2], [8, 5, 0]]
    assert tree.depth.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert tree.mask[0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert tree.mask[1].int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]  # pad: itself only
    assert tree.target.tolist() == [1, 2, 3, 4, 5, 6]
    assert tree.predictor.tolist() == [0, 1, 2, 0, 3, 4]  # row 1 starts at flat index 3
    assert tree.choice.tolist() == [0, 0, 0, 1, 3, 3] and tree.num_choices == 4


def test_tree_choices_equal_plain_forwards(policy, tokenizer):
    """Prompts sharing a prefix (one extends another, one repeats), choices of 0 to many
    tokens, some shared between prompts: each value is that of a plain forward without cache,
    warm prefix cache or cold, whatever the chunking."""
    system = {"role": "system", "content": "You are an agent. Tools: search(query), open(url)."}
    base = tokenizer.apply_chat_template(
        [system, {"role": "user", "content": "Find the population of Paris."}],
        tokenize=False, add_generation_prompt=True)
    prompts = [base, base + 'search[paris]<|im_end|>\n<|im_start|>user\n2.1 million', "Hi", base,
               "Nothing to score"]
    choices = [["A", "B", "C"], ['{"tool": "search", "arguments": {}}', "B", "", "no"],
               ["a long continuation of many tokens, longer than the others", "A"],
               ["B", "click[red]"], []]
    plain = policy.model
    want = [[naive(plain, encode_prompt(tokenizer, p), tokenizer(c, add_special_tokens=False)
                   .input_ids) for c in cs] for p, cs in zip(prompts, choices)]
    policy.clear_cache()
    for max_batch in (32, 1, 3):
        policy.max_batch = max_batch
        try:
            got = policy.choice_logprobs(prompts, choices)
        finally:
            policy.max_batch = 32
        for g, w in zip(got, want):
            assert g == pytest.approx(w, abs=1e-4)
        assert got[1][2] == 0.0 and got[4] == []
    assert len(policy.prefix_cache) > 0


def test_gqa_attention_equals_sdpa_with_gradients():
    """Grouped queries against unrepeated K/V: transformers' sdpa result and gradients."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    query = torch.randn(2, 6, 5, 8, requires_grad=True)
    key = torch.randn(2, 2, 9, 8, requires_grad=True)
    value = torch.randn(2, 2, 9, 8, requires_grad=True)
    mask = torch.rand(2, 1, 5, 9) > 0.3
    mask[..., 0] = True
    outs = []
    for attend in (sdpa_attention_forward, gqa_sdpa_attention):
        out, _ = attend(module, query, key, value, mask, scaling=0.3)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(),
                                    (query, key, value))
        outs.append((out, *grads))
    for ours, theirs in zip(*outs):
        assert torch.allclose(ours, theirs, rtol=1e-4, atol=1e-5)


def test_policy_model_uses_gqa_attention_and_trains_the_same(policy, tiny_model_dir):
    """HFPolicy switches its sdpa model to the GQA function; a training step's loss and
    gradients on that model are those of the plain sdpa model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    assert policy.model.config._attn_implementation == NAME
    config = LlamaConfig.from_pretrained(tiny_model_dir)
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(policy.model.state_dict())
    assert plain.config._attn_implementation == "sdpa"
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 0, 0]])
    mask = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    labels = ids.masked_fill(mask == 0, -100)
    results = []
    for model in (plain, policy.model):
        model.zero_grad()
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        results.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    policy.model.zero_grad()
    assert results[0][0] == pytest.approx(results[1][0], abs=1e-6)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, atol=1e-5)
