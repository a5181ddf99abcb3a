"""Python tasks solved by the best of N sampled first actions, per temperature, against the
greedy one: the breadth search has to work with. A first action's code is submitted whatever
its tool (`run_tests[...]` too), so a sample counts if its code passes every hidden test.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/best_of_n.py --first 28 --tasks 12 \\
        --samples 8 --temperatures 0.7 1.0
"""

from __future__ import annotations

import argparse
import time

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.python import PythonTasks
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.base import Sampling


def first_action_reward(env, task, text: str) -> float:
    """The reward of `text` as the first action; a valid run_tests has its code submitted."""
    env.reset(task)
    call, result = env.act(text)
    if call is not None and call.name == "run_tests" and not result.invalid:
        _, result = env.act(f"submit[{call.arguments['code']}]")
    return result.reward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--first", type=int, default=0, help="index of the first train task")
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--samples", type=int, default=8, help="N, samples per task and temperature")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.7, 1.0])
    args = ap.parse_args()

    policy = load_policy(args.model, device="cpu")
    env = PythonTasks()
    tasks = env.tasks("train", args.first + args.tasks)[args.first:]
    prompts = [render_prompt(policy.tokenizer, history_messages(
        env.system_prompt(), t.instruction, env.reset(t), [], env.demonstration())) for t in tasks]
    for temperature in [0.0, *args.temperatures]:
        n = 1 if temperature == 0 else args.samples
        start = time.perf_counter()
        sampling = Sampling(max_new_tokens=env.max_action_tokens, stop=list(env.stop),
                            temperature=temperature, seed=1)
        outs = policy.sample(prompts, n, sampling)
        best = [max(first_action_reward(env, t, c.text) for c in comps)
                for t, comps in zip(tasks, outs)]
        solved = sum(b >= 1.0 for b in best)
        print(f"temperature {temperature}: best of {n} solves {solved}/{len(tasks)}, mean best "
              f"reward {sum(best) / len(best):.3f} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
