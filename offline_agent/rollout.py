"""Batched episodes: many envs step in lockstep so one generate call serves all of them.

Used by evaluation (greedy success), calibration and the search baseline. On CPU the
batch is the main speed lever (benchmarks/generation.py measures it).
"""

from __future__ import annotations

from collections.abc import Callable

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import Env, StepResult
from offline_agent.policy.base import Completion, Policy, Sampling
from offline_agent.seeding import stable_seed
from offline_agent.types import Step, Task, ToolCall, Trajectory


def make_step(text: str, call: ToolCall | None, result: StepResult,
              token_ids: list[int] | None = None) -> Step:
    """The step that model text made: what it parsed into, what the env answered, and the ids
    the policy generated for it (None for text the policy did not write)."""
    return Step(action=text, observation=result.observation, tool_call=call,
                reward=result.reward, done=result.done, invalid=result.invalid, info=result.info,
                token_ids=token_ids)


def action_sampling(env: Env, temperature: float, seed: int | list[int] | None,
                    tools: list[list[dict]] | None = None) -> Sampling:
    """One reply is one action: the env says where to cut it and how long it may be; `tools`
    (each prompt's `Env.call_tools()`) are what a constrained policy makes it call."""
    return Sampling(max_new_tokens=env.max_action_tokens, temperature=temperature,
                    stop=list(env.stop), seed=seed, tools=tools)


def run_episodes(
    policy: Policy,
    make_env: Callable[[], Env],
    tasks: list[Task],
    temperature: float = 0.0,
    seed: int = 0,
    batch_size: int = 16,
    on_done: Callable[[Trajectory], None] | None = None,
    seeds: list[int] | None = None,
    on_turn: Callable[[int, str, Completion, Env], None] | None = None,
) -> list[Trajectory]:
    """Play every task to the end (done or the env's step limit); returns trajectories in order.

    Turn t of a task's episode is sampled with seed `stable_seed(seed, task.id, t)`, so an
    episode does not depend on the other tasks of its batch (or on `batch_size`); a task listed
    twice plays the same episode twice, unless `seeds` gives each episode its own seed (in
    place of `seed`: GRPO's group members). `on_turn(i, prompt, completion, env)` sees each
    sampled action of episode i before the env acts on it (GRPO keeps the ids)."""
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    seeds = seeds if seeds is not None else [seed] * len(tasks)
    out: list[Trajectory | None] = [None] * len(tasks)
    for start in range(0, len(tasks), batch_size):
        chunk = list(range(start, min(start + batch_size, len(tasks))))
        envs = {i: make_env() for i in chunk}
        trajs = {}
        for i in chunk:
            first = envs[i].reset(tasks[i])
            trajs[i] = Trajectory(task_id=tasks[i].id, env=tasks[i].env,
                                  instruction=tasks[i].instruction, first_observation=first)
        system, demo = envs[chunk[0]].system_prompt(), envs[chunk[0]].demonstration()
        active = list(chunk)
        turn = 0
        while active:
            prompts = [
                render_prompt(policy.tokenizer, history_messages(
                    system, trajs[i].instruction, trajs[i].first_observation, trajs[i].steps,
                    demo))
                for i in active
            ]
            sampling = action_sampling(envs[chunk[0]], temperature,
                                       [stable_seed(seeds[i], tasks[i].id, turn) for i in active],
                                       [envs[i].call_tools() for i in active])
            completions = policy.sample(prompts, 1, sampling)
            for i, prompt, (completion,) in zip(active, prompts, completions):
                if on_turn:
                    on_turn(i, prompt, completion, envs[i])
                call, result = envs[i].act(completion.text)
                trajs[i].steps.append(make_step(completion.text, call, result,
                                                completion.action_ids))
                if result.done:
                    trajs[i].reward = result.reward
                    trajs[i].achieved = envs[i].describe_achieved()
            finished = [i for i in active if trajs[i].steps[-1].done]
            for i in finished:
                out[i] = trajs[i]
                if on_done:
                    on_done(trajs[i])
            active = [i for i in active if i not in finished]
            turn += 1
    return out  # type: ignore[return-value]

