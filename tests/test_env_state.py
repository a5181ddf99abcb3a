"""Env snapshots are JSON data: the built-in envs round-trip through json text, a state that
cannot is refused at its first snapshot naming the env and the field, bad data at restore."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field

import pytest

from offline_agent.envs import state_json
from offline_agent.envs.base import Env, EnvStateError, StepResult, load_env
from offline_agent.types import Task, ToolCall


def through_text(snapshot: dict) -> dict:
    """What a store gives back: the snapshot written as JSON text and read again."""
    return json.loads(json.dumps(snapshot))


def make(name: str) -> Env:
    return load_env(name, **({"num_products": 200} if name == "minishop" else {}))


@pytest.mark.parametrize("name, actions, probe", [
    ("minishop", ["search[shirt]", "click[back]", "search[wool scarf]"], "click[next]"),
    ("math", ["calculate[2*3]"], "answer[6]"),
    ("python", [], "submit[def f(): pass]"),
])
def test_builtin_snapshots_are_json_and_restore_the_same_episode(name, actions, probe):
    env = make(name)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    for text in actions:
        env.act(text)
    snap, state = env.snapshot(), copy.deepcopy(env.state)
    assert through_text(snap) == snap
    _, want = env.act(probe)
    other = make(name)
    other.restore(through_text(snap))
    assert (other.task, other.num_steps, other.state) == (task, len(actions), state)
    _, got = other.act(probe)
    assert (got.observation, got.reward, got.done) == (want.observation, want.reward, want.done)


def test_minishop_state_keeps_its_tuples_and_hindsight_goal():
    """`selected` is a tuple of tuples whose repr seeds the hindsight goal: JSON lists would
    change the relabeled instruction after a restore."""
    env = make("minishop")
    env.reset(env.tasks("train", 1)[0])
    env.act("search[shirt]")
    for product in [a for a in env.available_actions() if a.startswith("click[P")]:
        env.act(product)
        options = [a for a in env.available_actions() if a not in ("buy", "click[back]")]
        if options:
            env.act(options[0])
            break
        env.act("click[back]")
    assert env.state.selected, "no product with options in the results"
    env.act("buy")
    snap, goal = env.snapshot(), env.achieved_task()
    other = make("minishop")
    other.restore(through_text(snap))
    assert other.state == env.state and type(other.state.selected[0]) is tuple
    assert other.achieved_task() == goal


def test_restored_state_shares_nothing_with_the_snapshot():
    env = load_env("math")
    env.reset(env.tasks("train", 1)[0])
    snap = env.snapshot()
    env.restore(snap)
    env.state["answered"] = 5  # an env that mutates its state in place
    assert snap["state"] == {"answered": None}


def test_non_finite_numbers_from_model_text_survive():
    env = load_env("math")
    env.reset(env.tasks("train", 1)[0])
    for value in (math.inf, -math.inf, math.nan, 10**400):
        env.state = {"answered": value}
        back = load_env("math")
        back.restore(through_text(env.snapshot()))
        assert state_json.difference(env.state, back.state) is None


# ---- third-party envs -------------------------------------------------------------------------
@dataclass
class Inner:
    path: tuple[str, ...] = ()
    scores: dict[str, float] = field(default_factory=dict)


@dataclass
class Outer:
    page: str = "start"
    inner: Inner = field(default_factory=Inner)
    best: Inner | None = None
    pairs: list[tuple[int, str]] = field(default_factory=list)


class PluginEnv(Env):
    """A third-party env whose `state` is whatever the test puts there."""

    name = "plugin"
    tools = [{"type": "function", "function": {"name": "go", "parameters": {}}}]  # noqa: RUF012

    def __init__(self, state=None, state_type=None, **kwargs):
        super().__init__(**kwargs)
        self.initial, self.state_type = state, state_type

    def tasks(self, split, n):
        return [Task(f"p-{i}", self.name, "go", split, {"i": i}) for i in range(n)]

    def system_prompt(self):
        return "go"

    def _reset(self, task):
        self.state = self.initial
        return "start"

    def _execute(self, call: ToolCall) -> StepResult:
        return StepResult("went", reward=1.0, done=True)


def snapshot_after_reset(env: PluginEnv) -> dict:
    env.reset(env.tasks("train", 1)[0])
    return env.snapshot()


def test_nested_dataclass_state_round_trips_with_its_types():
    state = Outer(page="item", inner=Inner(("a", "b"), {"x": 0.5}), best=Inner(("c",)),
                  pairs=[(1, "one"), (2, "two")])
    env = PluginEnv(state, state_type=Outer)
    snap = snapshot_after_reset(env)
    back = PluginEnv(state_type=Outer)
    back.restore(through_text(snap))
    assert back.state == state and type(back.state.inner.path) is tuple
    assert type(back.state.pairs[0]) is tuple


@pytest.mark.parametrize("state, state_type, field_named", [
    ({"seen": {1, 2}}, None, "state['seen'] holds a set"),
    ({"page": ("a", "b")}, None, "state['page'] is a tuple and comes back a list"),
    ({1: "x"}, None, "key 1"),
    (Outer(), None, "state is a Outer and comes back a dict"),
    (Outer(inner=Inner(scores={"x": object()})), Outer, "state.inner.scores['x'] holds a object"),
])
def test_state_that_cannot_round_trip_fails_at_first_snapshot(state, state_type, field_named):
    env = PluginEnv(state, state_type=state_type)
    with pytest.raises(EnvStateError) as e:
        snapshot_after_reset(env)
    message = str(e.value)
    assert "env 'plugin' (tests.test_env_state:PluginEnv)" in message
    assert field_named in message and "state_type" in message


def test_a_snapshot_that_does_not_fit_is_a_clear_error():
    env = PluginEnv(state_type=Outer)
    good = snapshot_after_reset(PluginEnv(Outer(), state_type=Outer))
    for bad in ({}, {**good, "state": [1, 2]}, {**good, "num_steps": "many"},
                {**good, "task": {"id": "x"}}):
        with pytest.raises(EnvStateError, match="env 'plugin'.*snapshot does not fit"):
            env.restore(bad)


def test_difference_names_the_first_changed_field():
    assert state_json.difference(Inner(("a",)), Inner(("a",))) is None
    assert state_json.difference(Inner(("a",)), Inner(("b",))) == \
        "state.path[0] is 'a' and comes back 'b'"
    assert state_json.difference([1, 2], [1]) == "state is [1, 2] and comes back [1]"
    assert state_json.difference(True, 1) == "state is a bool and comes back a int"
    assert state_json.difference(math.nan, math.nan) is None
