"""Search nodes/s on MiniShop with its native snapshots (its state as JSON) vs snapshots by replay
(envs/replay.py: the same env as a ReplayEnv), with the live deep copies search keeps and with
every restore replayed (what a resumed, merged or re-mined tree costs), side by side in one
process: the three variants take turns, `--rounds` times, on the same tasks, config and seed.

The default policy is scripted (a hash of the prompt picks a search query or a listed action;
no model), so the figure is the env's share alone, the worst case for replay; `--model` runs the
embedded model instead, where decoding dominates.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/replay.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/replay.py --model --tasks 4 --rounds 1
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

from offline_agent.envs.minishop import MiniShop
from offline_agent.envs.replay import ReplayEnv
from offline_agent.policy.base import Completion
from offline_agent.search.config import SearchConfig
from offline_agent.search.mcts import Tree
from offline_agent.search.searcher import Searcher

QUERIES = ["search[cotton t-shirt]", "search[wool scarf]", "search[sleeping bag]", "click[next]",
           "buy", "click[back]"]


class ReplayShop(ReplayEnv, MiniShop):
    """MiniShop snapshot by replay, keeping deep copies of the states it snapshots."""


class ReplayOnlyShop(ReplayShop):
    """MiniShop snapshot by replay, every restore replayed."""

    keep_copies = False


class Scripted:
    """Proposes a query or page action by a hash of (prompt, seed); ranks listed actions by a
    hash: no model, so the env's steps and snapshots are what a search spends."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def sample(self, prompts, n, sampling):
        return [[Completion(QUERIES[_h(p, s) % len(QUERIES)], [], [], "stop")]
                for p, s in zip(prompts, sampling.seed)]

    def choice_logprobs(self, prompts, choices):
        return [[-(_h(p, c) % 7) / 3 for c in cs] for p, cs in zip(prompts, choices)]


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "big")


def nodes_per_s(env_class: type, policy, tasks, cfg: SearchConfig) -> tuple[float, list]:
    """One search of every task; nodes/s and the trees' (action, observation) for comparing."""
    make_env = lambda: env_class(max_steps=cfg.max_depth)  # noqa: E731
    start = time.perf_counter()
    trees = [Tree.new(t, make_env()) for t in tasks]
    stats = Searcher(policy, make_env, cfg, None).run(trees, lambda batch: None, progress=False)
    seconds = time.perf_counter() - start
    return stats["nodes"] / seconds, [[(n.action, n.observation) for n in t.nodes] for t in trees]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--simulations", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", action="store_true", help="the embedded model, not a script")
    args = ap.parse_args()
    cfg = SearchConfig(simulations=args.simulations, k=3, max_depth=6, trees_per_batch=4)
    if args.model:
        from offline_agent.policy import DEFAULT_MODEL, load_policy

        policy = load_policy(DEFAULT_MODEL)
    else:
        from transformers import AutoTokenizer

        from offline_agent.policy.models import DEFAULT_MODEL, resolve_model

        policy = Scripted(AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL)))
    tasks = MiniShop().tasks("train", args.tasks)
    variants = {"native JSON snapshot": MiniShop, "replay, live copies": ReplayShop,
                "replay, every restore": ReplayOnlyShop}
    rates: dict[str, list[float]] = {name: [] for name in variants}
    trees: dict[str, list] = {}
    for _ in range(args.rounds):
        for name, env_class in variants.items():
            rate, trees[name] = nodes_per_s(env_class, policy, tasks, cfg)
            rates[name].append(rate)
    assert len({repr(t) for t in trees.values()}) == 1, "the variants grew different trees"
    native = statistics.median(rates["native JSON snapshot"])
    print(f"MiniShop, {args.tasks} trees x {args.simulations} simulations, "
          f"{'embedded model' if args.model else 'scripted policy'}, median of {args.rounds}:")
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"  {name:<22} {rate:8.2f} nodes/s   {native / rate:5.2f}x the native time")


if __name__ == "__main__":
    main()
