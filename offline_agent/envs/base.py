"""The Env contract: text environments with tools, deterministic given (task, actions).

An env keeps all mutable episode state in `self.state`, so snapshot/restore is one copy
of it and search can branch without replaying. Snapshots are plain JSON data, never
pickles: stores travel between machines and are read on resume (state_json.py). Model text
enters only through `act`, which parses it; a malformed action never raises: it
becomes an observation that says what was wrong, counts as a step and is flagged. The
contract learns that an action ends the episode only by executing it, which computes the
reward; an env names the tools that do in `ending_tools`, so search at inference, which must
not read the reward, can leave them unexecuted (`ending_call`; docs/environments.md).
"""

from __future__ import annotations

import copy
import importlib
import inspect
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from offline_agent.call_forms import FORMS, MAX_ARGUMENT_CHARS, bracketable, default_form
from offline_agent.envs import state_json
from offline_agent.envs.errors import ActionError, EnvFailure, short
from offline_agent.envs.parser import parse_action, parse_form
from offline_agent.types import Message, Task, ToolCall

# ActionError and EnvFailure live in errors.py (the parser raises them too) and are importable
# from here, the contract: envs write `from offline_agent.envs.base import ActionError, Env`.

log = logging.getLogger(__name__)
_LOGGED: set[tuple[str, str]] = set()  # (env class, exception type) already logged


@dataclass
class StepResult:
    observation: str
    reward: float = 0.0
    done: bool = False
    invalid: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(ABC):
    """Subclasses set `name`, `tools` and implement the abstract methods."""

    name: str = "env"
    tools: list[dict] = []  # OpenAI/HF function specs: {"type": "function", "function": {...}}
    stop: list[str] = ["\n\n"]  # where a policy reply is cut: one action per reply
    max_action_tokens: int = 48  # token budget of one reply
    state_type: type | None = None  # dataclass of `self.state`; None: the state is JSON data
    max_parse_chars: int = 20_000  # only this much of a reply is parsed (bounds hostile text)
    # tool name -> the form constrained decoding writes its calls in (one of call_forms.FORMS),
    # over what `tool_syntax` detects from the demonstration
    call_syntax: dict[str, str] = {}
    # tools whose call ends the episode (running the reward): verifier-free search (eval.mcts)
    # never executes them, the call is a terminal leaf the critic values; an env that names
    # none still works, its ending steps are executed and their reward dropped
    ending_tools: tuple[str, ...] = ()
    _demo_turns: list[Message] | None = None  # demonstration(), once played
    _syntax: dict[str, str] | None = None  # tool_syntax(), once detected

    def __init__(self, max_steps: int = 10, seed: int = 0):
        self.max_steps = max_steps
        self.seed = seed
        self.state: Any = None
        self.task: Task | None = None
        self.num_steps = 0

    # ---- to implement -------------------------------------------------------------------
    @abstractmethod
    def tasks(self, split: str, n: int) -> list[Task]:
        """The first `n` tasks of `split` ("train" | "test"); deterministic for a given seed."""

    @abstractmethod
    def system_prompt(self) -> str:
        """Instructions, tool descriptions and one worked example, in plain text."""

    @abstractmethod
    def _reset(self, task: Task) -> str:
        """Set `self.state` for `task`; return the first observation."""

    @abstractmethod
    def _execute(self, call: ToolCall) -> StepResult:
        """Run a parsed, schema-checked call. Raise ActionError for bad arguments."""

    def demo_episode(self) -> tuple[Task, list[str]] | None:
        """A task and the action texts that solve it, shown to the policy as a worked
        episode (see `demonstration`); None for no demonstration. Small models copy the
        format of real turns far better than of prompt text."""
        return None

    def demonstration(self) -> list[Message]:
        """`demo_episode()` played and rendered as chat turns (user, assistant, tool, ...)
        shown after the system prompt; every prompt shares it, so the policy's prefix cache
        makes it nearly free. Played once per env object, on a shallow copy of it (same
        settings, its own episode); raises if it does not reach reward 1."""
        if self._demo_turns is None:
            episode = self.demo_episode()
            self._demo_turns = [] if episode is None else _play_demo(copy.copy(self), *episode)
        return self._demo_turns

    def available_actions(self) -> list[str]:
        """The concrete actions the current state offers, as action text (a page's links and
        buttons), or [] where actions are free text. Search ranks them with the policy and
        adds the best ones it did not sample, so a step the policy rarely writes can be tried."""
        return []

    def action_tools(self) -> list[dict]:
        """The tool specs a reply may call in the current state: what constrained decoding
        (`model.constrain: tools`) builds its grammar from. `tools` by default, so any env gets
        valid calls with no code; an env narrows them per state by dropping tools that cannot
        work there and adding `enum`s to parameters with a known set of values."""
        return self.tools

    def tool_syntax(self) -> dict[str, str]:
        """Each tool's call form (call_forms.FORMS), as constrained decoding writes it: `call_syntax`
        where it names the tool, else the form the demonstration's first call of the tool was
        written in, else the form most of the demonstration's calls use (a tool without
        parameters: its bare name after bracket calls), else `call_forms.default_form` (bare name,
        bracket text for one parameter, call syntax for several). The model copies the
        demonstration: a grammar of another form makes it write the whole call as one value."""
        if self._syntax is None:
            episode = self.demo_episode()
            shown: dict[str, str] = {}
            for text in episode[1] if episode else []:
                try:
                    call, form = parse_form(text, self.tools)
                except ActionError:  # it shows no form; check-env reports the action
                    continue
                shown.setdefault(call.name, form)
            forms = list(shown.values())
            usual = max(forms, key=forms.count) if forms else None
            self._syntax = {t["function"]["name"]: _form(t["function"], self.call_syntax, shown,
                                                         usual) for t in self.tools}
        return self._syntax

    def call_tools(self) -> list[dict]:
        """`action_tools()`, each spec with its call form under "syntax": what a constrained
        policy decodes a reply of this state under (Sampling.tools)."""
        syntax = self.tool_syntax()
        return [{**t, "syntax": syntax[t["function"]["name"]]} for t in self.action_tools()]

    def achieved_task(self) -> Task | None:
        """A task that the current terminal state satisfies (hindsight relabeling), or None.

        Its reward for the same actions must be 1; None where relabeling makes no sense.
        """
        return None

    def describe_achieved(self) -> str | None:
        """The instruction of `achieved_task()`, or None."""
        task = self.achieved_task()
        return task.instruction if task else None

    # ---- shared machinery -----------------------------------------------------------------
    def reset(self, task: Task) -> str:
        self.task = task
        self.num_steps = 0
        return self._reset(task)

    def step(self, call: ToolCall) -> StepResult:
        """Execute a tool call; invalid calls become flagged observations."""
        try:
            validate_call(call, self.tools)
            result = self._execute(call)
        except ActionError as e:
            result = StepResult(observation=f"Invalid action: {e}", invalid=True)
        return self._count(result)

    def act(self, text: str) -> tuple[ToolCall | None, StepResult]:
        """Parse model text into a tool call and execute it; never raises on the text.

        An exception other than ActionError is a bug that model text found: it becomes an
        invalid step too (the episode goes on), and is logged once per env and type."""
        call = None
        try:
            call = parse_action(text[: self.max_parse_chars], self.tools)
            return call, self.step(call)
        except ActionError as e:
            result = StepResult(observation=f"Invalid action: {e}", invalid=True)
        except EnvFailure:
            raise
        except Exception as e:  # noqa: BLE001 - the backstop: model text must not crash a run
            self._log_unexpected(e)
            result = StepResult(
                observation=f"Invalid action: it could not be run ({type(e).__name__})",
                invalid=True, info={"error": type(e).__name__})
        return call, self._count(result)

    def ending_call(self, text: str) -> ToolCall | None:
        """The call `act(text)` would run, without running it, if it is a valid call of one of
        `ending_tools` that the state offers (`action_tools`); else None. What verifier-free
        search asks instead of acting: running it would compute the reward."""
        if not self.ending_tools:
            return None
        try:
            call = parse_action(text[: self.max_parse_chars], self.tools)
            validate_call(call, self.action_tools())
        except ActionError:
            return None
        return call if call.name in self.ending_tools else None

    def _log_unexpected(self, error: Exception) -> None:
        key = (type(self).__name__, type(error).__name__)
        if key not in _LOGGED:
            _LOGGED.add(key)
            log.warning("%s.act: unexpected %s from model text (made an invalid step): %s",
                        *key, short(str(error), 200))

    def _count(self, result: StepResult) -> StepResult:
        self.num_steps += 1
        if not result.done and self.num_steps >= self.max_steps:
            result.done = True
            result.info["truncated"] = True
            result.observation += "\n[Step limit reached: episode over.]"
        return result

    # ---- state as JSON data -----------------------------------------------------------------
    def state_to_json(self) -> Any:
        """`self.state` as JSON data. The default writes a `state_type` dataclass as a dict of
        its fields and a state that is JSON data as is; override both methods otherwise."""
        return state_json.encode(self.state)

    def state_from_json(self, data: Any) -> Any:
        """A fresh state from `state_to_json()`'s data (the default rebuilds `state_type`)."""
        return state_json.decode(self.state_type, data)

    def snapshot(self) -> dict[str, Any]:
        """The episode as JSON data, checked to restore the very same state, so an env whose
        state cannot round-trip fails at its first snapshot, naming the field."""
        try:
            data = {"task": state_json.encode(self.task, "task"), "num_steps": self.num_steps,
                    "state": self.state_to_json()}
            problem = state_json.difference(self.state, self.state_from_json(data["state"]))
        except (KeyError, TypeError, ValueError) as e:  # StateError is a TypeError
            problem = str(e)
        if problem:
            raise EnvStateError(self, f"its state does not round-trip as JSON data: {problem}. "
                                "Keep the state JSON data (dicts, lists, str, numbers, bool, "
                                "None) or a dataclass named in `state_type` whose fields are, "
                                "or override state_to_json and state_from_json")
        return data

    def restore(self, data: dict[str, Any]) -> None:
        try:
            task = state_json.decode(Task, data["task"])
            num_steps, state = int(data["num_steps"]), self.state_from_json(data["state"])
        except (KeyError, TypeError, ValueError) as e:
            raise EnvStateError(self, f"a snapshot does not fit its state: {e!r}") from None
        self.task, self.num_steps, self.state = task, num_steps, state


class EnvStateError(TypeError):
    """An env whose state does not survive the JSON round trip of snapshots (a bug in the env),
    or a stored snapshot that does not fit the env."""

    def __init__(self, env: Env, problem: str):
        cls = type(env)
        super().__init__(f"env {env.name!r} ({cls.__module__}:{cls.__qualname__}): {problem}")


def validate_call(call: ToolCall, tools: list[dict]) -> None:
    """Check a call against the tools' JSON schemas: known name, required args, basic types."""
    specs = {t["function"]["name"]: t["function"] for t in tools}
    if call.name not in specs:
        raise ActionError(f"unknown tool {short(call.name)!r}; available: {', '.join(specs)}")
    params = specs[call.name].get("parameters", {})
    props = params.get("properties", {})
    missing = [k for k in params.get("required", []) if k not in call.arguments]
    if missing:
        raise ActionError(f"{call.name} is missing argument(s): {', '.join(missing)}")
    unknown = [short(str(k)) for k in call.arguments if k not in props]
    if unknown:
        raise ActionError(f"{call.name} got unknown argument(s): {', '.join(unknown[:5])}")
    py_types = {"string": str, "number": (int, float), "integer": int, "boolean": bool}
    for key, value in call.arguments.items():
        want = py_types.get(props[key].get("type", ""))
        if want and not isinstance(value, want):
            raise ActionError(f"{call.name}.{key} must be a {props[key]['type']}")
        size = _size(value)
        if size > MAX_ARGUMENT_CHARS:
            raise ActionError(f"{call.name}.{key} is too long (over {MAX_ARGUMENT_CHARS} chars)")


def _size(value: Any) -> int:
    """Characters of `value` as text; an integer too long for str() (over 4,300 digits)
    counts as too long instead of raising."""
    try:
        return len(str(value))
    except ValueError:
        return MAX_ARGUMENT_CHARS + 1


def _form(spec: dict, chosen: dict[str, str], shown: dict[str, str], usual: str | None) -> str:
    """One tool's form for `Env.tool_syntax`: chosen, shown, the usual one, or the default."""
    name, props = spec["name"], spec.get("parameters", {}).get("properties", {})
    if name in chosen:
        if chosen[name] not in FORMS:
            raise ValueError(f"call_syntax[{name!r}] is {chosen[name]!r}: use one of {FORMS}")
        return chosen[name]
    if name not in shown:  # after bracket calls, the default is bracket-like too
        return default_form(spec) if usual in (None, "bracket", "bare") else usual
    if shown[name] == "bracket" and not (len(props) == 1 and bracketable(next(iter(props.values())))):
        return "call"  # bracket text fills one parameter only
    return shown[name]


def _play_demo(env: Env, task: Task, actions: list[str]) -> list[Message]:
    turns = [Message("user", "\n\n".join(p for p in (task.instruction, env.reset(task)) if p))]
    result = None
    for text in actions:
        call, result = env.act(text)
        turns += [Message("assistant", text, tool_calls=[call] if call else None),
                  Message("tool", result.observation)]
    if result is None or not result.done or result.reward != 1.0:
        raise RuntimeError(f"{type(env).__name__}'s demonstration does not reach reward 1 "
                           f"(last observation: {result.observation[:200] if result else None!r})")
    return turns


BUILTIN_ENVS = {
    "minishop": "offline_agent.envs.minishop:MiniShop",
    "math": "offline_agent.envs.math:CalculatorMath",
    "python": "offline_agent.envs.python:PythonTasks",
}


def load_env(spec: str, **kwargs: Any) -> Env:
    """Build an env from a built-in name or an import path `package.module:Class` of an Env
    subclass (a TRL-shaped class is built by offline_agent.envs.trl.build_env). A spec that
    names no Env class, or arguments its constructor does not take, is a ValueError (a
    mistake in the config); an exception the constructor raises is the env's own."""
    cls = load_class(spec)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise ValueError(f"cannot load env {spec!r}: it is not a subclass of "
                         "offline_agent.envs.base.Env (a TRL environment_factory class is "
                         "built with its tasks: offline_agent.envs.trl.build_env)")
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        raise ValueError(f"env {spec!r} does not take the arguments {kwargs}: {e}") from None
    return cls(**kwargs)


def load_class(spec: str) -> Any:
    """What a built-in name or an import path `package.module:Class` names; a ValueError
    that says why where it names nothing importable."""
    path = BUILTIN_ENVS.get(spec, spec)
    if ":" not in path:
        raise ValueError(
            f"unknown env {spec!r}: use one of {sorted(BUILTIN_ENVS)} or 'package.module:Class'"
        )
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError as e:
        where = (" (it must be importable from the current folder or PYTHONPATH)"
                 if e.name and module.startswith(e.name) else f" (while importing {module})")
        raise ValueError(f"cannot load env {spec!r}: {e}{where}") from e
    except AttributeError as e:
        raise ValueError(f"cannot load env {spec!r}: {e}") from e
