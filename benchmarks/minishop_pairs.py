"""MiniShop step pairs for benchmarks: real prompts, observations and actions, no search needed.

States lie along a scripted path (search, open a product, pick an option, buy); the chosen
action is the path's, the rejected one another action the state offers.
"""

from __future__ import annotations

from offline_agent.chat import history_messages, to_chat_dicts
from offline_agent.envs.base import load_env
from offline_agent.rollout import make_step
from offline_agent.types import Step


def step_pairs(n: int, seed: int = 0) -> list[dict]:
    """n step pairs at MiniShop states of depth 0-3 (one per task, depth = task index mod 4)."""
    env = load_env("minishop", seed=seed)
    system, demo = env.system_prompt(), env.demonstration()
    pairs = []
    for i, task in enumerate(env.tasks("train", n)):
        first = env.reset(task)
        steps: list[Step] = []
        query = f"search[{' '.join(task.instruction.split()[2:8])}]"
        for depth in range(i % 4 + 1):
            offered = env.available_actions()
            if not offered:  # the search page
                chosen, rejected = query, "search[gift]"
            else:
                chosen = offered[0] if depth < 3 else "buy"
                rejected = next(a for a in offered[::-1] if a != chosen)
            if depth == i % 4:
                prompt = history_messages(system, task.instruction, first, steps, demo)
                pairs.append({"pair_id": i, "prompt": to_chat_dicts(prompt),
                              "chosen": [{"role": "assistant", "content": chosen}],
                              "rejected": [{"role": "assistant", "content": rejected}]})
                break
            call, result = env.act(chosen)
            steps.append(make_step(chosen, call, result))
    return pairs
