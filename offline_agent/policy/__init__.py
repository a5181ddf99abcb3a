"""Generation backends behind one small contract (base.Policy), and model resolution.

Backends are imported on first use: importing this package pulls in neither transformers
models nor vLLM.
"""

from __future__ import annotations

from .base import Completion, Policy, Sampling
from .models import DEFAULT_MODEL, resolve_model

__all__ = ["DEFAULT_MODEL", "Completion", "Policy", "Sampling", "load_policy", "resolve_model"]


def load_policy(id: str, backend: str = "hf", device: str = "auto", dtype: str = "auto",
                max_batch: int = 32, adapter: str | None = None, seed: int = 0,
                prefix_cache_gb: float = 2.0, constrain: str = "none") -> Policy:
    """A policy on model `id` (embedded:<name>, a local folder or a Hub repo id).

    backend: "hf" (transformers, CPU or GPU) or "vllm" (GPU). device "auto" means cuda if
    available, else cpu. dtype "auto" means bfloat16 on cuda, float32 on cpu. adapter: a PEFT
    LoRA folder to apply on top. seed: seeds the calls whose Sampling.seed is None.
    prefix_cache_gb: memory the hf backend keeps for the KV of prompt prefixes it has seen
    (vLLM sizes its own prefix cache). constrain: "none" (free text) or "tools" (a reply asked
    with Sampling.tools is one call of those tools, policy/grammar.py).
    """
    if constrain not in ("none", "tools"):
        raise ValueError(f"constrain must be 'none' or 'tools', got {constrain!r}")
    if backend == "hf":
        from .hf import HFPolicy

        return HFPolicy.from_pretrained(id, device=device, dtype=dtype, adapter=adapter,
                                        max_batch=max_batch, seed=seed,
                                        prefix_cache_gb=prefix_cache_gb, constrain=constrain)
    if backend == "vllm":
        from .vllm import VLLMPolicy

        return VLLMPolicy(id, device=device, dtype=dtype, adapter=adapter, max_batch=max_batch,
                          seed=seed, constrain=constrain)
    raise ValueError(f"unknown policy backend {backend!r}: use 'hf' or 'vllm'")
