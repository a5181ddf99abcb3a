"""Hindsight relabeling: a failed episode becomes a success for the goal it did reach.

The env names that goal (Env.achieved_task) from the episode's end state. Nothing is taken
on trust: the actions are replayed in a fresh env on the relabeled task and kept only if
they score SUCCESS there. A wrong or forged relabel is dropped with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offline_agent.envs.base import Env
from offline_agent.rollout import make_step
from offline_agent.types import SUCCESS, Step, Task


@dataclass
class Relabel:
    task: Task  # the relabeled task (the goal the episode reached)
    first_observation: str
    steps: list[Step]  # the replayed steps, observations as the relabeled task shows them
    reward: float


def replay(env: Env, task: Task, actions: list[str]) -> tuple[str, list[Step]]:
    """Reset to `task` and act out `actions` until the episode ends."""
    first = env.reset(task)
    steps = []
    for text in actions:
        steps.append(make_step(text, *env.act(text)))
        if steps[-1].done:
            break
    return first, steps


def relabel(make_env: Callable[[], Env], task: Task, actions: list[str]) -> Relabel | str:
    """The verified relabel of an episode, or why there is none: "not_ended" (cut by the
    step limit or never finished), "nothing_achieved" (the env names no goal),
    "already_solved", "replay_failed" (the named goal does not score SUCCESS on replay)."""
    env = make_env()
    _, steps = replay(env, task, actions)
    if not steps or not steps[-1].done or steps[-1].info.get("truncated"):
        return "not_ended"
    if steps[-1].reward >= SUCCESS:
        return "already_solved"
    achieved = env.achieved_task()
    if achieved is None:
        return "nothing_achieved"
    first, again = replay(make_env(), achieved, actions)
    if len(again) != len(actions) or not again[-1].done or again[-1].reward < SUCCESS:
        return "replay_failed"
    return Relabel(achieved, first, again, again[-1].reward)
