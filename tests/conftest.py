"""Shared fixtures: the embedded model's real tokenizer and a tiny random Llama built in-process."""

from __future__ import annotations

import os
import sys
from types import ModuleType, SimpleNamespace

import pytest

# Before torch loads: idle OpenMP threads must sleep, not spin. With spinning threads, a
# 2-core machine shared with a subprocess (the search resume test) runs ~40x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_collection_modifyitems(items):
    """Files marked `slow` first. `make test` runs `-n 2 --dist loadfile`: each worker takes
    whole files in collection order, so a long file collected last (alphabetically) keeps one
    worker busy while the other idles. Longest first lets both end together."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def embedded_dir() -> str:
    """Folder of the embedded SmolLM2 model (converted from GGUF once, then cached)."""
    from offline_agent.policy.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tokenizer(embedded_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A 2-layer random Llama with SmolLM2's tokenizer and chat template, saved to disk."""
    from offline_agent.envs.testing.grammar_check import tiny_model

    model = tiny_model(tokenizer, seed=0)
    out = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def mined_run(tmp_path_factory):
    """A scripted MiniShop run through mine and export, read by two test modules."""
    from tests.test_mine_stage import make_mined_run

    return make_mined_run(tmp_path_factory.mktemp("mined"))


# ---- a fake `vllm` module (vLLM needs a CUDA GPU): tests/test_vllm_policy.py, the grpo stage
@pytest.fixture(scope="session")
def scoring_model(tiny_model_dir):
    """The tiny Llama with larger weights: at the default init every log-prob is about
    -log(vocab), and a shifted read would go unnoticed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture
def fake_vllm(monkeypatch, scoring_model):
    """Install a fake `vllm` in sys.modules. Returns its record: `llms` (one per LLM built,
    each with its constructor kwargs and generate calls), `loras` (LoRARequest args) and
    `reply`, a function (prompt ids) -> (token ids, finish_reason, stop_reason) that
    sample requests answer with."""
    import torch

    fake = SimpleNamespace(llms=[], loras=[], reply=None)

    class LLM:
        def __init__(self, **kwargs):
            self.kwargs, self.calls = kwargs, []
            fake.llms.append(self)

        def generate(self, prompts, params, use_tqdm, lora_request):
            params = params if isinstance(params, list) else [params] * len(prompts)
            self.calls.append({"prompts": prompts, "params": params, "lora": lora_request})
            return [self._answer(p["prompt_token_ids"], sp) for p, sp in zip(prompts, params)]

        def _answer(self, ids, params):
            if getattr(params, "prompt_logprobs", None) is not None:
                return prompt_logprobs(ids)
            token_ids, reason, stop = fake.reply(ids)
            # vLLM returns the sampled token's log-prob and, here, a distractor entry
            steps = [{t: SimpleNamespace(logprob=-0.1 * (i + 1)), t + 1: SimpleNamespace(logprob=0.0)}
                     for i, t in enumerate(token_ids)]
            out = SimpleNamespace(token_ids=token_ids, logprobs=steps, finish_reason=reason,
                                  stop_reason=stop)
            return SimpleNamespace(outputs=[out])

    def prompt_logprobs(ids):
        """vLLM's layout: None for the first token, then {token: Logprob} per position with
        the prompt's own token among them (plus a distractor that a wrong read would pick)."""
        with torch.no_grad():
            logp = scoring_model(torch.tensor([ids])).logits[0].float().log_softmax(-1)
        entries = [None] + [{ids[t]: SimpleNamespace(logprob=logp[t - 1, ids[t]].item()),
                             ids[t] + 1: SimpleNamespace(logprob=0.0)}
                            for t in range(1, len(ids))]
        return SimpleNamespace(prompt_token_ids=list(ids), prompt_logprobs=entries,
                               outputs=[SimpleNamespace(token_ids=[0])])

    class LoRARequest:
        def __init__(self, name, lora_id, path):
            self.args = (name, lora_id, path)
            fake.loras.append(self)

    class StructuredOutputsParams:
        def __init__(self, grammar):
            self.grammar = grammar

    vllm = ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kw: SimpleNamespace(**kw)
    vllm.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    sampling_params = ModuleType("vllm.sampling_params")
    sampling_params.StructuredOutputsParams = StructuredOutputsParams
    request = ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    for name, module in {"vllm": vllm, "vllm.sampling_params": sampling_params,
                         "vllm.lora": ModuleType("vllm.lora"),
                         "vllm.lora.request": request}.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return fake


@pytest.fixture(scope="module")
def small_block_policy(tiny_model_dir, tokenizer):
    """An HFPolicy on the tiny Llama with larger weights (varied log-probs) and 4-token prefix
    cache blocks, so short test prompts hit the cache; one per module (its cache fills)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from offline_agent.policy.hf import HFPolicy
    from offline_agent.policy.prefix_cache import PrefixCache

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    policy = HFPolicy(LlamaForCausalLM(config).eval(), tokenizer)
    policy.prefix_cache = PrefixCache(block_size=4)
    return policy
