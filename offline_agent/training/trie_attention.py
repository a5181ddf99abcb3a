"""Attention over a flattened prefix trie that scores only the keys a query may attend to.

A packed row (logprobs.pack) holds L trie nodes; each attends to its ancestors only, and
they all come before it. A dense masked attention still scores every query against all L
keys, masked or not: on 8 MiniShop step pairs (L = 2,511) most of those scores are masked
(each pair's branch sees the shared system prompt and demonstration and its own history,
never another pair's). Here the row is cut into blocks of consecutive query nodes; a block
scores only the keys some node of it may attend to (the union of their ancestors), with
the same additive mask restricted to those keys. Each query sees the same keys with the
same mask as before, so the outputs are the same up to float summation order.

The blocks reach the attention layers as a keyword argument of the model's forward
(transformers passes its extra keyword arguments down to the attention function), under
the attention implementation "trie", which `use` sets on the model for good: a forward
without blocks (a plain forward, a recomputation outside the packed call) runs exactly
SDPA's attention and mask, and gradient checkpointing's recomputation in backward, which
calls the layer again with the same keyword arguments, runs the same blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "trie"
BLOCK = 128  # query nodes per block; benchmarks/dpo_step.py measured 64-512 (docs/training.md)


@dataclass
class Block:
    """Consecutive query nodes, the keys any of them attends to, and their additive mask."""

    queries: slice
    keys: slice | torch.Tensor  # key nodes: a range where they are consecutive, else indices
    bias: torch.Tensor  # (1, 1, Q, K): 0 where the query attends to the key, dtype min elsewhere


def plan(allowed: torch.Tensor, dtype: torch.dtype, device) -> list[Block]:
    """Blocks of BLOCK query nodes covering the (L, L) ancestor mask `allowed`."""
    out = []
    for start in range(0, len(allowed), BLOCK):
        rows = allowed[start:start + BLOCK]
        keys = rows.any(0).nonzero().squeeze(1)
        bias = torch.zeros(rows.shape[0], len(keys), dtype=dtype)
        bias.masked_fill_(~rows[:, keys], torch.finfo(dtype).min)
        first, last = keys[0].item(), keys[-1].item()
        span = slice(first, last + 1) if last - first + 1 == len(keys) else keys.to(device)
        out.append(Block(slice(start, start + rows.shape[0]), span, bias[None, None].to(device)))
    return out


def attention(module, query, key, value, attention_mask, dropout: float = 0.0,
              scaling: float | None = None, trie_blocks: list[Block] | None = None, **kwargs):
    """transformers' attention-function signature; query (1, H, L, D), key/value (1, KV, L, D).
    Without blocks: SDPA's attention and mask, as the model had before `use`. With them,
    `attention_mask` (what transformers made of the trie's position ids, taking them for
    packed sequences) is not the trie's and is not used: the blocks hold the mask."""
    if trie_blocks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    gqa = module.num_key_value_groups > 1  # SDPA's CPU kernel shares each key head itself
    outs = []
    for b in trie_blocks:
        if isinstance(b.keys, slice):  # a view: no copy kept for backward
            k, v = key[:, :, b.keys], value[:, :, b.keys]
        else:
            k, v = key.index_select(2, b.keys), value.index_select(2, b.keys)
        outs.append(F.scaled_dot_product_attention(query[:, :, b.queries], k, v, attn_mask=b.bias,
                                                   dropout_p=dropout, scale=scaling,
                                                   enable_gqa=gqa))
    return torch.cat(outs, 2).transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, sdpa_mask)


def use(model) -> None:
    """Make the model's attention this module's (SDPA's where a forward passes no blocks)."""
    model.config._attn_implementation = NAME
