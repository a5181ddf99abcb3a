"""Batched episodes: a sampled episode is a function of (seed, task), not of its batch."""

from __future__ import annotations

import pytest

from offline_agent.envs.base import StepResult
from offline_agent.policy import load_policy
from offline_agent.policy.base import Lockstep
from offline_agent.rollout import make_step, run_episodes
from offline_agent.types import Step, ToolCall
from tests.test_mcts import Corridor


class ShortCorridor(Corridor):
    max_action_tokens = 8  # the tiny random model writes junk: 8 tokens of it are enough


def _actions(trajectory) -> list[str]:
    return [s.action for s in trajectory.steps]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    # no prefix cache: a batch then computes each row from scratch, as a lone run does
    return load_policy(tiny_model_dir, max_batch=8, prefix_cache_gb=0)


def test_a_sampled_episode_is_the_same_alone_or_in_any_batch(policy):
    make_env = lambda: ShortCorridor(max_steps=3)  # noqa: E731
    tasks = Corridor().tasks("test", 4)  # one instruction: the prompts differ only by history
    together = run_episodes(policy, make_env, tasks, temperature=1.0, seed=5, batch_size=4)
    alone = run_episodes(policy, make_env, tasks[2:3], temperature=1.0, seed=5)
    reordered = run_episodes(policy, make_env, tasks[::-1], temperature=1.0, seed=5,
                             batch_size=3)
    assert _actions(alone[0]) == _actions(together[2]) == _actions(reordered[1])
    assert [s.observation for s in alone[0].steps] == [s.observation for s in together[2].steps]
    # the same prompts at temperature 1 differ by task: each row draws from its own seed
    assert len({tuple(_actions(t)) for t in together}) == len(tasks)
    # and the call's seed still matters
    again = run_episodes(policy, make_env, tasks[2:3], temperature=1.0, seed=6)
    assert _actions(again[0]) != _actions(alone[0])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_continuous_episodes_equal_lockstep_ones(policy, temperature):
    """The hf backend steps an env as soon as its action is written and puts the next prompt
    into the running decode; the episodes are those of one sample call per turn."""
    make_env = lambda: ShortCorridor(max_steps=3)  # noqa: E731
    tasks = Corridor().tasks("test", 5)
    ended = []
    policy.max_batch = 2  # fewer slots than episodes in play: slots are refilled mid-turn
    try:
        served = run_episodes(policy, make_env, tasks, temperature=temperature, seed=3,
                              batch_size=4, on_done=ended.append)
    finally:
        policy.max_batch = 8
    lockstep = run_episodes(Lockstep(policy), make_env, tasks, temperature=temperature, seed=3,
                            batch_size=4)
    assert [_actions(t) for t in served] == [_actions(t) for t in lockstep]
    assert [[s.token_ids for s in t.steps] for t in served] == [
        [s.token_ids for s in t.steps] for t in lockstep]
    assert sorted(t.task_id for t in ended) == sorted(t.id for t in tasks)


def test_make_step_keeps_what_the_env_answered():
    call = ToolCall("go", {"direction": "right"})
    result = StepResult(observation="end", reward=0.25, done=True, invalid=False,
                        info={"truncated": True})
    assert make_step("go[right]", call, result) == Step(
        action="go[right]", observation="end", tool_call=call, reward=0.25, done=True,
        invalid=False, info={"truncated": True})
    flagged = make_step("jump", None, StepResult(observation="Invalid action: x", invalid=True))
    assert flagged.invalid and flagged.tool_call is None and not flagged.done
