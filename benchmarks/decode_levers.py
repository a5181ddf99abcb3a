"""The hf backend's decode levers, each old path against new side by side in one process.

    PYTHONPATH=. OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/decode_levers.py
    ... --levers compaction refill episodes threads bf16 onednn --episodes 16

On the embedded model with MiniShop prompts (system prompt, demonstration, task):

- compaction: one call of 32 rows (8 prompts x 4 samples, temperature 1, MiniShop's stop and
  action budget). Old: every finished row leaves the batch at once (a copy of the whole KV
  cache each time, COMPACT_AT 0); new: finished rows stay until COMPACT_AT of the KV is dead;
  also 0.5 and never (1.0).
- refill: search's call shape, 8 prompts x 6 samples = 48 rows at max_batch 32. Old: rows in
  chunks of 32, the second chunk half empty; new: a finished row's slot takes the next row.
- episodes: greedy episodes of --env (eval). Old: one sample call per turn of the episodes in
  play, each run down to its last row (lockstep, COMPACT_AT 0); new: Policy.serve, an env is
  stepped as soon as its action is written and its next prompt joins the running decode.
- threads: decode (batch 16 and 32, warm prefix cache) and prefill tokens/s at 1 and 2 torch
  threads.
- bf16: decode and prefill tokens/s in float32 and bfloat16, and the share of greedy
  MiniShop actions (--episodes episodes) that bfloat16 changes.
- onednn: linear layers on MKL (nn.Linear) against oneDNN (policy/linear.py): one decode step
  at context 970 and batch 1 to 16, prefill tokens/s, --episodes greedy episodes (same
  actions?) and search's sampled call of 48 rows (same tokens?).

Each timing is the best of --repeats runs, old and new interleaved; "same outputs" counts the
rows (episodes) whose tokens (actions) equal the old path's. Greedy rows are equal; a sampled
row can differ where a different batch around it moved its logits in the last bits (~1e-5 in
log-prob: float32 matmuls of another batch shape) and its draw fell that close to a token
boundary (1 of 48 rows in a refill run, at its 34th token). The machine's other load skews
absolute figures: read the ratios.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import deque

import torch
from transformers import DynamicCache

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, Sampling, load_policy
from offline_agent.policy import hf as hf_backend
from offline_agent.policy.base import Lockstep, call_rows, encode_prompt
from offline_agent.policy.linear import OneDNNLinear
from offline_agent.rollout import action_sampling, run_episodes

LEVERS = ("compaction", "refill", "episodes", "threads", "bf16", "onednn")


def minishop_prompts(tokenizer, count: int) -> tuple[list[str], Sampling]:
    env = load_env("minishop")
    system, demo = env.system_prompt(), env.demonstration()
    prompts = [render_prompt(tokenizer, history_messages(
        system, t.instruction, env.reset(t), [], demo)) for t in env.tasks("test", count)]
    return prompts, action_sampling(env, 1.0, list(range(count)))


def best(fn, repeats: int):
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def ids(out) -> list:
    return [c.token_ids for cs in out for c in cs]


def side_by_side(name: str, runs: dict, repeats: int, tokens) -> dict:
    """Time each run (interleaved), check all outputs equal the first, print the ratios;
    returns each run's output."""
    times = {k: [] for k in runs}
    outs = {}
    for _ in range(repeats):
        for k, fn in runs.items():
            t, outs[k] = best(fn, 1)
            times[k].append(t)
    first = next(iter(runs))
    base = min(times[first])
    for k in runs:
        t = min(times[k])
        same = sum(a == b for a, b in zip(outs[k], outs[first]))
        print(f"   {name} {k:22s} {t:6.2f} s  {tokens(outs[k]) / t:7.1f} tok/s  "
              f"{base / t:5.2f}x  same outputs: {same} of {len(outs[first])}", flush=True)
    return outs


def with_compact_at(value: float, fn):
    def run():
        kept = hf_backend.COMPACT_AT
        hf_backend.COMPACT_AT = value
        try:
            return fn()
        finally:
            hf_backend.COMPACT_AT = kept
    return run


def compaction(policy, args) -> None:
    prompts, sampling = minishop_prompts(policy.tokenizer, 8)
    policy.max_batch = 32
    policy.sample(prompts, 4, sampling)  # warm: the prompts' blocks are in the prefix cache
    call = lambda: ids(policy.sample(prompts, 4, sampling))  # noqa: E731
    side_by_side("32 rows", {"old (COMPACT_AT 0)": with_compact_at(0.0, call),
                             f"new (COMPACT_AT {hf_backend.COMPACT_AT})": call,
                             "COMPACT_AT 0.5": with_compact_at(0.5, call),
                             "never (1.0)": with_compact_at(1.0, call)},
                 args.repeats, lambda out: sum(map(len, out)))


def refill(policy, args) -> None:
    prompts, sampling = minishop_prompts(policy.tokenizer, 8)
    policy.max_batch = 32
    policy.sample(prompts, 6, sampling)  # warm

    def chunked():  # the old sample: rows in chunks of max_batch, each run to its last row
        rows, seeds, temps = call_rows(policy.tokenizer, prompts, 6, sampling, policy._rng)
        out = [None] * len(rows)

        def keep(row, completion):
            out[row.tag] = completion
            return []

        for start in range(0, len(rows), policy.max_batch):
            policy._generate(deque(hf_backend._Row(*r, tag=start + i) for i, r in enumerate(
                zip(rows[start:start + 32], seeds[start:start + 32], temps[start:start + 32],
                    [None] * 32))), sampling, keep)
        return [c.token_ids for c in out]

    side_by_side("48 rows at max_batch 32", {"old (chunks of 32)": with_compact_at(0.0, chunked),
                                             "new (refilled slots)": lambda: ids(
                                                 policy.sample(prompts, 6, sampling))},
                 args.repeats, lambda out: sum(map(len, out)))


def episodes(policy, args) -> list:
    """Old and new side by side; returns the episodes' actions."""
    make_env = lambda: load_env(args.env)  # noqa: E731
    tasks = make_env().tasks("test", args.episodes)
    policy.max_batch = args.episodes

    def play(p):
        def run():
            policy.clear_cache()
            trajs = run_episodes(p, make_env, tasks, temperature=0.0, batch_size=args.episodes)
            return [[s.action for s in t.steps] for t in trajs]
        return run

    def tokens(out):
        return sum(len(policy.tokenizer(a, add_special_tokens=False).input_ids)
                   for actions in out for a in actions)

    runs = {"old (lockstep turns)": with_compact_at(0.0, play(Lockstep(policy))),
            "new (Policy.serve)": play(policy)}
    return side_by_side(f"{args.episodes} greedy episodes", runs, 1, tokens)["new (Policy.serve)"]


def decode_rate(policy, prompts, batch: int, max_new_tokens: int = 24) -> float:
    sampling = Sampling(max_new_tokens=max_new_tokens, temperature=0)
    rows = (prompts * batch)[:batch]
    policy.sample(rows, 1, Sampling(max_new_tokens=1))  # warm prefix cache
    t, out = best(lambda: policy.sample(rows, 1, sampling), 1)
    return sum(map(len, ids(out))) / t


def prefill_rate(policy, prompts) -> float:
    rows = [encode_prompt(policy.tokenizer, p) for p in prompts]
    policy.clear_cache()
    t, _ = best(lambda: policy._prefill(rows[:1]), 1)  # batch 1: search's shared prefix
    policy.clear_cache()
    t2, _ = best(lambda: policy._prefill(rows), 1)
    return (len(rows[0]) + sum(len(r) for r in rows)) / (t + t2)


def threads(policy, args) -> None:
    prompts, _ = minishop_prompts(policy.tokenizer, 8)
    for n in (1, 2):
        torch.set_num_threads(n)
        rates = [decode_rate(policy, prompts, b) for b in (16, 32)]
        print(f"   {n} thread(s): decode batch 16 {rates[0]:6.1f} tok/s, batch 32 "
              f"{rates[1]:6.1f} tok/s, prefill {prefill_rate(policy, prompts[:4]):6.1f} tok/s",
              flush=True)
    torch.set_num_threads(args.threads)


def bf16(policy, args, fp32_actions: list) -> None:
    prompts, _ = minishop_prompts(policy.tokenizer, 8)
    half = load_policy(DEFAULT_MODEL, device="cpu", dtype="bfloat16", max_batch=32)
    for name, p in (("float32", policy), ("bfloat16", half)):
        print(f"   {name:9s} decode batch 16 {decode_rate(p, prompts, 16):6.1f} tok/s, prefill "
              f"{prefill_rate(p, prompts[:4]):6.1f} tok/s", flush=True)
    half_actions = episodes(half, args)  # bfloat16's own old and new, then compared
    pairs = [(a, b) for x, y in zip(fp32_actions, half_actions) for a, b in zip(x, y)]
    changed = sum(a != b for a, b in pairs) + sum(abs(len(x) - len(y))
                                                  for x, y in zip(fp32_actions, half_actions))
    first = next((k for k, (a, b) in enumerate(pairs) if a != b), None)
    print(f"   bfloat16 greedy actions: {changed} of {len(pairs)} changed or missing "
          f"({changed / max(len(pairs), 1):.0%}); episodes identical: "
          f"{sum(x == y for x, y in zip(fp32_actions, half_actions))} of {len(fp32_actions)}"
          f"{'' if first is None else f', first difference at action {first}'}")


def on_linear(policy, cls, fn):
    """fn run with every OneDNNLinear of the policy's model set to `cls`."""
    layers = [m for m in policy.model.modules() if isinstance(m, torch.nn.Linear)]

    def run():
        for m in layers:
            m.__class__ = cls
        try:
            return fn()
        finally:
            for m in layers:
                m.__class__ = OneDNNLinear
    return run


@torch.no_grad()
def decode_step_ms(model, batch: int, context: int = 970, steps: int = 8) -> float:
    """Median time of one decode step of `batch` rows against a cache of `context` tokens."""
    cache = DynamicCache()
    ids = torch.randint(0, 40000, (batch, context), generator=torch.Generator().manual_seed(0))
    model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        model(ids[:, -1:], past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache.crop(-1)
    return sorted(times)[steps // 2] * 1000


def onednn(policy, args) -> None:
    if not any(isinstance(m, OneDNNLinear) for m in policy.model.modules()):
        print("   the policy's linear layers are not on oneDNN here (policy/linear.py): skipped")
        return
    old, new = "old (MKL, nn.Linear)", "new (oneDNN)"
    for batch in (1, 2, 4, 8, 16):
        ms = {k: [] for k in (old, new)}
        for _ in range(args.repeats):
            ms[old].append(on_linear(policy, torch.nn.Linear,
                                     lambda b=batch: decode_step_ms(policy.model, b))())
            ms[new].append(decode_step_ms(policy.model, batch))
        print(f"   decode step, batch {batch:2d}, context 970: MKL {min(ms[old]):6.1f} ms, "
              f"oneDNN {min(ms[new]):6.1f} ms, {min(ms[old]) / min(ms[new]):5.2f}x", flush=True)
    prompts, sampling = minishop_prompts(policy.tokenizer, 8)
    rates = {k: [] for k in (old, new)}
    for _ in range(args.repeats):
        rates[old].append(on_linear(policy, torch.nn.Linear,
                                    lambda: prefill_rate(policy, prompts[:4]))())
        rates[new].append(prefill_rate(policy, prompts[:4]))
    print(f"   prefill (batch 1, then 4 prompts): MKL {max(rates[old]):6.1f} tok/s, oneDNN "
          f"{max(rates[new]):6.1f} tok/s, {max(rates[new]) / max(rates[old]):5.2f}x", flush=True)
    policy.max_batch = 32

    def call():  # cold prefix cache: each side computes its own prompts' KV
        policy.clear_cache()
        return ids(policy.sample(prompts, 6, sampling))

    side_by_side("48 sampled rows", {old: on_linear(policy, torch.nn.Linear, call), new: call},
                 args.repeats, lambda out: sum(map(len, out)))

    def play():
        policy.clear_cache()
        return [[s.action for s in t.steps] for t in run_episodes(
            policy, lambda: load_env(args.env), load_env(args.env).tasks("test", args.episodes),
            temperature=0.0, batch_size=args.episodes)]

    policy.max_batch = args.episodes
    side_by_side(f"{args.episodes} greedy episodes", {
        old: on_linear(policy, torch.nn.Linear, play), new: play}, 1,
        lambda out: sum(len(a) for actions in out for a in actions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levers", nargs="+", choices=LEVERS, default=list(LEVERS))
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--env", default="minishop", help="the env of `episodes` (python: long "
                    "actions of varied length)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads outside `threads`")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY', '(unset)')}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    policy = load_policy(DEFAULT_MODEL, device="cpu", max_batch=32)
    actions = None
    for lever in args.levers:
        print(f"\n{lever}", flush=True)
        if lever == "compaction":
            compaction(policy, args)
        elif lever == "refill":
            refill(policy, args)
        elif lever == "threads":
            threads(policy, args)
        if lever == "episodes" or lever == "bf16" and actions is None:
            actions = episodes(policy, args)
        if lever == "bf16":
            bf16(policy, args, actions)
        if lever == "onednn":
            onednn(policy, args)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
