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
    if not tasks:
        return []
    seeds = seeds if seeds is not None else [seed] * len(tasks)
    pool = _Episodes(policy, make_env, tasks, seeds, prefixes, on_done, on_turn)
    first = [r for _ in range(batch_size) for r in pool.start()]
    if first:  # none where every prefix ended its episode
        policy.serve(first, action_sampling(pool.first_env, temperature, None), pool.answer)
    return pool.out  # type: ignore[return-value]


class _Episodes:
    """The episodes of run_episodes in play: each one's env and trajectory, from its first
    request to its record; `answer` is what policy.serve calls with each action."""

    def __init__(self, policy: Policy, make_env: Callable[[], Env], tasks: list[Task],
                 seeds: list[int], prefixes: list[list[tuple[str, list[int] | None]]] | None,
                 on_done: Callable[[Trajectory], None] | None,
                 on_turn: Callable[[int, str, Completion, Env], None] | None) -> None:
        self.policy, self.make_env, self.tasks, self.seeds = policy, make_env, tasks, seeds
        self.prefixes, self.on_done, self.on_turn = prefixes, on_done, on_turn
        self.out: list[Trajectory | None] = [None] * len(tasks)
        self.envs: dict[int, Env] = {}
        self.trajs: dict[int, Trajectory] = {}
        self.queue = iter(range(len(tasks)))
        self.first_env = make_env()  # the prompt's shared parts, played once (the demonstration)
        self.system, self.demo = self.first_env.system_prompt(), self.first_env.demonstration()

    def request(self, i: int) -> Request:
        t = self.trajs[i]
        prompt = render_prompt(self.policy.tokenizer, history_messages(
            self.system, t.instruction, t.first_observation, t.steps, self.demo))
        return Request(prompt, stable_seed(self.seeds[i], self.tasks[i].id, len(t.steps)),
                       self.envs[i].call_tools(), key=i)

    def start(self) -> list[Request]:
        """The next task's first request; a task its prefix ends is recorded on the way."""
        for i in self.queue:
            task = self.tasks[i]
            self.envs[i] = self.make_env()
            first = self.envs[i].reset(task)
            self.trajs[i] = Trajectory(task_id=task.id, env=task.env,
                                       instruction=task.instruction, first_observation=first)
            prefix = self.prefixes[i] if self.prefixes else []
            if not any(self.play(i, text, ids) for text, ids in prefix):
                return [self.request(i)]
            self.record(i)
        return []

    def play(self, i: int, text: str, ids: list[int] | None) -> bool:
        """Step episode i with `text`; whether the episode is over."""
        call, result = self.envs[i].act(text)
        self.trajs[i].steps.append(make_step(text, call, result, ids))
        return result.done

    def record(self, i: int) -> None:
        t = self.trajs.pop(i)
        t.reward, t.achieved = t.steps[-1].reward, self.envs.pop(i).describe_achieved()
        self.out[i] = t
        if self.on_done:
            self.on_done(t)

    def answer(self, r: Request, completion: Completion) -> list[Request]:
        i = r.key
        if self.on_turn:
            self.on_turn(i, r.prompt, completion, self.envs[i])
        if not self.play(i, completion.text, completion.action_ids):
            return [self.request(i)]
        self.record(i)
        return self.start()
