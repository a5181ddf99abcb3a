"""Nodes expanded per second: the batched search driver vs a sequential driver.

The sequential driver is how llm-reasoners-style code runs MCTS: one generate call per
action (one per proposal, one per rollout step) and one critique call per node, each
prefilling its whole prompt (no KV kept between calls). That is the named baseline. A
second sequential run keeps our prefix KV cache on, which isolates what batching alone
buys. All three run the same algorithm (offline_agent.search.mcts.simulate) on the same
tasks, config and seed, with the embedded model, one after the other in this process.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/search.py     # ~12 min on 2 cores
    .venv/bin/python benchmarks/search.py --tasks 4 --simulations 1

With --leaf-value, the batched driver runs twice instead, on the same tasks: leaves valued
by rollouts (search.leaf_value rollout, the named baseline) and by the critic's score
(critic, no rollout), each printing nodes/s and what the model computed per simulation
(tokens forwarded, tokens generated, policy calls; benchmarks/_counters.py).

    .venv/bin/python benchmarks/search.py --leaf-value --tasks 8 --simulations 4
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from _counters import Watch

from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.base import Sampling
from offline_agent.policy.prefix_cache import PrefixCache
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import Tree, drive, simulate
from offline_agent.search.requests import Rank, Sample
from offline_agent.search.searcher import Searcher, rank_available, sample_prompt
from offline_agent.seeding import stable_seed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--env", default="minishop")
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--oversample", type=int, default=2)
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument("--leaf-value", action="store_true",
                    help="rollout vs critic leaves (search.leaf_value), batched, side by side")
    args = ap.parse_args()

    policy = load_policy(args.model, device="cpu")

    def make_env():
        return load_env(args.env, max_steps=args.max_depth)

    critic = FrozenCritic(policy, make_env())

    tasks = make_env().tasks("train", args.tasks)
    cfg = SearchConfig(simulations=args.simulations, k=args.k, oversample=args.oversample,
                       max_depth=args.max_depth, trees_per_batch=args.tasks)
    print(f"{args.tasks} {args.env} tasks x {args.simulations} simulations, K={args.k} "
          f"(of {args.k * args.oversample} samples), "
          f"max depth {args.max_depth}, model {args.model}")

    if args.leaf_value:
        leaf_values(policy, make_env, critic, tasks, cfg)
        return
    policy.clear_cache()
    trees = [Tree.new(t, make_env()) for t in tasks]
    batched = Searcher(policy, make_env, cfg, critic).run(trees, lambda _: None)["nodes_per_s"]
    print(f"batched driver (prefix cache on):    {batched:.2f} nodes/s")

    env = make_env()

    def serve(request):
        if isinstance(request, Sample):
            prompt = sample_prompt(policy, env, request)
            completions = [
                policy.sample([prompt], 1, Sampling(
                    max_new_tokens=env.max_action_tokens, temperature=t,
                    stop=env.stop, seed=[stable_seed(request.seed, j)]))[0][0]
                for j, t in enumerate(request.temperatures)
            ]
            return [(c.text, c.action_ids) for c in completions]
        if isinstance(request, Rank):
            return rank_available(policy, env, [request])[0]
        return critic.score([request])[0]

    def sequential() -> float:
        trees = [Tree.new(t, env) for t in tasks]
        start = time.perf_counter()
        for tree in trees:
            while tree.simulations_done < cfg.simulations:
                drive(simulate(tree, env, cfg), serve)
        return sum(len(t.nodes) - 1 for t in trees) / (time.perf_counter() - start)

    kept = policy.prefix_cache
    policy.prefix_cache = PrefixCache(max_bytes=0)  # nothing kept between calls
    plain = sequential()
    print(f"sequential, one call per action:     {plain:.2f} nodes/s")
    policy.prefix_cache = kept
    policy.clear_cache()
    cached = sequential()
    print(f"sequential, prefix cache on:         {cached:.2f} nodes/s")
    print(f"ratio batched / sequential (named baseline): {batched / plain:.2f}x")
    print(f"ratio batched / sequential with prefix cache (batching alone): {batched / cached:.2f}x")

def leaf_values(policy, make_env, critic, tasks, cfg: SearchConfig) -> None:
    """The batched driver with rollout leaves, then critic leaves, from a cold prefix cache."""
    rates = {}
    for leaf in ("rollout", "critic"):
        policy.clear_cache()
        trees = [Tree.new(t, make_env()) for t in tasks]
        with Watch(policy.model, policy=policy) as watch:
            stats = Searcher(policy, make_env, replace(cfg, leaf_value=leaf), critic).run(
                trees, lambda _: None, progress=False)
        sims, c = stats["simulations"], watch.counts
        rates[leaf] = stats["nodes_per_s"]
        print(f"leaf_value {leaf:8s} {rates[leaf]:.2f} nodes/s, {stats['nodes']} nodes; per "
              f"simulation: {c.forwarded / sims:.0f} tokens forwarded, "
              f"{c.generated / sims:.1f} generated, {c.calls / sims:.2f} policy calls")
    print(f"ratio critic / rollout leaves (named baseline: rollout): "
          f"{rates['critic'] / rates['rollout']:.2f}x nodes/s")


if __name__ == "__main__":
    main()
