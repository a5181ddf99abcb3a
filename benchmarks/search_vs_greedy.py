"""Tasks solved: MCTS search (at least one successful rollout) vs the greedy base policy.

Both run on the same train tasks, with the embedded model, in this process. Search
settings are SearchConfig's defaults unless overridden with --set key=value, so this is
the number `make demo` prints on a larger sample of tasks.

    .venv/bin/python benchmarks/search_vs_greedy.py --tasks 32
    .venv/bin/python benchmarks/search_vs_greedy.py --tasks 16 --set simulations=12 k=4
    .venv/bin/python benchmarks/search_vs_greedy.py --env math --tasks 32
    .venv/bin/python benchmarks/search_vs_greedy.py --env python --first 28 --tasks 12 \
        --max-steps 4 --config configs/python.yaml
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import yaml

from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.rollout import run_episodes
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import Tree
from offline_agent.search.searcher import Searcher


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--env", default="minishop")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--first", type=int, default=0,
                    help="index of the first train task (python's easy tier starts at 31)")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--kwargs", default="{}",
                    help='env constructor arguments as JSON, e.g. \'{"difficulty": 2}\'')
    ap.add_argument("--config", default="configs/default.yaml",
                    help="YAML whose search section is the starting point ('' for defaults)")
    ap.add_argument("--set", nargs="*", default=[], help="search overrides, e.g. simulations=12")
    args = ap.parse_args()

    fields = {}
    if args.config:
        with open(args.config) as f:
            fields = dict(yaml.safe_load(f).get("search") or {})
    for item in args.set:
        key, _, value = item.partition("=")
        fields[key] = yaml.safe_load(value)
    fields["trees_per_batch"] = fields.get("trees_per_batch", 16)
    cfg = SearchConfig(**fields)

    policy = load_policy(args.model, device="cpu")

    env_kwargs = {"max_steps": args.max_steps, **json.loads(args.kwargs)}

    def make_env():
        return load_env(args.env, **env_kwargs)

    tasks = make_env().tasks("train", args.first + args.tasks)[args.first:]
    start = time.perf_counter()
    greedy = run_episodes(policy, make_env, tasks, temperature=0.0, batch_size=32)
    greedy_solved = {t.task_id for t in greedy if t.success}
    greedy_s = time.perf_counter() - start

    best = {t.id: 0.0 for t in tasks}  # best reward of any rollout, per task

    def commit(batch):
        for tree, result in batch:
            best[tree.task.id] = max(best[tree.task.id], result.trajectory.reward)

    trees = [Tree.new(t, make_env()) for t in tasks]
    critic = FrozenCritic(policy, make_env()) if cfg.critic != "none" else None  # the frozen one
    stats = Searcher(policy, make_env, cfg, critic).run(trees, commit)
    solved = {task for task, reward in best.items() if reward >= 1.0}
    greedy_mean = sum(t.reward for t in greedy) / len(greedy)
    best_mean = sum(best.values()) / len(best)

    changed = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
               if f.name not in ("shard",)}
    print(f"{args.tasks} {args.env} train tasks from #{args.first} {env_kwargs}, model {args.model}, search {changed}")
    print(f"greedy: solved {len(greedy_solved):3d}/{args.tasks}, mean reward {greedy_mean:.3f} "
          f"({greedy_s:.0f} s)")
    print(f"search: solved {len(solved):3d}/{args.tasks} at least once, mean best reward "
          f"{best_mean:.3f} ({stats['seconds']:.0f} s, {stats['nodes']} nodes, "
          f"{stats['nodes_per_s']:.2f} nodes/s)")
    print(f"solved by search only: {len(solved - greedy_solved)}, "
          f"by greedy only: {len(greedy_solved - solved)}")


if __name__ == "__main__":
    main()
