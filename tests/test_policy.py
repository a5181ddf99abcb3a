"""HFPolicy on a tiny random Llama: shapes, seeding, greedy, stop strings, log-probs, score."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from offline_agent.policy import Sampling, load_policy
from offline_agent.policy.base import encode_prompt, make_completion
from offline_agent.policy.hf import HFPolicy

GREEDY = Sampling(max_new_tokens=12, temperature=0)


@pytest.fixture(scope="module")
def policy(tiny_model_dir, tokenizer):
    """The tiny Llama re-initialised with larger weights: at the default init its greedy output
    is one token repeated, which would make the greedy comparisons below vacuous."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(tiny_model_dir)
    config.initializer_range = 0.2
    torch.manual_seed(0)
    return HFPolicy(LlamaForCausalLM(config).eval(), tokenizer)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    """Chat prompts of different lengths that share the system prompt."""
    system = {"role": "system", "content": "You are an agent. Tools: search(query), open(url)."}
    users = ["hi", "Find the population of Paris and report it.", "What is 2+2? Answer briefly."]
    return [tokenizer.apply_chat_template([system, {"role": "user", "content": u}], tokenize=False,
                                          add_generation_prompt=True) for u in users]


def manual_logprobs(policy, prompt_ids, new_ids):
    """Log-prob of each of new_ids after prompt_ids, from one plain forward pass (no cache)."""
    ids = torch.tensor([prompt_ids + new_ids])
    with torch.no_grad():
        logp = policy.model(ids).logits[0].float().log_softmax(-1)
    start = len(prompt_ids)
    return [logp[start - 1 + i, t].item() for i, t in enumerate(new_ids)]


def test_n_completions_per_prompt(policy, prompts):
    out = policy.sample(prompts, 3, Sampling(max_new_tokens=7, temperature=1.0, seed=0))
    assert [len(c) for c in out] == [3, 3, 3]
    for c in (c for cs in out for c in cs):
        assert len(c.token_ids) == len(c.logprobs) <= 7
        assert all(lp <= 0 for lp in c.logprobs)
        ended = c.token_ids[-1] in policy.eos
        assert c.finish_reason == ("stop" if ended else "length")
        assert ended or len(c.token_ids) == 7
    assert len({tuple(c.token_ids) for c in out[1]}) > 1, "the n samples of a prompt must differ"


def test_seeds(policy, prompts):
    def run(seed, max_batch=32):
        policy.max_batch = max_batch
        try:
            out = policy.sample(prompts, 2, Sampling(max_new_tokens=8, temperature=1.0, seed=seed))
        finally:
            policy.max_batch = 32
        return [c.token_ids for cs in out for c in cs]

    first = run(1)
    assert run(1) == first
    assert run(2) != first
    assert run(1, max_batch=3) == first, "samples must not depend on how rows are chunked"


def test_per_prompt_temperatures_mix_greedy_and_sampled_rows(policy, prompts):
    """One call can serve greedy and sampled prompts: each prompt gets what a call at its
    temperature gives it (same batch, so the logits are bit-identical)."""
    temperatures, seeds = [0, 1.0, 0.5], [7, 8, 9]
    mixed = policy.sample(prompts, 2, Sampling(max_new_tokens=8, temperature=temperatures,
                                               seed=seeds))
    for i, t in enumerate(temperatures):
        alone = policy.sample(prompts, 2, Sampling(max_new_tokens=8, temperature=t, seed=seeds))
        assert [c.token_ids for c in mixed[i]] == [c.token_ids for c in alone[i]]
    assert mixed[0][0].token_ids == mixed[0][1].token_ids  # greedy rows agree
    with pytest.raises(ValueError, match="2 temperatures for 3 prompts"):
        policy.sample(prompts, 1, Sampling(temperature=[0, 1]))


def test_unseeded_calls_follow_the_policy_seed(policy, prompts):
    other = HFPolicy(policy.model, policy.tokenizer, seed=0)
    fresh = HFPolicy(policy.model, policy.tokenizer, seed=0)
    sampling = Sampling(max_new_tokens=6, temperature=1.0)
    a1, a2 = other.sample(prompts[:1], 1, sampling), other.sample(prompts[:1], 1, sampling)
    b1 = fresh.sample(prompts[:1], 1, sampling)
    assert a1[0][0].token_ids == b1[0][0].token_ids
    assert a1[0][0].token_ids != a2[0][0].token_ids


def test_greedy_equals_argmax_loop(policy, prompts):
    prompt_ids = encode_prompt(policy.tokenizer, prompts[1])
    expected = []
    with torch.no_grad():
        for _ in range(GREEDY.max_new_tokens):
            logits = policy.model(torch.tensor([prompt_ids + expected])).logits[0, -1]
            expected.append(int(logits.argmax()))
            if expected[-1] in policy.eos:
                break
    out = policy.sample([prompts[1]], 2, GREEDY)[0]
    assert out[0].token_ids == out[1].token_ids == expected
    assert out[0].logprobs == pytest.approx(manual_logprobs(policy, prompt_ids, expected), abs=1e-4)


def test_logprobs_are_under_the_raw_model(policy, prompts):
    """Sampled with temperature and top-p, scored at temperature 1 without top-p."""
    out = policy.sample(prompts, 2, Sampling(max_new_tokens=10, temperature=0.7, top_p=0.9, seed=3))
    for prompt, cs in zip(prompts, out):
        ids = encode_prompt(policy.tokenizer, prompt)
        for c in cs:
            assert c.logprobs == pytest.approx(manual_logprobs(policy, ids, c.token_ids), abs=1e-4)


def test_tiny_top_p_is_greedy(policy, prompts):
    out = policy.sample(prompts, 2, Sampling(max_new_tokens=10, top_p=1e-9, seed=5))
    greedy = policy.sample(prompts, 1, Sampling(max_new_tokens=10, temperature=0))
    for cs, g in zip(out, greedy):
        assert cs[0].token_ids == cs[1].token_ids == g[0].token_ids


def test_mixed_lengths_batch_equals_one_at_a_time(policy, prompts):
    raw = ["Hello", "The quick brown fox jumps over the lazy dog because"]  # no shared prefix
    for group in (prompts, raw):
        batched = policy.sample(group, 1, GREEDY)
        for prompt, cs in zip(group, batched):
            policy.clear_cache()
            alone = policy.sample([prompt], 1, GREEDY)[0][0]
            assert cs[0].token_ids == alone.token_ids
            assert cs[0].logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_kept_prefix_cache_gives_the_same_result(policy, prompts):
    policy.clear_cache()
    cold = policy.sample(prompts[2:], 1, GREEDY)
    policy.sample(prompts[:2], 1, GREEDY)  # leaves a prefix that shares the system prompt
    warm = policy.sample(prompts[2:], 1, GREEDY)
    assert warm[0][0].token_ids == cold[0][0].token_ids
    assert warm[0][0].logprobs == pytest.approx(cold[0][0].logprobs, abs=1e-4)


def test_stop_strings_cut_text_ids_and_logprobs(policy, prompts):
    tok = policy.tokenizer
    full, _, other = (cs[0] for cs in policy.sample(prompts, 1, Sampling(max_new_tokens=16,
                                                                         temperature=0)))
    assert full.finish_reason == other.finish_reason == "length"
    ids = full.token_ids
    inside = next(j for j in range(3, 16) if len(tok.decode(ids[j:j + 1])) >= 2)
    cases = {  # start of the stop string in the text -> does it begin inside a token?
        len(tok.decode(ids[:inside])) + 1: True,
        len(tok.decode(ids[:3])): False,
    }
    for start, mid_token in cases.items():
        stop = full.text[start:start + 2]
        assert full.text.find(stop) == start, "pick a stop string that does not occur earlier"
        (c,), (d,) = policy.sample([prompts[0], prompts[2]], 1,
                                   Sampling(max_new_tokens=16, temperature=0, stop=[stop]))
        # the other row goes on after the first one stopped and left the batch
        assert d.text == (other.text[:other.text.find(stop)] if stop in other.text else other.text)
        assert d.token_ids == other.token_ids[:len(d.token_ids)]
        assert c.finish_reason == "stop" and stop not in c.text
        assert c.text == full.text[:start]
        k = len(c.token_ids)
        assert c.token_ids == ids[:k] and c.logprobs == pytest.approx(full.logprobs[:k], abs=1e-4)
        assert tok.decode(c.token_ids).startswith(c.text)
        assert not tok.decode(c.token_ids[:-1]).startswith(c.text), "token_ids must be minimal"
        assert (tok.decode(c.token_ids) != c.text) == mid_token  # the straddling token is kept
        # the ids training uses decode to exactly the text: the generated ones where they do
        assert tok.decode(c.action_ids) == c.text
        assert c.action_ids[:k - mid_token] == c.token_ids[:k - mid_token]
        assert (c.action_ids == c.token_ids) == (not mid_token)
    assert full.action_ids == full.token_ids  # cut by the token budget: all of them


def test_action_ids_at_a_stop_inside_a_token_and_at_eos(tokenizer):
    """SmolLM2 has one token for " \\n", so a stop at "\\n" can begin inside it. The action
    keeps the whole tokens before it, then the tokenizer's ids of the space; an eos is not
    part of it."""
    def enc(text):
        return tokenizer(text, add_special_tokens=False).input_ids

    straddle = enc(" \n")
    assert len(straddle) == 1
    ids = enc("click[x]") + straddle + enc("more")
    c = make_completion(tokenizer, ids, [-1.0] * len(ids), ["\n"], ended=False)
    assert c.text == "click[x] " and c.token_ids == enc("click[x]") + straddle
    assert c.action_ids == enc("click[x]") + enc(" ")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    sampled = [*enc("b"), *enc("u"), *enc("y")]  # not the tokenizer's split of "buy"
    assert sampled != enc("buy")
    c = make_completion(tokenizer, [*sampled, eos], [-1.0] * 4, ["\n"], ended=True)
    assert (c.text, c.token_ids, c.action_ids) == ("buy", [*sampled, eos], sampled)


def test_generation_stops_once_every_row_hit_a_stop(policy, prompts):
    full = policy.sample(prompts[:1], 1, Sampling(max_new_tokens=16, temperature=0))[0][0]
    stop = policy.tokenizer.decode(full.token_ids[2:4])
    calls = []
    hook = policy.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        c = policy.sample(prompts[:1], 1, Sampling(max_new_tokens=16, temperature=0, stop=[stop]))
    finally:
        hook.remove()
    assert c[0][0].finish_reason == "stop"
    assert len(calls) <= 1 + 4, f"{len(calls)} forward calls: decoding went on after the stop"


def test_score_equals_manual_forward(policy, prompts):
    tok = policy.tokenizer
    prompt_ids = encode_prompt(tok, prompts[1])
    conts = ['{"tool": "search"}', "A", "", "two words and more<|im_end|>"]
    policy.max_batch = 3  # exercises chunking
    try:
        scores = policy.score(prompts[1], conts)
    finally:
        policy.max_batch = 32
    for cont, score in zip(conts, scores):
        ids = tok(cont, add_special_tokens=False).input_ids
        assert score == pytest.approx(sum(manual_logprobs(policy, prompt_ids, ids)), abs=1e-3)
    assert scores[2] == 0.0


def test_choice_logprobs_batches_prompts(policy, prompts):
    tok = policy.tokenizer
    choices = [["A", "B", "C"], ["yes"], ["A", '{"x": 1}']]
    policy.max_batch = 4  # a chunk boundary falls inside the third prompt's choices
    try:
        got = policy.choice_logprobs(prompts, choices)
    finally:
        policy.max_batch = 32
    assert [len(g) for g in got] == [3, 1, 2]
    for prompt, cs, values in zip(prompts, choices, got):
        prompt_ids = encode_prompt(tok, prompt)
        for c, value in zip(cs, values):
            ids = tok(c, add_special_tokens=False).input_ids
            assert value == pytest.approx(sum(manual_logprobs(policy, prompt_ids, ids)), abs=1e-3)


def test_score_agrees_with_sampled_logprobs(policy, prompts):
    tok = policy.tokenizer
    out = policy.sample(prompts, 4, Sampling(max_new_tokens=10, temperature=1.0, seed=11))
    checked = 0
    for prompt, cs in zip(prompts, out):
        for c in cs:
            if tok(c.text, add_special_tokens=False).input_ids == c.token_ids:  # round-trips
                assert policy.score(prompt, [c.text])[0] == pytest.approx(c.logprob, abs=1e-3)
                checked += 1
    assert checked >= 3


def test_encode_prompt_adds_bos_only_when_missing(tokenizer):
    class AddsBos:  # a tokenizer that adds BOS by default, like Llama 3's
        bos_token_id = 1

        def __call__(self, text, add_special_tokens=True):
            ids = [1 if ch == "^" else ord(ch) for ch in text]
            return SimpleNamespace(input_ids=([1] if add_special_tokens else []) + ids)

    assert encode_prompt(AddsBos(), "ab") == [1, 97, 98]
    assert encode_prompt(AddsBos(), "^ab") == [1, 97, 98]  # the template wrote BOS already
    text = "<|im_start|>user\nhi"  # SmolLM's tokenizer adds nothing; its template writes BOS
    assert encode_prompt(tokenizer, text) == tokenizer(text, add_special_tokens=False).input_ids
    with pytest.raises(ValueError, match="empty prompt"):
        encode_prompt(tokenizer, "")


def test_load_policy(tiny_model_dir):
    policy = load_policy(tiny_model_dir, max_batch=4, seed=1)
    assert isinstance(policy, HFPolicy) and policy.max_batch == 4
    assert policy.model.dtype == torch.float32 and policy.device.type == "cpu"
    out = policy.sample(["Hello"], 2, Sampling(max_new_tokens=3))
    assert [len(c.token_ids) for c in out[0]] == [3, 3]


def test_load_policy_errors(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="unknown policy backend 'tgi'"):
        load_policy(tiny_model_dir, backend="tgi")
    try:  # vLLM is not installed in the CPU environment
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"pip install 'offline-agent\[vllm\]'"):
            load_policy(tiny_model_dir, backend="vllm")
    with pytest.raises(FileNotFoundError):
        load_policy(str(tmp_path / "missing-model"))
    with pytest.raises(ValueError, match="dtype"):
        load_policy(tiny_model_dir, dtype="float8")


def test_import_does_not_import_vllm():
    import subprocess
    import sys

    code = "import sys, offline_agent.policy; print('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"

