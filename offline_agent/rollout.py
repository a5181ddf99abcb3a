"""Batched episodes: many envs play at once so one decode serves all of them.

Used by evaluation (greedy success, and the committed episodes of search at inference), the
search baseline, GRPO's rollouts and calibration. On CPU the
batch is the main speed lever (decode at 32 rows forwards ~7x the tokens/s of 1 row:
benchmarks/throughput.py's peaks), and keeping it full (continuous batching,
benchmarks/decode_levers.py) the next one.
"""

from __future__ import annotations

from collections.abc import Callable

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import Env, StepResult
from offline_agent.policy.base import Completion, Policy, Request, Sampling
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
    prefixes: list[list[tuple[str, list[int] | None]]] | None = None,
) -> list[Trajectory]:
    """Play every task to the end (done or the env's step limit); returns trajectories in order.

    Up to `batch_size` episodes are in play at once, served by one `policy.serve`: an action
    steps its env as soon as it is written and the next prompt joins the running decode (on
    the hf backend; others serve in lockstep), and an episode that ends hands its place to
    the next task. Turn t of a task's episode is sampled with seed
    `stable_seed(seed, task.id, t)`, so an episode does not depend on the other tasks beside
    it (or on `batch_size`); a task listed twice plays the same episode twice, unless `seeds`
    gives each episode its own seed in place of `seed` (GRPO's group members).
    `on_turn(i, prompt, completion, env)` sees each action of episode i before its env acts
    on it (GRPO keeps the ids). `prefixes[i]`, (text, generated ids) pairs, are played in
    episode i before the policy's first turn (the path inference search commits to)."""
    if seeds is not None and len(seeds) != len(tasks):
        raise ValueError(f"{len(seeds)} seeds for {len(tasks)} tasks")
    if prefixes is not None and len(prefixes) != len(tasks):
        raise ValueError(f"{len(prefixes)} prefixes for {len(tasks)} tasks")
    seeds = seeds if seeds is not None else [seed] * len(tasks)
    out: list[Trajectory | None] = [None] * len(tasks)
    if not tasks:
        return []
    envs: dict[int, Env] = {}
    trajs: dict[int, Trajectory] = {}
    queue = iter(range(len(tasks)))
    first_env = make_env()  # the prompt's shared parts, played once (the demonstration)
    system, demo = first_env.system_prompt(), first_env.demonstration()

    def request(i: int) -> Request:
        t = trajs[i]
        prompt = render_prompt(policy.tokenizer, history_messages(
            system, t.instruction, t.first_observation, t.steps, demo))
        return Request(prompt, stable_seed(seeds[i], tasks[i].id, len(t.steps)),
                       envs[i].call_tools(), key=i)

    def start() -> list[Request]:
        """The next task's first request; a task its prefix ends is recorded on the way."""
        for i in queue:
            envs[i] = make_env()
            first = envs[i].reset(tasks[i])
            trajs[i] = Trajectory(task_id=tasks[i].id, env=tasks[i].env,
                                  instruction=tasks[i].instruction, first_observation=first)
            if not any(play(i, text, ids) for text, ids in (prefixes[i] if prefixes else [])):
                return [request(i)]
            record(i)
        return []

    def play(i: int, text: str, ids: list[int] | None) -> bool:
        """Step episode i with `text`; whether the episode is over."""
        call, result = envs[i].act(text)
        trajs[i].steps.append(make_step(text, call, result, ids))
        return result.done

    def record(i: int) -> None:
        t = trajs.pop(i)
        t.reward, t.achieved = t.steps[-1].reward, envs.pop(i).describe_achieved()
        out[i] = t
        if on_done:
            on_done(t)

    def answer(r: Request, completion: Completion) -> list[Request]:
        i = r.key
        if on_turn:
            on_turn(i, r.prompt, completion, envs[i])
        if not play(i, completion.text, completion.action_ids):
            return [request(i)]
        record(i)
        return start()

    first = [r for _ in range(batch_size) for r in start()]
    if first:  # none where every prefix ended its episode
        policy.serve(first, action_sampling(first_env, temperature, None), answer)
    return out  # type: ignore[return-value]
