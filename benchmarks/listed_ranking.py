"""How often each ranking of MiniShop's listed actions puts an option the goal names first.

On the train tasks whose goal names options, a script searches the goal's words and opens the
target product; the page's clicks (options and back; `buy` is the greedy proposal anyway) are
ranked by the policy's log-prob and by the task's PMI (`searcher.rank_available`), side by
side on the same pages. A hit: a named option is the top click (top-1) or among the top two,
which are the listed children with the default `search.listed: 2`.

    .venv/bin/python benchmarks/listed_ranking.py --tasks 32
"""

from __future__ import annotations

import argparse

from offline_agent.envs.minishop import MiniShop
from offline_agent.envs.minishop.goals import Goal
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.rollout import make_step
from offline_agent.search.requests import Rank
from offline_agent.search.searcher import rank_available


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--tasks", type=int, default=32)
    args = ap.parse_args()

    policy = load_policy(args.model, device="cpu")
    env = MiniShop(max_steps=8)
    requests, wanted = [], []
    for task in env.tasks("train", args.tasks):
        goal = Goal.from_data(task.data)
        if not goal.options:
            continue
        first = env.reset(task)
        steps = []
        for text in (f"search[{' '.join((*goal.attributes, goal.type))}]", f"click[{goal.target}]"):
            call, result = env.act(text)
            steps.append(make_step(text, call, result))
        clicks = [a for a in env.available_actions() if a != "buy"]
        requests.append(Rank(task, first, steps, clicks))
        wanted.append({f"click[{v}]" for v in goal.options.values()})

    rankings = rank_available(policy, env, requests)
    print(f"{len(requests)} product pages of goals that name options ({args.tasks} train tasks), "
          f"model {args.model}")
    for name, which in (("log-prob", 1), ("task PMI", 0)):
        top1 = top2 = 0
        for request, want, scores in zip(requests, wanted, rankings):
            order = sorted(request.actions, key=lambda a: -scores[which][request.actions.index(a)])
            top1 += order[0] in want
            top2 += bool(want & set(order[:2]))
        print(f"{name:9}: a named option first {top1}/{len(requests)}, "
              f"in the top two {top2}/{len(requests)}")


if __name__ == "__main__":
    main()
