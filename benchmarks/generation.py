"""hf backend throughput on the embedded model, with realistic agent prompts.

    .venv/bin/python benchmarks/generation.py [--max-new-tokens 32] [--threads N]

Each prompt is a system prompt of about 300 tokens (rules and tool descriptions), then a short
instruction and, for some prompts, one earlier step. The printed comparisons:

1. batched vs one prompt at a time: tokens/s of 16 prompts in one call against that of
   single-prompt calls (6 of them, to keep the run short).
2. K samples of one prompt: transformers `generate` on the prompt repeated K times (what
   num_return_sequences does before prefill), against HFPolicy, which prefills it once and expands the
   KV cache; "warm" means the system prompt is already kept from an earlier call.
3. 16 prompts that share the system prompt: `generate` (and its prefill alone) against
   HFPolicy with the common prefix and the prefix cache turned off (the same prefill work as
   generate, so this isolates the decode loop), then with the common prefix computed once.
4. The next step of 16 episodes (each prompt extended by one action and observation, what
   search and evaluation send every turn): HFPolicy with an empty prefix cache against one
   that still holds the previous step's prompts.

Timings are wall-clock, taken once each. The load average is printed at the start and the
end because other processes on the machine skew them. With 2 cores shared, run with
OMP_WAIT_POLICY=PASSIVE (or --threads 1): spinning OpenMP threads that compete with another
process slow torch down many times over.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from offline_agent.policy import DEFAULT_MODEL, Sampling, load_policy
from offline_agent.policy import hf as hf_backend
from offline_agent.policy.base import encode_prompt
from offline_agent.policy.prefix_cache import PrefixCache

TOOLS = [
    ("search", "Search the shop catalogue. Returns up to five product ids with titles and prices.",
     {"query": "keywords, e.g. 'red wool scarf'"}),
    ("open", "Open a product page by id and show its options, price and description.",
     {"product_id": "an id returned by search"}),
    ("select", "Choose an option on the open product page, such as a size or a colour.",
     {"option": "option name", "value": "one of the listed values"}),
    ("add_to_cart", "Put the open product, with the selected options, into the cart.", {}),
    ("checkout", "Buy everything in the cart. Ends the episode.", {}),
]
SYSTEM = (
    "You are a shopping agent in a text web shop. Each turn you reply with exactly one tool "
    "call and nothing else, as JSON on one line: {\"tool\": NAME, \"arguments\": {...}}. Read "
    "each observation before you act. Prefer the cheapest product that matches every "
    "requirement of the instruction. Never buy anything the instruction does not ask for.\n"
    "Tools:\n" + "\n".join(
        json.dumps({"type": "function", "function": {
            "name": name, "description": doc,
            "parameters": {"type": "object", "properties": {
                k: {"type": "string", "description": v} for k, v in args.items()}}}})
        for name, doc, args in TOOLS)
)
INSTRUCTIONS = [
    "Buy a red wool scarf under $30.", "Find a pair of running shoes in size 42.",
    "Buy two packs of AA batteries.", "I need a stainless steel water bottle, 750 ml.",
    "Buy the cheapest USB-C cable that is at least 2 m long.", "Get a blue cotton t-shirt, size M.",
    "Buy a paperback copy of a cookbook for vegetarian meals.", "Find a desk lamp with a dimmer.",
    "Buy noise-cancelling headphones under $100.", "Get a yoga mat thicker than 5 mm.",
    "Buy a set of three kitchen knives with wooden handles.", "Find dog food for puppies, 2 kg.",
    "Buy a black umbrella that folds.", "Get a ceramic mug that holds at least 400 ml.",
    "Buy a phone case for a small phone, in green.", "Find a bicycle bell made of brass.",
]


def agent_prompts(tokenizer, extra_steps: int = 0) -> list[str]:
    """Half of the prompts are one step into the episode; `extra_steps` adds steps to all."""
    prompts = []
    for i, instruction in enumerate(INSTRUCTIONS):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": instruction}]
        for step in range(i % 2 + extra_steps):
            messages += [
                {"role": "assistant", "content": json.dumps(
                    {"tool": "open", "arguments": {"product_id": f"p{17 + step}"}}
                    if step else
                    {"tool": "search", "arguments": {"query": instruction.split(" ", 1)[1]}})},
                {"role": "user", "content": "Observation: [p17] Basic model $12.99 | [p42] "
                                            "Premium model $24.50 | [p08] Value pack $9.99. "
                                            "Options: colour (red, blue, green), size (S, M, L). "
                                            f"Page {step + 1} of 3."},
            ]
        prompts.append(tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True))
    return prompts


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def tokens(out) -> int:
    return sum(len(c.token_ids) for cs in out for c in cs)


def hf_generate(policy, prompts, max_new_tokens) -> list[list[int]]:
    """transformers' own path, greedy: a left-padded batch, every row prefilled in full.
    Returns the new ids of each row up to and including the first eos."""
    tok = policy.tokenizer
    tok.padding_side = "left"
    batch = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = policy.model.generate(**batch, do_sample=False, max_new_tokens=max_new_tokens,
                                    pad_token_id=tok.pad_token_id)
    rows = []
    for row in out[:, batch.input_ids.shape[1]:].tolist():
        ends = [i for i, t in enumerate(row) if t in policy.eos]
        rows.append(row[:ends[0] + 1] if ends else row)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch threads: {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load average at start: "
          f"{os.getloadavg()[0]:.1f}")
    policy = load_policy(DEFAULT_MODEL)
    tok = policy.tokenizer
    prompts = agent_prompts(tok)
    lengths = [len(encode_prompt(tok, p)) for p in prompts]
    shared = hf_backend._common_prefix([encode_prompt(tok, p) for p in prompts])
    print(f"prompt tokens: {min(lengths)}-{max(lengths)}, shared prefix: {shared}, "
          f"max_new_tokens: {args.max_new_tokens}")
    sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0)
    policy.sample(prompts[:2], 1, Sampling(max_new_tokens=2))  # warm-up

    print("\n1. batched vs one prompt at a time (HFPolicy, sampling at temperature 1)")
    policy.clear_cache()
    t_one, outs = timed(lambda: [policy.sample([p], 1, sampling) for p in prompts[:6]])
    n_one = sum(tokens(o) for o in outs)
    policy.clear_cache()
    t_batch, out = timed(lambda: policy.sample(prompts, 1, sampling))
    n_batch = tokens(out)
    print(f"   one at a time (6 calls): {n_one:4d} tokens in {t_one:5.1f} s = "
          f"{n_one / t_one:5.1f} tok/s")
    print(f"   batched (16 prompts):    {n_batch:4d} tokens in {t_batch:5.1f} s = "
          f"{n_batch / t_batch:5.1f} tok/s")
    print(f"   batched / one at a time: {(n_batch / t_batch) / (n_one / t_one):.2f}x tokens/s")

    greedy = Sampling(max_new_tokens=args.max_new_tokens, temperature=0)
    same = []  # HFPolicy's greedy tokens must be generate's

    def ids(out):
        return [c.token_ids for cs in out for c in cs]

    print("\n2. K samples of one prompt (greedy, so both sides decode the same tokens)")
    prompt, other = prompts[1], prompts[3]
    for k in (4, 16):
        t_gen, rows = timed(lambda k=k: hf_generate(policy, [prompt] * k, args.max_new_tokens))
        policy.clear_cache()
        t_cold, out_cold = timed(lambda k=k: policy.sample([prompt], k, greedy))
        policy.clear_cache()
        policy.sample([other], 1, Sampling(max_new_tokens=1))  # keeps the system prompt
        t_warm, out_warm = timed(lambda k=k: policy.sample([prompt], k, greedy))
        same += [ids(out_cold) == rows, ids(out_warm) == rows]
        print(f"   K={k:2d}: generate {t_gen:5.1f} s | prefill once {t_cold:5.1f} s | "
              f"+ kept system prompt {t_warm:5.1f} s | speed-up {t_gen / t_cold:.2f}x, "
              f"{t_gen / t_warm:.2f}x ({sum(map(len, rows))} tokens)")

    print("\n3. 16 prompts sharing the system prompt, 1 sample each (greedy)")
    t_prefill, _ = timed(lambda: hf_generate(policy, prompts, 1))
    t_gen, rows = timed(lambda: hf_generate(policy, prompts, args.max_new_tokens))
    common_prefix = hf_backend._common_prefix
    hf_backend._common_prefix = lambda seqs: 0  # no shared prefix: every prompt prefilled in full
    kept = policy.prefix_cache
    policy.prefix_cache = PrefixCache(max_bytes=0)  # and nothing kept from earlier calls
    try:
        t_plain, out_plain = timed(lambda: policy.sample(prompts, 1, greedy))
    finally:
        hf_backend._common_prefix, policy.prefix_cache = common_prefix, kept
    policy.clear_cache()
    t_cold, out_cold = timed(lambda: policy.sample(prompts, 1, greedy))
    print(f"   generate:               {t_gen:5.1f} s ({sum(map(len, rows))} tokens); "
          f"its prefill alone (1 new token): {t_prefill:5.1f} s")
    for name, t, out in (("HFPolicy, no prefix:", t_plain, out_plain),
                         ("HFPolicy, prefix once:", t_cold, out_cold)):
        same.append(ids(out) == rows)
        print(f"   {name:23s} {t:5.1f} s, speed-up {t_gen / t:.2f}x")

    print("\n4. the next step of 16 episodes (greedy)")
    following = agent_prompts(tok, extra_steps=1)
    policy.clear_cache()
    t_cold, out_cold = timed(lambda: policy.sample(following, 1, greedy))
    policy.clear_cache()
    policy.sample(prompts, 1, greedy)  # the previous step, as an episode would have sent it
    t_warm, out_warm = timed(lambda: policy.sample(following, 1, greedy))
    print(f"   empty prefix cache: {t_cold:5.1f} s | previous step cached: {t_warm:5.1f} s | "
          f"speed-up {t_cold / t_warm:.2f}x | same tokens: {ids(out_cold) == ids(out_warm)}")
    print(f"\ngreedy tokens identical to generate's in {sum(same)}/{len(same)} runs")
    print(f"\nload average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
