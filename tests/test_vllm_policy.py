"""VLLMPolicy against a fake `vllm` module (vLLM needs a CUDA GPU; these run anywhere).

The fake answers sample requests with a scripted reply and prompt-logprob requests from a
real forward pass of a small random Llama, so the score path is checked against HFPolicy on
the same weights: an off-by-one in reading vLLM's prompt log-probs changes the sums.
"""

from __future__ import annotations

import json

import pytest
import torch

from offline_agent.policy import Sampling
from offline_agent.policy.base import encode_prompt, row_seeds
from offline_agent.policy.hf import HFPolicy


def vllm_policy(model_dir, **kwargs):
    from offline_agent.policy.vllm import VLLMPolicy

    return VLLMPolicy(model_dir, **kwargs)


def test_refuses_without_a_gpu(fake_vllm, tiny_model_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA GPU only"):
        vllm_policy(tiny_model_dir)


def test_eos_is_kept_in_ids_not_text(fake_vllm, tiny_model_dir, tokenizer):
    """A reply vLLM ended with eos (stop_reason None) or a stop token id (an int) keeps that
    token in token_ids/logprobs but not in the text; a stop string cuts text and ids; a
    reply cut at max_tokens is 'length' and keeps every id."""
    buy = tokenizer("buy", add_special_tokens=False).input_ids
    eos = tokenizer.eos_token_id
    newline = tokenizer("buy\nmore", add_special_tokens=False).input_ids
    replies = iter([(buy + [eos], "stop", None), (buy + [eos], "stop", eos),
                    (newline, "stop", "\n"), (buy + buy, "length", None)])
    fake_vllm.reply = lambda ids: next(replies)
    policy = vllm_policy(tiny_model_dir)
    out = [c for cs in policy.sample(["a", "b", "c", "d"], 1, Sampling(stop=["\n"])) for c in cs]

    for ended in out[:2]:
        assert (ended.text, ended.token_ids, ended.finish_reason) == ("buy", buy + [eos], "stop")
        assert ended.logprobs == pytest.approx([-0.1 * (i + 1) for i in range(len(buy) + 1)])
    cut = out[2]
    assert (cut.text, cut.finish_reason) == ("buy", "stop")
    assert cut.token_ids == newline[:len(cut.token_ids)] and eos not in cut.token_ids
    assert tokenizer.decode(cut.token_ids).startswith("buy") and len(cut.token_ids) < len(newline)
    assert len(cut.logprobs) == len(cut.token_ids)
    long = out[3]
    assert (long.text, long.token_ids, long.finish_reason) == ("buybuy", buy + buy, "length")


def test_rows_carry_the_shared_seeds_and_temperatures(fake_vllm, tiny_model_dir, tokenizer):
    """Each (prompt, sample) row is one request with the prompt's ids and the row seed and
    temperature that base.call_rows gives the hf backend too."""
    fake_vllm.reply = lambda ids: ([tokenizer.eos_token_id], "stop", None)
    policy = vllm_policy(tiny_model_dir)
    sampling = Sampling(max_new_tokens=5, temperature=[0.0, 0.7], seed=[5, 9], stop=["\n"])
    out = policy.sample(["first prompt", "second"], 2, sampling)
    call = fake_vllm.llms[0].calls[0]
    ids = [encode_prompt(tokenizer, p) for p in ("first prompt", "second")]
    assert [p["prompt_token_ids"] for p in call["prompts"]] == [ids[0], ids[0], ids[1], ids[1]]
    assert [p.seed for p in call["params"]] == row_seeds([5, 9], 2, 2, None)
    assert [p.temperature for p in call["params"]] == [0.0, 0.0, 0.7, 0.7]
    assert all(p.max_tokens == 5 and p.logprobs == 0 and p.stop == ["\n"] for p in call["params"])
    assert call["lora"] is None
    assert [len(cs) for cs in out] == [2, 2]


def test_scores_match_the_hf_backend(fake_vllm, tiny_model_dir, tokenizer, scoring_model):
    """choice_logprobs sums vLLM's prompt log-probs over the choice's positions only: equal to
    HFPolicy's scores on the same weights, prompts and choices of different counts."""
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": u}], tokenize=False,
                                             add_generation_prompt=True)
               for u in ("Which product?", "Pick one letter.")]
    choices = [["A", "B", "C"], [" yes please", "no"]]
    policy = vllm_policy(tiny_model_dir)
    got = policy.choice_logprobs(prompts, choices)
    want = HFPolicy(scoring_model, tokenizer).choice_logprobs(prompts, choices)
    assert [len(g) for g in got] == [3, 2]
    for g, w in zip(got, want):
        assert g == pytest.approx(w, abs=1e-4)
    assert len(set(got[0])) == 3, "distinct choices must score differently"
    assert policy.score(prompts[1], choices[1]) == pytest.approx(got[1])
    params = fake_vllm.llms[0].calls[0]["params"][0]
    assert params.prompt_logprobs == 0 and params.max_tokens == 1


def test_lora_adapter_is_requested_on_every_call(fake_vllm, tiny_model_dir, tokenizer, tmp_path):
    """An adapter of rank 12 enables LoRA at the next rank vLLM accepts (16), and its request
    goes with every generate call, sampling and scoring alike."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 12}))
    fake_vllm.reply = lambda ids: ([tokenizer.eos_token_id], "stop", None)
    policy = vllm_policy(tiny_model_dir, adapter=str(adapter))
    llm = fake_vllm.llms[0]
    assert llm.kwargs["enable_lora"] is True and llm.kwargs["max_lora_rank"] == 16
    assert [r.args for r in fake_vllm.loras] == [("adapter", 1, str(adapter.resolve()))]
    policy.sample(["a"], 1, Sampling())
    policy.score("a", ["b"])
    assert [c["lora"] for c in llm.calls] == [fake_vllm.loras[0]] * 2


def test_lora_rank_above_what_vllm_accepts_is_a_clear_error(fake_vllm, tiny_model_dir, tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 1024}))
    with pytest.raises(ValueError, match="rank 1024.*at most 512"):
        vllm_policy(tiny_model_dir, adapter=str(tmp_path))


def test_tool_rows_send_the_shared_grammar(fake_vllm, tiny_model_dir, tokenizer):
    """A row with tools carries the grammar text that policy/grammar.py builds (the one the hf
    backend compiles) and the stop strings that may end it; a free row keeps its stop strings;
    completions say which were constrained."""
    from offline_agent.envs.base import load_env
    from offline_agent.policy.grammar import prompt_grammars

    buy = tokenizer("buy", add_special_tokens=False).input_ids
    fake_vllm.reply = lambda ids: (buy + [tokenizer.eos_token_id], "stop", None)
    policy = vllm_policy(tiny_model_dir, constrain="tools")
    tools = load_env("minishop").tools
    sampling = Sampling(max_new_tokens=48, stop=["\n"], tools=[tools, None], seed=1)
    out = policy.sample(["a", "b"], 2, sampling)
    sent = fake_vllm.llms[0].calls[0]["params"]
    grammar = prompt_grammars(sampling, 2)[0]
    assert [p.structured_outputs and p.structured_outputs.grammar for p in sent] == \
           [grammar.text, grammar.text, None, None]
    assert [p.stop for p in sent] == [["\n"]] * 4  # a call may end at the stop string too
    assert [c.constrained for cs in out for c in cs] == [True, True, False, False]
    assert out[0][0].text == "buy" and out[0][0].finish_reason == "stop"
