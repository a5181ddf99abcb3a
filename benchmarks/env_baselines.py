"""Calibration: the embedded model, greedy, on held-out tasks of each env.

Prints success rate, mean reward, invalid-action rate and mean steps per env. MiniShop's
default difficulty is tuned so the base model's success lands between 5% and 40%:
learnable, not solved. The numbers are recorded in docs/environments.md.

    .venv/bin/python benchmarks/env_baselines.py                 # 100 test tasks per env
    .venv/bin/python benchmarks/env_baselines.py --envs minishop --tasks 50
"""

from __future__ import annotations

import argparse
import time

from offline_agent.envs.base import load_env
from offline_agent.evaluation import Episode, rates
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.rollout import run_episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--envs", nargs="+", default=["minishop", "math", "python"])
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()

    policy = load_policy(args.model, device="cpu", max_batch=args.batch)
    print(f"model {args.model}, greedy, {args.tasks} test tasks per env, "
          f"max {args.max_steps} steps")
    print(f"{'env':10s} {'success':>8s} {'reward':>8s} {'invalid':>8s} {'steps':>6s} {'time':>7s}")
    for name in args.envs:
        def make_env(name=name):
            return load_env(name, max_steps=args.max_steps)

        tasks = make_env().tasks("test", args.tasks)
        start = time.perf_counter()
        trajs = run_episodes(policy, make_env, tasks, temperature=0.0, batch_size=args.batch)
        s = rates([Episode.from_trajectory(t) for t in trajs])
        print(f"{name:10s} {s['success_rate']:8.1%} {s['mean_reward']:8.3f} "
              f"{s['invalid_rate']:8.1%} {s['mean_steps']:6.2f} {time.perf_counter() - start:6.0f}s",
              flush=True)


if __name__ == "__main__":
    main()
