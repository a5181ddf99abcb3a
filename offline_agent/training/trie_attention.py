"""Attention over a flattened prefix trie that scores only the keys a query may attend to.

A packed row (logprobs.pack) holds L trie nodes; each attends to its ancestors only, and
they all come before it. A dense masked attention still scores every query against all L
keys, masked or not: on 8 MiniShop step pairs (L = 2,511) most of those scores are masked
(each pair's branch sees the shared system prompt and demonstration and its own history,
never another pair's). Here the row is cut into blocks of consecutive query nodes (a pair's
branch, the shared prefix, at most BLOCK nodes each); a block scores only the keys some
node of it may attend to (the union of their ancestors), with the same additive mask
restricted to those keys. Each query sees the same keys with the
same mask as before, so the outputs are the same up to float summation order.

The plan reaches the attention layers as a keyword argument of the model's forward
(transformers passes its extra keyword arguments down to the attention function), under
the attention implementation "trie", which `use` sets on the model for good: a forward
without a plan (a plain forward) runs exactly SDPA's attention and mask, and gradient
checkpointing's recomputation in backward, which calls the layer again with the same
keyword arguments, runs the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "trie"
BLOCK = 512  # most query nodes per block (docs/training.md: what was measured)


@dataclass
class Plan:
    """The row cut into blocks of consecutive query nodes, each with the keys any of its
    nodes attends to and their additive mask. The keys of all blocks are gathered by one
    index and split per block (and the queries split), so backward adds each block's
    gradient back with one scatter and one concatenation per layer, not one full-size
    tensor per block."""

    sizes: list[int]            # query nodes per block, in row order
    keys: torch.Tensor          # (sum of counts,) key node indices, block after block
    counts: list[int]           # keys per block
    biases: list[torch.Tensor]  # (1, 1, size, count): 0 where attended, dtype min elsewhere


def plan(allowed: torch.Tensor, dtype: torch.dtype, device) -> Plan:
    """Blocks covering the (L, L) ancestor mask `allowed`: a block ends before a node whose
    parent lies before the block's start (a new branch off an earlier one: another pair's
    history), or at BLOCK nodes. So a pair's branch, its rejected action included (whose
    ancestors the block already holds), is one block that gathers the shared prefix once."""
    sizes, keys, biases, start = [], [], [], 0
    for end in [*starts(allowed), len(allowed)]:
        rows = allowed[start:end]
        mine = rows.any(0).nonzero().squeeze(1)
        bias = torch.zeros(rows.shape[0], len(mine), dtype=dtype)
        bias.masked_fill_(~rows[:, mine], torch.finfo(dtype).min)
        sizes.append(rows.shape[0])
        keys.append(mine)
        biases.append(bias[None, None].to(device))
        start = end
    return Plan(sizes, torch.cat(keys).to(device), [len(k) for k in keys], biases)


def starts(allowed: torch.Tensor) -> list[int]:
    """First node of every block after the first (see plan)."""
    n = len(allowed)
    earlier = allowed & torch.ones(n, n, dtype=torch.bool).tril(-1)
    # a node's parent: its last ancestor before it (-1 for a root)
    parent = torch.where(earlier.any(1), n - 1 - earlier.flip(1).int().argmax(1), -1).tolist()
    out, start = [], 0
    for node in range(1, n):
        if parent[node] < start or node - start == BLOCK:
            out.append(node)
            start = node
    return out


def attention(module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, trie_plan: Plan | None = None, **kwargs):
    """transformers' attention-function signature; query (1, H, L, D), key/value (1, KV, L, D).
    Without a plan: SDPA's attention and mask, as the model had before `use`. With one,
    `attention_mask` (what transformers made of the trie's position ids, taking them for
    packed sequences) is not the trie's and is not used: the plan holds the mask."""
    if trie_plan is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    p = trie_plan
    ks = key.index_select(2, p.keys).split(p.counts, 2)
    vs = value.index_select(2, p.keys).split(p.counts, 2)
    gqa = module.num_key_value_groups > 1  # SDPA's CPU kernel shares each key head itself
    outs = [F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout,
                                           scale=scaling, enable_gqa=gqa)
            for q, k, v, bias in zip(query.split(p.sizes, 2), ks, vs, p.biases)]
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use(model) -> None:
    """Make the model's attention this module's (SDPA's where a forward passes no plan)."""
    model.config._attn_implementation = NAME
