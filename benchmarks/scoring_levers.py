"""Scoring and prefill levers, old vs new side by side inside one real search.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/scoring_levers.py   # a few minutes
    .venv/bin/python benchmarks/scoring_levers.py --kernels-only            # the attention op alone

A real MiniShop search (the demo's search settings; 2 trees, 3 simulations, depth 4) runs on the
embedded model. Every choice_logprobs call it makes (rank_available's listed actions with and
without the task, the critic's labels) runs three ways, each from the same prefix-cache state
(PrefixCache.fork), in rotating order:

- old: one batch row per (prompt, choice), each with its own copy of the prompt's KV, then
  [last prompt token][choice][pad] (the code before, kept below), transformers' sdpa;
- tree: HFPolicy.choice_logprobs (one row per prompt, its choices as a tree), sdpa;
- tree+gqa: the same on policy/attention.py's GQA attention (HFPolicy's default).

Every prefill of a sample call (HFPolicy._extend) runs three ways the same way: transformers'
sdpa (repeat_kv), grouped query rows (below, the alternative) and policy/attention.py's.
Printed: seconds and tokens/s per lever with the ratio, the largest |log-prob| difference and
how many rankings agree; the prefill's padding waste and the prefix cache's hit rate, the
prompts replayed through block sizes 8/16/32 (counted) and --blocks (timed, after the search);
and the attention kernel alone at search shapes
(repeat_kv + sdpa, grouped queries, sdpa's enable_gqa with a mask). Timings are wall-clock
sums over the search's calls; on a shared machine only the ratios mean anything.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections import defaultdict

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.attention import NAME
from offline_agent.policy.base import encode_prompt
from offline_agent.policy.kv_buffer import HEADROOM
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import Tree
from offline_agent.search.searcher import Searcher


@torch.inference_mode()
def old_choice_logprobs(policy, prompts, choices):
    """HFPolicy.choice_logprobs before the tree (commit b1ba7ac), for the side-by-side."""
    ids = [encode_prompt(policy.tokenizer, p) for p in prompts]
    pairs = [(i, policy.tokenizer(c, add_special_tokens=False).input_ids)
             for i, cs in enumerate(choices) for c in cs]
    flat = []
    for start in range(0, len(pairs), policy.max_batch):
        chunk = pairs[start:start + policy.max_batch]
        cache, mask = policy._prefill([ids[i] for i, _ in chunk])
        width = 1 + max(len(c) for _, c in chunk)
        tokens = torch.full((len(chunk), width), policy.tokenizer.pad_token_id)
        new = torch.zeros_like(tokens)
        for row, (i, c) in enumerate(chunk):
            tokens[row, :1 + len(c)] = torch.tensor(ids[i][-1:] + c)
            new[row, :1 + len(c)] = 1
        positions = mask.sum(1, keepdim=True) + torch.arange(width)
        logits = policy.model(tokens, attention_mask=torch.cat([mask, new], 1),
                              position_ids=positions, cache=cache).logits
        logp = logits[:, :-1].float().log_softmax(-1).gather(2, tokens[:, 1:, None])[..., 0]
        flat += (logp * new[:, 1:]).sum(1).tolist()
    out, at = [], 0
    for cs in choices:
        out.append(flat[at:at + len(cs)])
        at += len(cs)
    return out


def grouped_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      **kwargs):
    """The other way to skip repeat_kv (measured, not used): the n_rep query heads of a KV
    head become n_rep times as many query rows of it, the mask tiled to match."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = module.num_key_value_groups
    batch, heads, q_len, dim = query.shape
    if n_rep == 1 or q_len == 1 or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, heads // n_rep, n_rep * q_len, dim), key, value,
        attn_mask=attention_mask.repeat(1, 1, n_rep, 1), dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


GROUPED = "sdpa_grouped"
AttentionInterface.register(GROUPED, grouped_attention)
AttentionMaskInterface.register(GROUPED, sdpa_mask)


def order(values):
    return sorted(range(len(values)), key=lambda i: -values[i])


class SideBySide:
    """Wraps a policy's choice_logprobs and _extend: each call runs every variant from the same
    prefix-cache state; the last variant's result and cache state carry on."""

    def __init__(self, policy):
        self.policy = policy
        self.choice, self.extend = policy.choice_logprobs, policy._extend
        self.seconds, self.tokens = defaultdict(float), defaultdict(int)
        self.calls = itertools.count()
        self.max_diff, self.same_order, self.orders = 0.0, 0, 0
        self.scoring, self.scoring_new = False, 0
        self.tree_widths: list[int] = []  # per scored prompt: its row's tokens in the tree
        self.record = True  # _extend calls of the kept variant go to `prefills`
        self.prefills: list[tuple[list[list[int]], list[int]]] = []  # (contexts, cached)
        policy.choice_logprobs, policy._extend = self.choice_logprobs, self._extend_wrapper

    def _run(self, attention, fn):
        base = self.policy.prefix_cache
        self.policy.prefix_cache = base.fork()
        self.policy.model.set_attn_implementation(attention)
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        fork, self.policy.prefix_cache = self.policy.prefix_cache, base
        return out, seconds, fork

    def _variants(self, variants):
        """Run (name, attention, fn) variants in rotating order; the last one listed is kept."""
        shift = next(self.calls) % len(variants)
        results = {}
        for name, attention, fn in variants[shift:] + variants[:shift]:
            self.record = name == variants[-1][0]
            results[name] = self._run(attention, fn)
            self.seconds[name] += results[name][1]
        self.record = True
        out, _, fork = results[variants[-1][0]]
        self.policy.prefix_cache = fork
        return {name: r[0] for name, r in results.items()}, out

    def choice_logprobs(self, prompts, choices):
        tok = self.policy.tokenizer
        lengths = [[len(tok(c, add_special_tokens=False).input_ids) for c in cs] for cs in choices]
        widths = [1 + sum(max(n - 1, 0) for n in ns) for ns in lengths]
        self.tree_widths += widths
        self.scoring, self.scoring_new = True, 0
        got, out = self._variants([
            ("score old", "sdpa", lambda: old_choice_logprobs(self.policy, prompts, choices)),
            ("score tree", "sdpa", lambda: self.choice(prompts, choices)),
            ("score tree+gqa", NAME, lambda: self.choice(prompts, choices))])
        self.scoring = False
        for name in got:  # the tokens the forwards must compute: new prompt tokens, trees
            self.tokens[name] += self.scoring_new + sum(widths)
        for values in zip(*got.values()):
            for a, b in itertools.combinations(values, 2):
                self.max_diff = max([self.max_diff, *(abs(x - y) for x, y in zip(a, b))])
            self.orders += 1
            self.same_order += all(order(v) == order(values[0]) for v in values)
        return out

    def _extend_wrapper(self, contexts):
        probe = self.policy.prefix_cache.fork()
        cached = [len(probe.match(c)) * probe.block_size for c in contexts]
        new = sum(len(c) - m for c, m in zip(contexts, cached))
        if self.record:
            self.prefills.append((contexts, cached))
        if self.scoring:
            self.scoring_new += new if self.record else 0
            return self.extend(contexts)
        _, out = self._variants([("prefill sdpa", "sdpa", lambda: self.extend(contexts)),
                                 ("prefill grouped", GROUPED, lambda: self.extend(contexts)),
                                 ("prefill gqa", NAME, lambda: self.extend(contexts))])
        for name in ("prefill sdpa", "prefill grouped", "prefill gqa"):
            self.tokens[name] += new
        return out


def replay_blocks(prefills, size: int) -> tuple[int, int]:
    """(tokens recomputed, tokens in all contexts) for a prefix cache of `size`-token blocks
    with no memory limit, fed the search's prefill contexts in order."""
    kept: set[tuple[int, ...]] = set()
    computed = total = 0
    for contexts, _ in prefills:
        for c in contexts:
            whole = len(c) // size * size
            hit = 0
            while hit < whole and tuple(c[:hit + size]) in kept:
                hit += size
            kept.update(tuple(c[:end]) for end in range(size, whole + 1, size))
            computed += len(c) - hit
            total += len(c)
    return computed, total


def timed_blocks(bench: SideBySide, sizes: list[int]) -> None:
    """The search's prefills (sample and scoring, in order) replayed through prefix caches of
    each block size, side by side per call: seconds and tokens computed."""
    from offline_agent.policy.prefix_cache import PrefixCache

    policy, kept = bench.policy, bench.policy.prefix_cache
    caches = {size: PrefixCache(size, kept.max_bytes) for size in sizes}
    seconds = dict.fromkeys(sizes, 0.0)
    policy.model.set_attn_implementation(NAME)
    with torch.inference_mode():
        for i, (contexts, _) in enumerate(bench.prefills):
            for size in sizes[i % len(sizes):] + sizes[:i % len(sizes)]:
                policy.prefix_cache = caches[size]
                start = time.perf_counter()
                bench.extend(contexts)
                seconds[size] += time.perf_counter() - start
    policy.prefix_cache = kept
    print("prefills replayed with each block size (same calls, same order): "
          + ", ".join(f"block {size}: {seconds[size]:.1f} s" for size in sizes)
          + f"; ratio {sizes[-1]}/{sizes[0]}: {seconds[sizes[-1]] / seconds[sizes[0]]:.2f}x")


def report(bench: SideBySide, search_seconds: float) -> None:
    s, n = bench.seconds, bench.tokens
    print(f"\nsearch wall time {search_seconds:.0f} s (every variant of every call included)")
    print(f"{'variant':<16}{'seconds':>9}{'tokens/s':>10}   (forward tokens: new prompt tokens, tree rows)")
    for name in s:
        print(f"{name:<16}{s[name]:>9.2f}{n[name] / max(s[name], 1e-9):>10.1f}")
    print(f"lever 1, tree vs one row per pair (sdpa both): {s['score old'] / s['score tree']:.2f}x")
    print(f"lever 2, GQA vs sdpa, scoring (tree both):     {s['score tree'] / s['score tree+gqa']:.2f}x")
    print(f"lever 2, GQA vs sdpa, sample prefill:          {s['prefill sdpa'] / s['prefill gqa']:.2f}x")
    print(f"  (grouped query rows vs sdpa, sample prefill: {s['prefill sdpa'] / s['prefill grouped']:.2f}x)")
    print(f"levers 1+2, scoring:                           {s['score old'] / s['score tree+gqa']:.2f}x")
    print(f"max |log-prob difference| between variants: {bench.max_diff:.2e}; "
          f"rankings equal in {bench.same_order} of {bench.orders} prompts")
    widths = sorted(bench.tree_widths)
    print(f"tree row widths: median {widths[len(widths) // 2]}, max {widths[-1]}, "
          f"{sum(w > HEADROOM for w in widths)} of {len(widths)} over the KV buffer's room ({HEADROOM})")
    rows = [(len(contexts), max(len(x) - m for x, m in zip(contexts, cached)))
            for contexts, cached in bench.prefills]  # (batch, width) per call
    real = sum(len(x) - m for contexts, cached in bench.prefills for x, m in zip(contexts, cached))
    padded = sum(b * w for b, w in rows)
    print(f"\nlever 3: {len(rows)} _extend calls, batch mean {sum(b for b, _ in rows) / len(rows):.1f}; "
          f"new tokens {real}, computed with left pad {padded} ({padded / max(real, 1):.2f}x)")
    total = sum(len(x) for contexts, _ in bench.prefills for x in contexts)
    hits = sum(m for _, cached in bench.prefills for m in cached)
    print(f"prefix cache (block 32, as run): {hits / total:.1%} of context tokens served")
    for size in (8, 16, 32):
        computed, total = replay_blocks(bench.prefills, size)
        print(f"  replayed, block {size:>2}, no memory limit: {computed} of {total} tokens "
              f"computed ({1 - computed / total:.1%} served)")


def kernel_times(batch: int, q: int, k: int, repeats: int = 5):
    """Best-of-`repeats` seconds of each way to run the attention op at one shape, and the
    largest difference from repeat_kv's output. SmolLM2-135M's heads (9 query, 3 KV, dim 64),
    a causal boolean mask with a left pad."""
    from transformers.integrations.sdpa_attention import repeat_kv

    sdpa = torch.nn.functional.scaled_dot_product_attention
    module = torch.nn.Module()
    module.num_key_value_groups = 3
    torch.manual_seed(0)
    query, key, value = torch.randn(batch, 9, q, 64), *torch.randn(2, batch, 3, k, 64)
    mask = torch.ones(batch, 1, q, k, dtype=torch.bool).tril(k - q)
    mask[:, :, :, :5] = False
    mask[:, :, :, 5] = True
    variants = {
        "repeat_kv": lambda: sdpa(query, repeat_kv(key, 3), repeat_kv(value, 3), attn_mask=mask),
        "grouped": lambda: grouped_attention(module, query, key, value, mask)[0].transpose(1, 2),
        "enable_gqa": lambda: sdpa(query, key, value, attn_mask=mask, enable_gqa=True),
    }
    times, outs = {}, {}
    for name, fn in variants.items():
        times[name] = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            outs[name] = fn()
            times[name] = min(times[name], time.perf_counter() - start)
    return times, max((out - outs["repeat_kv"]).abs().max().item() for out in outs.values())


def attention_kernels() -> None:
    print("\nattention op alone, batch x queries x keys: seconds repeat_kv / grouped / enable_gqa")
    for batch, q, k in ((16, 25, 1100), (8, 80, 1100), (4, 300, 1100), (1, 1000, 1000)):
        times, diff = kernel_times(batch, q, k)
        print(f"  {batch:>2} x {q:>4} x {k:>4}: " + " / ".join(f"{t:.4f}" for t in times.values())
              + f"  (grouped {times['repeat_kv'] / times['grouped']:.2f}x, enable_gqa "
              f"{times['repeat_kv'] / times['enable_gqa']:.2f}x; max diff {diff:.1e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--simulations", type=int, default=3)
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument("--blocks", type=int, nargs="*", default=[16, 32],
                    help="block sizes to replay the search's prefills through, timed")
    ap.add_argument("--kernels-only", action="store_true", help="only the attention op timings")
    args = ap.parse_args()
    print(f"threads {torch.get_num_threads()}, load average at start {open('/proc/loadavg').read().split()[:3]}")
    attention_kernels()
    if args.kernels_only:
        return
    policy = load_policy(args.model, device="cpu")

    def make_env():
        return load_env("minishop", max_steps=8)

    cfg = SearchConfig(simulations=args.simulations, k=3, oversample=2, listed=2,
                       max_depth=args.max_depth, trees_per_batch=args.tasks)
    bench = SideBySide(policy)
    trees = [Tree.new(t, make_env()) for t in make_env().tasks("train", args.tasks)]
    start = time.perf_counter()
    Searcher(policy, make_env, cfg, FrozenCritic(policy, make_env())).run(trees, lambda _: None,
                                                                    progress=False)
    report(bench, time.perf_counter() - start)
    if args.blocks:
        timed_blocks(bench, args.blocks)
    print(f"load average at end {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
