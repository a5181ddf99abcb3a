"""Nodes expanded per second: the batched search driver vs a sequential driver.

The sequential driver is how llm-reasoners-style code runs MCTS: one generate call per
action (K calls for K proposals, one per rollout step) and one critique call per node.
Both run the same algorithm (offline_agent.search.mcts.simulate) on the same tasks, the
same config and the embedded model, one after the other in this process.

    .venv/bin/python benchmarks/search.py            # ~5 min on 2 cores
    .venv/bin/python benchmarks/search.py --tasks 4 --simulations 1
"""

from __future__ import annotations

import argparse
import time

from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.base import Sampling
from offline_agent.search.config import SearchConfig
from offline_agent.search.critic import Critic
from offline_agent.search.mcts import Sample, Tree, drive, sample_seed, simulate
from offline_agent.search.searcher import Searcher, sample_prompt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--env", default="minishop")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-depth", type=int, default=4)
    args = ap.parse_args()

    policy = load_policy(args.model, device="cpu")

    def make_env():
        return load_env(args.env, max_steps=args.max_depth)

    critic = Critic(policy, make_env())

    tasks = make_env().tasks("train", args.tasks)
    cfg = SearchConfig(simulations=args.simulations, k=args.k, max_depth=args.max_depth,
                       trees_per_batch=args.tasks)
    print(f"{args.tasks} {args.env} tasks x {args.simulations} simulations, K={args.k}, "
          f"max depth {args.max_depth}, model {args.model}")

    trees = [Tree.new(t, make_env()) for t in tasks]
    batched = Searcher(policy, make_env, cfg, critic).run(trees, lambda _: None)
    print(f"batched:    {batched['nodes']:4d} nodes in {batched['seconds']:6.1f} s = "
          f"{batched['nodes_per_s']:.2f} nodes/s")

    env = make_env()

    def serve(request):
        if isinstance(request, Sample):
            prompt = sample_prompt(policy, env, request)
            return [
                policy.sample([prompt], 1, Sampling(
                    max_new_tokens=env.max_action_tokens, temperature=t,
                    stop=env.stop, seed=[sample_seed(request.seed, j)]))[0][0].text
                for j, t in enumerate(request.temperatures)
            ]
        return critic.score([request])[0]

    trees = [Tree.new(t, env) for t in tasks]
    start = time.perf_counter()
    for tree in trees:
        while tree.simulations_done < cfg.simulations:
            drive(simulate(tree, env, cfg), serve)
    seconds = time.perf_counter() - start
    nodes = sum(len(t.nodes) - 1 for t in trees)
    print(f"sequential: {nodes:4d} nodes in {seconds:6.1f} s = {nodes / seconds:.2f} nodes/s")
    print(f"ratio batched/sequential (nodes/s): {batched['nodes_per_s'] / (nodes / seconds):.2f}x")


if __name__ == "__main__":
    main()
