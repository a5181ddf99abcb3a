"""The hf backend on the real embedded model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import pytest

from offline_agent.policy import DEFAULT_MODEL, Sampling, load_policy

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def policy(embedded_dir):  # embedded_dir converts the GGUF once if the cache is empty
    return load_policy(DEFAULT_MODEL)


def chat(tokenizer, user: str) -> str:
    messages = [{"role": "system", "content": "You are a concise assistant."},
                {"role": "user", "content": user}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_greedy_chat_is_reproducible_and_scores_consistently(policy):
    tok = policy.tokenizer
    prompts = [chat(tok, "What is the capital of France?"), chat(tok, "Say hello.")]
    greedy = Sampling(max_new_tokens=24, temperature=0)
    first = policy.sample(prompts, 1, greedy)
    policy.clear_cache()
    again = policy.sample(prompts[:1], 1, greedy)[0][0]  # alone, without the kept prefix
    paris = first[0][0]
    assert "Paris" in paris.text
    assert again.token_ids == paris.token_ids and again.text == paris.text
    checked = 0
    for prompt, (c,) in zip(prompts, first):
        assert c.text.strip() and "<|im_end|>" not in c.text
        # the eos token, when sampled, is in token_ids and logprobs: score it back the same way
        text = c.text + (tok.eos_token if c.finish_reason == "stop" else "")
        if tok(text, add_special_tokens=False).input_ids == c.token_ids:
            assert policy.score(prompt, [text])[0] == pytest.approx(c.logprob, abs=1e-3)
            checked += 1
    assert checked, "no greedy completion round-trips through the tokenizer"


def test_sampling_with_stop_string(policy):
    tok = policy.tokenizer
    prompt = chat(tok, "List three fruits, one per line.")
    out = policy.sample([prompt], 4, Sampling(max_new_tokens=32, temperature=0.8, seed=0,
                                              stop=["\n"]))[0]
    assert len(out) == 4 and len({c.text for c in out}) > 1
    for c in out:
        assert "\n" not in c.text and len(c.token_ids) <= 32
        assert tok.decode(c.token_ids).startswith(c.text)
