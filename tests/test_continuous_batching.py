"""HFPolicy's continuous batching (a finished row's slot takes the next pending row) and lazy
compaction give the completions the plain path gives, greedy and sampled."""

from __future__ import annotations

import pytest
import torch

from offline_agent.policy import Sampling
from offline_agent.policy import hf as hf_backend
from offline_agent.policy.base import Request, serve_in_lockstep
from offline_agent.policy.hf import HFPolicy

RAW = ["Hi", "The quick brown fox jumps over the lazy dog because it was bored and the dog slept",
       "Paris is", "Once upon a time in a land far away there lived a", "2+2=", "Tell me"]


@pytest.fixture(scope="module")
def policy(tiny_model_dir, tokenizer):
    """The tiny Llama with larger weights (as in test_policy: its greedy text is not one token
    repeated), no prefix cache: every prefill is computed from scratch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return HFPolicy(LlamaForCausalLM(config).eval(), tokenizer, prefix_cache_gb=0)


def sampling(temperature: float) -> Sampling:
    # stop strings end rows at different steps, so slots free up while others decode
    return Sampling(max_new_tokens=10, temperature=temperature, stop=["e", "o"],
                    seed=list(range(len(RAW))))


def ids(out):
    return [[(c.token_ids, c.text, c.finish_reason) for c in cs] for cs in out]


@pytest.fixture
def inserts(monkeypatch):
    """(running width, inserted width) of every row insertion into a running batch."""
    seen = []

    def spy(cache, mask, rows, new, new_mask):
        seen.append((mask.shape[1], new_mask.shape[1]))
        return insert(cache, mask, rows, new, new_mask)

    insert = hf_backend.insert_rows
    monkeypatch.setattr(hf_backend, "insert_rows", spy)
    return seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_refilled_slots_give_what_each_prompt_gets_alone(policy, inserts, temperature):
    policy.max_batch = 2
    try:
        together = policy.sample(RAW, 2, sampling(temperature))
    finally:
        policy.max_batch = 32
    # rows went into a running batch both longer (the batch grew on the left) and shorter
    assert any(new > old for old, new in inserts) and any(new < old for old, new in inserts)
    alone = [policy.sample([p], 2, Sampling(**{**vars(sampling(temperature)), "seed": [s]}))[0]
             for s, p in enumerate(RAW)]
    assert ids(together) == ids(alone)
    for cs, cs_alone in zip(together, alone):
        for c, a in zip(cs, cs_alone):
            assert c.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    if temperature:
        assert len({tuple(c.token_ids) for cs in together for c in cs}) > len(RAW)


@pytest.mark.parametrize("compact_at", [0.0, 0.5, 1.0])
def test_lazy_compaction_changes_no_output(policy, monkeypatch, compact_at):
    """0 drops every finished row at once (the old loop), 1 never drops one."""
    expected = policy.sample(RAW, 3, sampling(1.0))
    monkeypatch.setattr(hf_backend, "COMPACT_AT", compact_at)
    assert ids(policy.sample(RAW, 3, sampling(1.0))) == ids(expected)


def chain(prompts, turns):
    """Requests and an answer that asks each prompt's next turn (its text so far plus the
    reply) `turns` times; the completions it was handed, by (prompt, turn)."""
    got = {}

    def answer(r, completion):
        i, turn = r.key
        got[i, turn] = completion.token_ids
        if turn + 1 == turns:
            return []
        return [Request(r.prompt + completion.text + " and", seed=10 * i + turn + 1,
                        key=(i, turn + 1))]

    return [Request(p, seed=10 * i, key=(i, 0)) for i, p in enumerate(prompts)], answer, got


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_serve_equals_lockstep_sample_calls(policy, temperature):
    settings = Sampling(max_new_tokens=6, temperature=temperature, stop=["e"])
    requests, answer, lockstep = chain(RAW, 3)
    serve_in_lockstep(policy, requests, settings, answer)
    policy.max_batch = 4
    try:
        requests, answer, served = chain(RAW, 3)
        policy.serve(requests, settings, answer)
    finally:
        policy.max_batch = 32
    assert len(served) == 3 * len(RAW)
    assert served == lockstep


def test_insert_and_select_rows_keep_the_padded_layout():
    from offline_agent.policy.kv_buffer import insert_rows, new_cache, select_rows

    def cache_of(keys):  # a buffer without room
        return new_cache(1, [(keys.clone(), -keys)], filled=keys.shape[2])

    def ones(*widths):  # left-padded mask rows of `widths` real columns, as wide as the widest
        return torch.tensor([[0] * (max(widths) - w) + [1] * w for w in widths])

    torch.manual_seed(0)
    a, b, c = torch.randn(2, 1, 3, 2), torch.randn(1, 1, 5, 2), torch.randn(1, 1, 2, 2)
    cache = cache_of(a)
    mask = insert_rows(cache, ones(3, 3), [1], cache_of(b), torch.tensor([[0, 1, 1, 1, 1]]))
    layer, zero = cache.layers[0], torch.zeros(1, 2, 2)
    assert mask.tolist() == [[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]]
    assert torch.equal(layer.keys[0], torch.cat([zero, a[0]], 1)) and torch.equal(layer.keys[1], b[0])
    assert torch.equal(layer.values[1], -b[0])
    buffer = layer._k
    mask = insert_rows(cache, mask, [0], cache_of(c), ones(2))  # shorter
    assert mask.tolist() == [[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]]
    assert torch.equal(layer.keys[0, :, 3:], c[0]) and layer._k is buffer
    d = torch.randn(1, 1, 7, 2)
    mask = insert_rows(cache, mask, [0], cache_of(d), ones(7))  # longer: room on the left
    assert layer._k is buffer, "the room left of the cache takes a longer row in place"
    assert torch.equal(layer.keys[0], d[0]) and torch.equal(layer.keys[1, :, 2:], b[0])
    assert mask.tolist() == [[1] * 7, [0, 0, 0, 1, 1, 1, 1]]
    assert layer.update(torch.ones(2, 1, 1, 2), torch.ones(2, 1, 1, 2))[0].shape[2] == 8
    mask = select_rows(cache, torch.cat([mask, torch.ones(2, 1, dtype=mask.dtype)], 1), [1])
    assert mask.tolist() == [[1] * 5] and torch.equal(layer.keys[0, :, :4], b[0, :, 1:])
