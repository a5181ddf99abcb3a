"""SDPA attention for grouped-query models without repeating the keys and values.

transformers' sdpa path repeats K/V n_rep times (SmolLM2: 9 query heads on 3 KV heads) whenever
more than one query token comes with a mask, on CPU and CUDA: every prefill of a batch of
prompts and every scoring forward against a cache of ~1,000 tokens. That copy of the whole
cache, per layer and per forward, took ~11% of search time on CPU (py-spy of `make demo`).
torch's SDPA takes the unrepeated K/V with `enable_gqa=True`, masked or not; on this CPU its
output is bit-identical to the repeated one's and it is faster at search's shapes.
Gradients go through the same op, so a model trained while an HFPolicy holds it learns
the same. A single query token or no mask goes to transformers' own path, which avoids the
repeat there already (pack_gqa, or enable_gqa when no mask).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "sdpa_gqa"


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                       value: torch.Tensor, attention_mask: torch.Tensor | None,
                       dropout: float = 0.0, scaling: float | None = None, **kwargs):
    """transformers' attention-function contract: query [B, H, q, D], key/value [B, KV, k, D],
    mask [B, 1, q, k] (bool or additive) or None. Returns [B, q, H, D] and no weights."""
    if module.num_key_value_groups == 1 or query.shape[2] == 1 or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, gqa_sdpa_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the same masks as sdpa


def use_gqa_sdpa(model) -> None:
    """Switch a CPU model on transformers' sdpa attention to this one (the same function of
    its inputs). Left as they are: other implementations (eager, flash) and CUDA models, where
    SDPA's masked GQA falls back to the math kernel (transformers' use_gqa_in_sdpa) and this
    has not been measured."""
    if model.device.type == "cpu" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(NAME)
