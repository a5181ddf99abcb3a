"""Prefix cache: exact block lookups, LRU budget, and the same samples warm as cold."""

from __future__ import annotations

import pytest
import torch

from offline_agent.policy import Sampling
from offline_agent.policy.prefix_cache import PrefixCache


def kv(n: int, offset: float = 0.0) -> torch.Tensor:
    """Fake keys for n tokens: [layers=2, heads=1, n, dim=3], value = position + offset."""
    return (torch.arange(n, dtype=torch.float32) + offset)[None, None, :, None].expand(2, 1, n, 3)


def test_match_store_gather_and_lru():
    cache = PrefixCache(block_size=2, max_bytes=10**9)
    cache.store([1, 2, 3, 4, 5], kv(5), kv(5))  # two whole blocks; the 5th token is not kept
    assert len(cache) == 2
    assert len(cache.match([1, 2, 3, 4, 9])) == 2
    assert len(cache.match([1, 2, 3, 9])) == 1
    assert cache.match([2, 1, 3, 4]) == []  # same tokens in another place are another block
    keys, values = cache.gather(cache.match([1, 2, 3, 4]))
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3]
    cache.store([1, 2, 7, 8], kv(4, 100), kv(4, 100))  # shares block [1, 2], keeps the old one
    assert len(cache) == 3
    keys, _ = cache.gather(cache.match([1, 2, 7, 8]))
    assert keys[0, 0, :, 0].tolist() == [0, 1, 102, 103]

    per_block = kv(2).nbytes * 2
    small = PrefixCache(block_size=2, max_bytes=2 * per_block)
    small.store([1, 2, 3, 4], kv(4), kv(4))
    small.match([1, 2])  # block [1, 2] is now the most recently used
    small.store([5, 6], kv(2), kv(2))  # over budget: the least recently used block goes
    assert small.bytes <= 2 * per_block
    assert len(small.match([1, 2, 3, 4])) == 1 and len(small.match([5, 6])) == 1


def test_store_from_a_cached_prefix_takes_only_the_new_part():
    cache = PrefixCache(block_size=2, max_bytes=10**9)
    cache.store([1, 2], kv(2), kv(2))
    cache.store([1, 2, 3, 4, 5, 6], kv(4, 2), kv(4, 2), start=2)  # keys of tokens 3..6 only
    keys, _ = cache.gather(cache.match([1, 2, 3, 4, 5, 6]))
    assert keys[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5]
    fresh = PrefixCache(block_size=2, max_bytes=10**9)  # the prefix was dropped meanwhile:
    fresh.store([1, 2, 3, 4], kv(2, 2), kv(2, 2), start=2)  # its tail is unreachable, not kept
    assert len(fresh) == 0


@pytest.fixture(scope="module")
def policy(small_block_policy):
    return small_block_policy


def test_warm_cache_gives_the_cold_results(policy, tokenizer):
    """Prompts that extend earlier ones (the next step of an episode), in one batch with a
    prompt the cache has never seen: the same tokens and log-probs as with an empty cache."""
    base = tokenizer.apply_chat_template(
        [{"role": "system", "content": "You are an agent. Tools: search(query), open(url)."},
         {"role": "user", "content": "Find the population of Paris."}],
        tokenize=False, add_generation_prompt=True)
    longer = base + "search[paris population]<|im_end|>\n<|im_start|>user\nParis: 2.1 million"
    other = "An unrelated prompt that shares nothing with the others at all"
    greedy = Sampling(max_new_tokens=8, temperature=0)
    sampled = Sampling(max_new_tokens=8, temperature=1.0, seed=[3, 4, 5])

    policy.clear_cache()
    cold = [policy.sample([p], 1, greedy)[0][0] for p in (longer, base, other)]
    policy.clear_cache()
    policy.sample([base], 1, greedy)  # fills the cache with the base prompt's blocks
    assert len(policy.prefix_cache) > 0
    warm = policy.sample([longer, base, other], 1, greedy)
    for c, (w,) in zip(cold, warm):
        assert w.token_ids == c.token_ids
        assert w.logprobs == pytest.approx(c.logprobs, abs=1e-4)

    policy.clear_cache()
    cold = policy.sample([longer, base, other], 2, sampled)
    warm = policy.sample([longer, base, other], 2, sampled)  # everything cached now
    assert [[c.token_ids for c in cs] for cs in warm] == [[c.token_ids for c in cs] for cs in cold]


def test_roomy_layer_behaves_like_dynamic_layer():
    from transformers.cache_utils import DynamicLayer

    from offline_agent.policy.kv_buffer import HEADROOM, RoomyLayer

    torch.manual_seed(0)
    ours, theirs = RoomyLayer(), DynamicLayer()
    steps = [torch.randn(3, 2, n, 4) for n in (5, 1, 1, HEADROOM, 1)]  # the 4th overflows the room
    for i, x in enumerate(steps):
        if i == 2:  # rows finish: select, as the decode loop does
            index = torch.tensor([0, 2])
            ours.batch_select_indices(index)
            theirs.batch_select_indices(index)
            x = x[:2]
        if i > 2:
            x = x[:2]
        k1, v1 = ours.update(x, -x)
        k2, v2 = theirs.update(x, -x)
        assert torch.equal(k1, k2) and torch.equal(v1, v2)
        assert ours.get_seq_length() == theirs.get_seq_length()
    buffer = ours._k
    ours.update(steps[-1][:2], -steps[-1][:2])
    assert ours._k is buffer, "a step within the room writes in place"


def test_zero_budget_keeps_nothing_and_changes_nothing(policy):
    prompt = "An unrelated prompt that shares nothing with the others at all, long enough for blocks"
    greedy = Sampling(max_new_tokens=6, temperature=0)
    policy.clear_cache()
    with_cache = policy.sample([prompt], 1, greedy)[0][0]
    kept = policy.prefix_cache
    policy.prefix_cache = PrefixCache(block_size=4, max_bytes=0)
    try:
        without = policy.sample([prompt], 1, greedy)[0][0]
        assert len(policy.prefix_cache) == 0
    finally:
        policy.prefix_cache = kept
    assert without.token_ids == with_cache.token_ids


def test_adopted_buffer_is_written_in_place():
    from offline_agent.policy.kv_buffer import new_cache

    buffer = torch.zeros(2, 1, 10, 3)
    buffer[:, :, :4] = 1.0
    cache = new_cache(1, [(buffer, buffer.clone())], filled=4)
    assert cache.get_seq_length() == 4
    keys, _ = cache.layers[0].update(torch.full((2, 1, 3, 3), 2.0), torch.zeros(2, 1, 3, 3))
    assert keys.shape[2] == 7 and cache.layers[0]._k is buffer
    assert buffer[0, 0, :, 0].tolist() == [1, 1, 1, 1, 2, 2, 2, 0, 0, 0]
