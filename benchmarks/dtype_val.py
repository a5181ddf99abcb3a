"""bfloat16 against float32 for the base policy, greedy, on a run's validation tasks.

Before an experiment runs in bfloat16 (`model.dtype: bfloat16`, faster on a CPU with
avx512_bf16), this checks that the cheaper dtype does not move the policy it starts from.
Both play the same validation tasks greedily (the named baseline is float32), alternating in
chunks of `--chunk` tasks so that both see the same machine load; printed: each dtype's
success with its Wilson interval and seconds, the paired success and reward
difference (bf16 minus fp32) with bootstrap intervals, wins:losses with McNemar's p, and the
share of episodes whose actions differ at all.

The validation tasks are a run's: `tasks("train", train + val)[train:]`, as the `tasks` stage
draws them for `env.train_tasks` and `env.val_tasks`.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/dtype_val.py --env minishop --seed 2 \
        --train-tasks 96 --val-tasks 100 --out dtype_val.json
"""

from __future__ import annotations

import argparse
import json
import time

from offline_agent.envs.base import load_env
from offline_agent.evaluation import Episode, EvalConfig, compare, greedy_episodes, summarize
from offline_agent.policy import DEFAULT_MODEL, load_policy

BASELINE, CANDIDATE = "float32", "bfloat16"


def play(args, make_env, tasks) -> dict[str, tuple[list[Episode], float]]:
    """{dtype: (its episodes in task order, its seconds)}, the dtypes taking turns per chunk."""
    policies = {d: load_policy(args.model, device="cpu", dtype=d, max_batch=args.batch)
                for d in (BASELINE, CANDIDATE)}
    out: dict[str, tuple[list[Episode], float]] = {d: ([], 0.0) for d in policies}
    for i in range(0, len(tasks), args.chunk):
        for d, policy in policies.items():
            start = time.perf_counter()
            trajectories = greedy_episodes(policy, make_env, tasks[i:i + args.chunk],
                                           args.batch, on_done=lambda t: None)
            episodes, seconds = out[d]
            out[d] = (episodes + [Episode.from_trajectory(t) for t in trajectories],
                      seconds + time.perf_counter() - start)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--env", default="minishop")
    ap.add_argument("--seed", type=int, default=0, help="run.seed: the env's task draw")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--train-tasks", type=int, required=True, help="the run's env.train_tasks")
    ap.add_argument("--val-tasks", type=int, default=100, help="the run's env.val_tasks")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=25, help="tasks per turn of each dtype")
    ap.add_argument("--out", help="also write the figures and episodes here (JSON)")
    args = ap.parse_args()

    def make_env():
        return load_env(args.env, seed=args.seed, max_steps=args.max_steps)

    tasks = make_env().tasks("train", args.train_tasks + args.val_tasks)[args.train_tasks:]
    cfg = EvalConfig()
    played = play(args, make_env, tasks)
    out = {"env": args.env, "seed": args.seed, "tasks": [t.id for t in tasks]}
    for dtype, (episodes, seconds) in played.items():
        s = summarize(episodes, cfg)
        print(f"{dtype:9s} n {s['n_tasks']}  success {s['success_rate']:.3f} {s['ci95']}  "
              f"reward {s['mean_reward']:.3f} {s['mean_reward_ci95']}  invalid "
              f"{s['invalid_rate']:.3f}  steps {s['mean_steps']:.2f}  {seconds:.0f} s", flush=True)
        out[dtype] = {"summary": s, "seconds": round(seconds, 1),
                      "episodes": [[e.task_id, e.reward, list(e.actions)] for e in episodes]}
    d = compare(played[CANDIDATE][0], played[BASELINE][0], cfg)
    ratio = played[BASELINE][1] / played[CANDIDATE][1]
    print(f"{CANDIDATE} - {BASELINE}: success {d['success_rate']:+.3f} {d['ci95']}, reward "
          f"{d['mean_reward']:+.3f} {d['mean_reward_ci95']}, {d['wins']}:{d['losses']} McNemar p "
          f"{d['mcnemar_p']:.3f}; episodes whose actions differ {d['changed']}/{d['n_tasks']} "
          f"({d['changed_rate']:.1%}, {d['changed_ci95']}); {CANDIDATE} {ratio:.2f}x the "
          f"speed of {BASELINE}")
    out["difference"], out["speed_ratio"] = d, round(ratio, 3)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
