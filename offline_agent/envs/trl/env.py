"""A TRL-shaped environment run under the Env contract, as TRL's GRPOTrainer runs it.

Per episode a fresh instance of the user's class, `reset(**row)` with the task's dataset row;
its string (if any) follows the instruction in the first user turn (TRL appends it to the last
prompt message; here a blank line separates them). A reply's tool call runs the method of that
name with the call's arguments, its return value as text is the observation; a method that
raises makes an invalid step whose observation is the exception's message (TRL shows the model
`{'error': message}`). A reply without a tool call ends the episode, as in TRL, and so does the
step limit (TRL's `max_tool_calling_iterations`); at the end the episode's reward is
`get_reward()`, or the reward function named by `env.reward_fn`, called with TRL's arguments.

What TRL's class does not have, the adapter answers so: the system prompt lists the tools'
JSON specs (what the chat template shows under TRL) and how to call them; no demonstration,
no hindsight task, no listed actions, no `ending_tools` (the ending is a reply without a call,
which verifier-free search runs with its reward dropped). The state is the instance itself, not
plain data, so snapshots are by replay (envs/replay.py).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Any

from offline_agent.envs.base import ActionError, EnvFailure, StepResult
from offline_agent.envs.errors import NoToolCall
from offline_agent.envs.parser import parse_action
from offline_agent.envs.replay import ReplayEnv
from offline_agent.envs.trl.shape import Shape
from offline_agent.envs.trl.tasks import prompt_messages
from offline_agent.types import Task, ToolCall

TRL_COLUMNS = ("prompt", "completion", "completion_ids")  # not passed to a reward function as columns


@dataclass
class Episode:
    """The adapter's state: the instance and the conversation TRL's reward functions read."""

    env: Any  # the instance of the user's class
    prompt: list[dict]  # the prompt messages, reset()'s text appended to the last
    completion: list[dict] = field(default_factory=list)  # assistant and tool turns so far
    finished: bool = False


class TRLEnv(ReplayEnv):
    max_action_tokens = 96  # a call in <tool_call> JSON takes 20-60 tokens

    def __init__(self, shape: Shape, tasks: dict[str, list[Task]], max_steps: int = 10,
                 seed: int = 0):
        super().__init__(max_steps=max_steps, seed=seed)
        self.shape, self._tasks = shape, tasks
        self.name, self.tools = shape.name, shape.tools
        # the form TRL's tool-calling chat templates (Qwen, Hermes) parse calls in
        self.call_syntax = {t["function"]["name"]: "tag" for t in shape.tools}

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` rows of the split (fewer where the dataset has fewer)."""
        if split not in self._tasks:
            raise ValueError(f"split {split!r}: use train or test")
        return self._tasks[split][:n]

    def system_prompt(self) -> str:
        specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.tools)
        return (f"You can call these tools (JSON schemas):\n{specs}\n\nTo call one, reply with "
                '<tool_call>{"name": "<tool>", "arguments": {<arguments>}}</tool_call>\n'
                "When you are done, reply without a tool call: that ends the episode.")

    def _reset(self, task: Task) -> str:
        instance = self.shape.factory(**self.shape.kwargs)
        observation = instance.reset(**task.data)
        if observation is not None and not isinstance(observation, str):
            raise EnvFailure(f"{self.name}.reset() returned a {type(observation).__name__}: "
                             "return a string or None")
        self.state = Episode(instance, prompt_messages(task.data.get("prompt"), observation))
        return observation or ""

    def _execute(self, call: ToolCall) -> StepResult:
        try:
            out = getattr(self.state.env, call.name)(**call.arguments)
        except Exception as e:  # noqa: BLE001 - as TRL: the exception is the tool's answer
            raise ActionError(str(e) or type(e).__name__) from None
        return StepResult(str(out))

    def _play(self, text: str) -> tuple[ToolCall | None, StepResult]:
        episode = self.state
        if episode.finished:
            return None, self._count(StepResult("Invalid action: the episode is over",
                                                invalid=True))
        if _calls_no_tool(text[: self.max_parse_chars], self.tools):
            call, result = None, self._count(StepResult("", done=True))
        else:
            call, result = super()._play(text)
        episode.completion += _turns(text, call, result)
        if result.done:
            episode.finished = True
            result.reward = self.reward()
        return call, result

    def reward(self) -> float:
        """The ended episode's reward: get_reward(), or the reward function with TRL's
        arguments (one prompt, one completion, the instance, the row's other columns)."""
        episode, source = self.state, f"{self.name}.get_reward()"
        try:
            if self.shape.reward_fn is None:
                value = episode.env.get_reward()
            else:
                source = f"reward function {getattr(self.shape.reward_fn, '__name__', '?')}"
                columns = {k: [v] for k, v in self.task.data.items() if k not in TRL_COLUMNS}
                out = self.shape.reward_fn(
                    prompts=[episode.prompt], completions=[episode.completion],
                    environments=[episode.env], trainer_state=None, log_extra=_ignore,
                    log_metric=_ignore, **columns)
                value = out[0] if isinstance(out, list | tuple) and len(out) == 1 else out
        except Exception as e:  # noqa: BLE001 - the user's reward code: one clear line
            raise EnvFailure(f"{source} raised {type(e).__name__}: {str(e)[:200]}") from e
        if not _is_reward(value):
            raise EnvFailure(f"{source} returned {value!r:.60} ({type(value).__name__}), not a "
                             "float" + ("" if self.shape.reward_fn is None else " in a list of one"))
        return float(value)


def _is_reward(value: Any) -> bool:
    """A finite real number (an int or a numpy float too), not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))


def _calls_no_tool(text: str, tools: list[dict]) -> bool:
    try:
        parse_action(text, tools)
    except NoToolCall:
        return True
    except ActionError:
        return False
    return False


def _turns(text: str, call: ToolCall | None, result: StepResult) -> list[dict]:
    """A step as TRL's completion messages: the assistant turn and, for a call, the tool turn."""
    if call is None:
        return [{"role": "assistant", "content": text}]
    function = {"name": call.name, "arguments": call.arguments}
    return [{"role": "assistant", "content": text,
             "tool_calls": [{"type": "function", "function": function}]},
            {"role": "tool", "name": call.name, "content": result.observation}]


def _ignore(*args: Any, **kwargs: Any) -> None:
    """TRL's log_extra and log_metric: what a reward function logs is not kept here."""
