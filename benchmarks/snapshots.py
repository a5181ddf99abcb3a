"""Cost of JSON env snapshots (Env.snapshot + Env.restore, checked round trip) against the
pickles stores held before schema v5 (pickle.dumps + pickle.loads of (task, steps, state)),
side by side in one process, on MiniShop states that a short episode passes through.

    .venv/bin/python benchmarks/snapshots.py --repeat 2000
"""

from __future__ import annotations

import argparse
import pickle
import time

from offline_agent.envs.base import load_env


def per_call_us(fn, states: list, repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        for state in states:
            fn(state)
    return (time.perf_counter() - start) / (repeat * len(states)) * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=2000)
    args = p.parse_args()
    env = load_env("minishop")
    env.reset(env.tasks("train", 1)[0])
    states = [env.snapshot()]
    for text in ["search[shirt]", "click[next]", "click[back]"]:
        env.act(text)
        states.append(env.snapshot())
    pickled = []
    for snap in states:
        env.restore(snap)
        pickled.append((env.task, env.num_steps, env.state))

    def json_round_trip(snap):
        env.restore(snap)
        env.snapshot()

    def pickle_round_trip(triple):
        env.task, env.num_steps, env.state = pickle.loads(pickle.dumps(triple))

    ours = per_call_us(json_round_trip, states, args.repeat)
    base = per_call_us(pickle_round_trip, pickled, args.repeat)
    print(f"n={args.repeat * len(states)} restore+snapshot of MiniShop states")
    print(f"json (checked round trip): {ours:.1f} us   pickle (before v5): {base:.1f} us   "
          f"ratio {ours / base:.1f}x")


if __name__ == "__main__":
    main()
