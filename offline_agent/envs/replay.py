"""Snapshots by replay, for an env whose state is not plain data: a TRL-shaped env (its state
is an instance of the user's class) or an Env that keeps a game engine or a parser in
`self.state`. Subclass `ReplayEnv` instead of `Env`; nothing else changes.

The snapshot is the episode's actions since reset, each with a digest of the observation it
gave, as JSON data like any snapshot. `restore` resets the env for the task and replays the
actions, checking each observation against its digest: an env that answers the same actions
otherwise is a `NotDeterministic` error naming the task and the step, never a silently wrong
tree. A replay costs one env step per action of the history, so the env also keeps a deep copy
of its state at each snapshot it took for its current task, and restoring one of those is a
copy, not a replay. Replay happens where no copy is at hand: a stored tree resumed, merged or
re-mined (another process, another env object), or a state that cannot be deep-copied (a lock,
a socket: logged once per class; `keep_copies = False` turns copies off).
"""

from __future__ import annotations

import copy
import hashlib
import logging
from typing import Any

from offline_agent.envs import state_json
from offline_agent.envs.base import Env, EnvStateError, StepResult
from offline_agent.types import Task, ToolCall

log = logging.getLogger(__name__)
_UNCOPYABLE: set[str] = set()  # env names whose state did not deep-copy, logged once


class NotDeterministic(EnvStateError):
    """A replayed step whose observation differs from the one the snapshot recorded."""

    def __init__(self, env: Env, task: Task, step: int, action: str, observation: str):
        where = f"step {step} ({action[:60]!r})" if step else "reset"
        TypeError.__init__(
            self, f"env {env.name!r} is not deterministic: replaying task {task.id!r}, {where} "
            f"gave another observation than the stored one (now {observation[:80]!r}). Search "
            "branches by replaying actions, so the same task and actions must give the same "
            "observations: no clock, no unseeded randomness, no network")


def digest(observation: str) -> str:
    """What a snapshot keeps of an observation: enough to tell a different one."""
    return hashlib.sha256(observation.encode()).hexdigest()[:16]


class ReplayEnv(Env):
    """An Env whose snapshot is its action history since reset (see the module docstring)."""

    keep_copies: bool = True  # deep copies of snapshotted states; False: every restore replays
    _history: list[list[str]]
    _first: str  # digest of reset's observation
    _copies: dict[tuple, Any] | None = None  # action history -> deep copy of the state there
    _copies_task: str | None = None  # the task those copies belong to

    def reset(self, task: Task) -> str:
        if task.id != self._copies_task:  # copies of one task at a time: memory stays one tree
            self._copies, self._copies_task = {}, task.id
        self._history = []
        first = super().reset(task)
        self._first = digest(first)
        return first

    def act(self, text: str) -> tuple[ToolCall | None, StepResult]:
        call, result = self._play(text)
        self._history.append([text, digest(result.observation)])
        return call, result

    def _play(self, text: str) -> tuple[ToolCall | None, StepResult]:
        """One action as the env runs it: `Env.act`, unless a subclass ends episodes its way."""
        return super().act(text)

    def snapshot(self) -> dict[str, Any]:
        data = {"task": state_json.encode(self.task, "task"), "num_steps": self.num_steps,
                "reset": self._first, "actions": [list(a) for a in self._history]}
        self._keep(_key(data["actions"]))
        return data

    def restore(self, data: dict[str, Any]) -> None:
        try:
            task = state_json.decode(Task, data["task"])
            num_steps, first, actions = int(data["num_steps"]), data["reset"], data["actions"]
            if not all(isinstance(a, list) and len(a) == 2 and all(isinstance(x, str) for x in a)
                       for a in actions):
                raise ValueError("actions must be [action, observation digest] pairs")
        except (KeyError, TypeError, ValueError) as e:
            raise EnvStateError(self, f"a snapshot does not fit its state: {e!r}") from None
        key = _key(actions)
        if task.id == self._copies_task and key in (self._copies or {}):
            self.task, self.num_steps = task, num_steps
            self.state = copy.deepcopy(self._copies[key])
            self._history, self._first = [list(a) for a in actions], first
            return
        self._replay(task, first, actions)
        self._keep(key)

    def _replay(self, task: Task, first: str, actions: list[list[str]]) -> None:
        observation = self.reset(task)
        if digest(observation) != first:
            raise NotDeterministic(self, task, 0, "", observation)
        for step, (text, want) in enumerate(actions, 1):
            _, result = self.act(text)
            if digest(result.observation) != want:
                raise NotDeterministic(self, task, step, text, result.observation)

    def _keep(self, key: tuple) -> None:
        """A deep copy of the state under `key`, where the class allows one."""
        if not self.keep_copies or self.name in _UNCOPYABLE or self._copies is None:
            return
        try:
            self._copies[key] = copy.deepcopy(self.state)
        except Exception as e:  # noqa: BLE001 - any failure to copy means: replay instead
            _UNCOPYABLE.add(self.name)
            log.warning("env %r: its state cannot be deep-copied (%s: %s), so every restore "
                        "replays the episode", self.name, type(e).__name__, str(e)[:120])


def _key(actions: list[list[str]]) -> tuple:
    return tuple(tuple(a) for a in actions)
