"""Grammar-constrained tool calls (model.constrain: tools) vs free text, side by side.

One process, one copy of the embedded model, two policies on it (constrain none / tools):
1. greedy episodes on held-out tasks of each env: success, mean reward, invalid-action rate;
2. decode speed: the same prompts (the first step of test tasks), sampled at temperature 1
   with each policy, alternated `--repeats` times; generated tokens/s and the ratio;
3. search vs greedy with constraints on: train tasks solved by MCTS (one success among its
   rollouts) and by the constrained greedy policy, per env.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/constrained.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/constrained.py --tasks 20 --search-tasks 4

`--envs` takes built-in names or a third-party env's import path `package.module:Class`
(importable from where you run), e.g. the booking env of the test suite:

    PYTHONPATH=. OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/constrained.py \
        --envs tests.booking:Booking --speed-env tests.booking:Booking --tasks 50 --search-tasks 12
"""

from __future__ import annotations

import argparse
import time

from offline_agent.chat import history_messages, render_prompt  # noqa: E402
from offline_agent.envs.base import load_env  # noqa: E402
from offline_agent.evaluation import Episode, rates  # noqa: E402
from offline_agent.policy import DEFAULT_MODEL, load_policy  # noqa: E402
from offline_agent.policy.hf import HFPolicy  # noqa: E402
from offline_agent.rollout import action_sampling, run_episodes  # noqa: E402
from offline_agent.search.config import SearchConfig  # noqa: E402
from offline_agent.search.frozen_critic import FrozenCritic  # noqa: E402
from offline_agent.search.mcts import Tree  # noqa: E402
from offline_agent.search.searcher import Searcher  # noqa: E402


def greedy_table(policies: dict, envs: list[str], tasks: dict[str, int], max_steps: int) -> None:
    print(f"\n1. greedy, test tasks, max {max_steps} steps")
    print(f"{'env':9s} {'constrain':9s} {'tasks':>5s} {'success':>8s} {'reward':>7s} "
          f"{'invalid':>8s} {'steps':>6s} {'time':>6s}")
    for name in envs:
        def make_env(name=name):
            return load_env(name, max_steps=max_steps)

        for mode, policy in policies.items():
            start = time.perf_counter()
            trajs = run_episodes(policy, make_env, make_env().tasks("test", tasks[name]),
                                 temperature=0.0, batch_size=32)
            s = rates([Episode.from_trajectory(t) for t in trajs])
            print(f"{name:9s} {mode:9s} {len(trajs):5d} {s['success_rate']:8.1%} "
                  f"{s['mean_reward']:7.3f} {s['invalid_rate']:8.1%} {s['mean_steps']:6.2f} "
                  f"{time.perf_counter() - start:5.0f}s", flush=True)


def decode_speed(policies: dict, env_name: str, prompts_n: int, samples: int,
                 repeats: int) -> None:
    """Tokens/s of the same sample call under each policy, alternated so that load on the
    machine falls on both alike."""
    env = load_env(env_name)
    prompts, tools = [], []
    for task in env.tasks("test", prompts_n):
        first = env.reset(task)
        prompts.append(render_prompt(policies["none"].tokenizer, history_messages(
            env.system_prompt(), task.instruction, first, [], env.demonstration())))
        tools.append(env.call_tools())
    totals = {mode: [0, 0.0] for mode in policies}
    for r in range(repeats):
        for mode, policy in policies.items():
            sampling = action_sampling(env, 1.0, r, tools)
            warm = action_sampling(env, 1.0, r, tools[:1])
            policy.sample(prompts[:1], 1, warm)  # prefix cache warm for both alike
            start = time.perf_counter()
            out = policy.sample(prompts, samples, sampling)
            totals[mode][1] += time.perf_counter() - start
            totals[mode][0] += sum(len(c.token_ids) for cs in out for c in cs)
    rate = {mode: tokens / seconds for mode, (tokens, seconds) in totals.items()}
    print(f"\n2. decode speed, {env_name}: {prompts_n} prompts x {samples} samples, temperature 1, "
          f"{repeats} alternated repeats")
    for mode, (tokens, seconds) in totals.items():
        print(f"constrain {mode:5s}: {tokens:6d} tokens in {seconds:6.1f} s = {rate[mode]:6.1f} tok/s")
    print(f"tools / none: {rate['tools'] / rate['none']:.3f}x tokens/s")


def search_vs_greedy(policy, envs: list[str], first: int, n: int, cfg: SearchConfig,
                     max_steps: int) -> None:
    print(f"\n3. search vs greedy with constrain: tools, {n} train tasks per env from #{first}, "
          f"simulations {cfg.simulations}, k {cfg.k}, max depth {cfg.max_depth}")
    for name in envs:
        def make_env(name=name):
            return load_env(name, max_steps=max_steps)

        tasks = make_env().tasks("train", first + n)[first:]
        greedy = run_episodes(policy, make_env, tasks, temperature=0.0, batch_size=32)
        best = {t.id: 0.0 for t in tasks}

        def commit(batch, best=best):
            for tree, result in batch:
                best[tree.task.id] = max(best[tree.task.id], result.trajectory.reward)

        critic = FrozenCritic(policy, make_env()) if cfg.critic != "none" else None  # the frozen one
        stats = Searcher(policy, make_env, cfg, critic).run(
            [Tree.new(t, make_env()) for t in tasks], commit, progress=False)
        print(f"{name:9s} greedy solved {sum(t.success for t in greedy):3d}/{n}  search solved "
              f"{sum(r >= 1.0 for r in best.values()):3d}/{n}  ({stats['seconds']:.0f} s, "
              f"{stats['nodes']} nodes)", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--envs", nargs="+", default=["minishop", "math", "python"],
                    help="built-in names or import paths package.module:Class")
    ap.add_argument("--tasks", type=int, default=100, help="greedy test tasks per env")
    ap.add_argument("--python-tasks", type=int, default=None,
                    help="test tasks for python (its replies are long); default --tasks")
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--speed-env", default="minishop", help="the env of the decode-speed part")
    ap.add_argument("--speed-prompts", type=int, default=16)
    ap.add_argument("--speed-samples", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--search-tasks", type=int, default=8)
    ap.add_argument("--search-first", type=int, default=0, help="index of the first train task")
    ap.add_argument("--modes", nargs="+", default=["none", "tools"], choices=["none", "tools"],
                    help="greedy rows to run (the decode speed always compares both)")
    ap.add_argument("--simulations", type=int, default=2)
    ap.add_argument("--skip", nargs="*", default=[], choices=["greedy", "speed", "search"])
    args = ap.parse_args()

    base = load_policy(args.model, device="cpu")
    policies = {"none": base, "tools": HFPolicy(base.model, base.tokenizer, constrain="tools")}
    tasks = {e: args.tasks for e in args.envs}
    if "python" in tasks and args.python_tasks is not None:
        tasks["python"] = args.python_tasks
    print(f"model {args.model}, CPU")
    if "greedy" not in args.skip:
        greedy_table({m: policies[m] for m in args.modes}, args.envs, tasks, args.max_steps)
    if "speed" not in args.skip:
        decode_speed(policies, args.speed_env, args.speed_prompts, args.speed_samples, args.repeats)
    if "search" not in args.skip:
        cfg = SearchConfig(simulations=args.simulations, k=3, max_depth=args.max_steps)
        search_vs_greedy(policies["tools"], args.envs, args.search_first, args.search_tasks, cfg,
                         args.max_steps)


if __name__ == "__main__":
    main()
