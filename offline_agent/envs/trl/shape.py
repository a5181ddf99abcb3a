"""What a TRL `environment_factory` class offers, probed as TRL's GRPOTrainer probes it, and
each thing wrong with it as one line.

TRL builds one instance and lists the functions of its class (`inspect.getmembers` on the class,
so properties are not evaluated): `reset` is required, `get_reward` optional, every other public
function is a tool, whose spec transformers builds from its type hints and its docstring's
`Args:` section (`transformers.utils.get_json_schema`, what `apply_chat_template(tools=...)`
calls on a method). `probe` does the same and collects every problem instead of stopping at the
first, so check-env and a run name them all at once (`ShapeError`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

RESERVED = ("reset", "get_reward")  # functions of the class that are not tools


class ShapeError(ValueError):
    """A class, dataset or reward that cannot be adapted: one line per problem."""

    def __init__(self, name: str, problems: list[str]):
        self.problems = problems
        super().__init__(f"{name} is not a usable TRL environment:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class Shape:
    """A TRL environment as the adapter runs it."""

    factory: Callable[..., Any]  # what env.name names: the class, or a function making one
    kwargs: dict[str, Any]  # the factory's arguments (TRL passes none)
    name: str  # the class's name: the env's and its tasks' name
    tools: list[dict]  # each tool method's spec, as transformers builds it
    reward_fn: Callable[..., Any] | None  # a TRL reward function; None: the class's get_reward


def probe(factory: Any, kwargs: dict[str, Any], reward_fn: str | None
          ) -> tuple[Shape | None, Any, list[str]]:
    """(the shape, the instance probed, problems): the shape is None where a problem stops it."""
    if not callable(factory):
        return None, None, [f"{factory!r} is not a class: env.name must name the class TRL's "
                            "environment_factory takes"]
    try:
        instance = factory(**kwargs)
    except Exception as e:  # noqa: BLE001 - the user's constructor: report, do not crash
        return None, None, [f"building it raised {type(e).__name__}: {str(e)[:160]}"]
    cls = type(instance)
    functions = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
    problems = []
    if "reset" not in functions:
        problems.append("no reset(**kwargs) method: TRL calls it before every episode with the "
                        "dataset row's columns")
    tools, tool_problems = tool_specs(instance, [n for n in functions
                                                 if n not in RESERVED and not n.startswith("_")])
    fn, reward_problems = reward_source(functions.get("get_reward"), reward_fn)
    problems += tool_problems + reward_problems
    shape = Shape(factory, dict(kwargs), cls.__name__, tools, fn)
    return (None if problems else shape), instance, problems


def tool_specs(instance: Any, names: list[str]) -> tuple[list[dict], list[str]]:
    """Each tool method's spec from transformers' own schema builder, and what it refused."""
    from transformers.utils import get_json_schema

    if not names:
        return [], ["no tool methods: every public method but reset and get_reward is a tool"]
    specs, problems = [], []
    for name in names:
        method = getattr(instance, name)
        if inspect.iscoroutinefunction(method):
            problems.append(f"tool {name} is async: only plain methods are run here")
            continue
        try:
            specs.append(get_json_schema(method))
        except Exception as e:  # noqa: BLE001 - transformers' reasons are one clear line each
            problems.append(f"tool {name}: {str(e).splitlines()[0][:200]}")
    return specs, problems


def reward_source(get_reward: Any, reward_fn: str | None) -> tuple[Callable | None, list[str]]:
    """(the reward function named by import path, or None for get_reward; problems): one
    source, as the adapter reads one reward per episode."""
    if reward_fn is None:
        if get_reward is None:
            return None, ["no get_reward() method and no env.reward_fn: nothing scores an episode"]
        if inspect.iscoroutinefunction(get_reward):
            return None, ["get_reward() is async: only a plain method is run here"]
        extra = [p for p in list(inspect.signature(get_reward).parameters.values())[1:]
                 if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if extra:
            return None, [f"get_reward() takes {', '.join(p.name for p in extra)}: TRL calls it "
                          "with no argument"]
        return None, []
    if get_reward is not None:
        return None, ["both get_reward() and env.reward_fn: keep one source of the reward"]
    module, sep, attr = reward_fn.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr) if sep else None
    except (ImportError, AttributeError) as e:
        return None, [f"env.reward_fn {reward_fn!r} cannot be loaded: {e}"]
    if not callable(fn):
        return None, [f"env.reward_fn {reward_fn!r} is not a function 'package.module:function'"]
    return fn, []


def reset_problem(instance: Any, row: dict[str, Any]) -> str | None:
    """Whether `reset` can take a row's columns as keyword arguments, as TRL passes them
    (None also where there is no reset: `probe` names that)."""
    if not callable(getattr(instance, "reset", None)):
        return None
    try:
        inspect.signature(instance.reset).bind(**row)
    except TypeError as e:
        return (f"reset() cannot take the dataset's columns ({', '.join(row)[:80]}): {e}; "
                "TRL calls reset(**row): write reset(self, **kwargs)")
    return None
