"""TRL-shaped environments: a class written for TRL's `GRPOTrainer(environment_factory=...)`
runs through search, mining, training and evaluation as it is (docs/environments.md, "Bring a
TRL environment"). `build_env` is how the pipeline builds any env: an Env subclass (built-in or
by import path) as always, any other class as a TRL environment whose tasks are the rows of
`env.dataset` (shape.py probes the class, tasks.py reads the rows, env.py runs episodes).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from offline_agent.envs.base import Env, EnvFailure, load_class, load_env
from offline_agent.envs.trl.env import TRLEnv
from offline_agent.envs.trl.shape import Shape, ShapeError, probe, reset_problem
from offline_agent.envs.trl.tasks import DatasetError, read_rows, split_tasks
from offline_agent.types import Task

__all__ = ["ShapeError", "TRLEnv", "build_env"]


def build_env(spec: str, dataset: str | None = None, reward_fn: str | None = None,
              **kwargs: Any) -> Env:
    """The env `spec` names, built with `kwargs`. For a TRL class, `seed` (of the split of a
    dataset without a split column) and `max_steps` are the adapter's, the rest go to the
    class; the class, its dataset and its reward are checked once per process, and a
    `ShapeError` names each problem on a line of its own."""
    factory = load_class(spec)
    if isinstance(factory, type) and issubclass(factory, Env):
        if dataset is not None or reward_fn is not None:
            raise ShapeError(spec, ["env.dataset and env.reward_fn are for TRL environment "
                                    "classes; an Env subclass's tasks come from its tasks()"])
        return load_env(spec, **kwargs)
    seed, max_steps = kwargs.pop("seed", 0), kwargs.pop("max_steps", 10)
    shape, tasks = adapted(spec, factory, dataset, reward_fn, seed,
                           json.dumps(kwargs, sort_keys=True, default=repr))
    return TRLEnv(shape, tasks, max_steps=max_steps, seed=seed)


@functools.cache
def adapted(spec: str, factory: Any, dataset: str | None, reward_fn: str | None, seed: int,
            kwargs: str) -> tuple[Shape, dict[str, list[Task]]]:
    """The class's shape and its tasks by split, or a ShapeError with every problem found."""
    if dataset is None:
        raise ShapeError(spec, ["no env.dataset: a TRL environment's tasks are the rows of a "
                                "dataset (a JSONL, CSV or parquet file, or a saved dataset folder)"])
    shape, instance, problems = probe(factory, json.loads(kwargs), reward_fn)
    tasks: dict[str, list[Task]] = {}
    try:
        rows = read_rows(dataset)
        tasks = split_tasks(rows, getattr(factory, "__name__", spec), seed)
    except DatasetError as e:
        problems.append(str(e))
        rows = []
    if not rows and not problems:
        problems.append(f"env.dataset {dataset} has no rows")
    if instance is not None and rows and (wrong := reset_problem(instance, rows[0])):
        problems.append(wrong)
    if not problems:
        problems += episode_problems(TRLEnv(shape, tasks, max_steps=2, seed=seed))
    if problems:
        raise ShapeError(spec, problems)
    return shape, tasks


def episode_problems(env: TRLEnv) -> list[str]:
    """Reset on the first task and the reward at once, as the end of an episode reads it: what
    they return must be a string (or None) and a float."""
    task = (env.tasks("train", 1) or env.tasks("test", 1))[0]
    try:
        env.reset(task)
        env.reward()
    except EnvFailure as e:
        return [str(e)]
    except Exception as e:  # noqa: BLE001 - the user's reset: one clear line
        return [f"reset(**row) raised {type(e).__name__}: {str(e)[:200]}"]
    return []
