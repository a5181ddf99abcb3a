"""Stage `tasks`: fix the run's train, test and validation tasks in the store, so every later
stage (and every shard) works on the same list, whatever the env does later.

Validation tasks (env.val_tasks) come from the env's train split, after the first
env.train_tasks: `tasks("train", train_tasks + val_tasks)[train_tasks:]`, stored with split
"val". The Env contract stays train | test, so any env gets a validation split, drawn like
its train tasks and disjoint from the test ones as its train tasks are; the stage checks
that no task id repeats across the three, and that the longer draw starts with the train
tasks (so turning validation on leaves them as they were).
"""

from __future__ import annotations

from dataclasses import replace

from offline_agent.evaluation import VAL
from offline_agent.types import Task
from pipelines.config import make_env
from pipelines.runner import StageContext


def split_tasks(env, train_n: int, test_n: int, val_n: int) -> dict[str, list[Task]]:
    """{"train", "test", "val"}: the run's tasks of each split, checked (each returned by the
    split asked for, no id twice across splits); a ValueError names the problem."""
    drawn = env.tasks("train", train_n + val_n)
    if val_n and [t.id for t in drawn[:train_n]] != [t.id for t in env.tasks("train", train_n)]:
        raise ValueError(f"env {env.name!r}: tasks('train', {train_n + val_n}) does not start "
                         f"with tasks('train', {train_n}), so validation tasks would change the "
                         "train tasks; make the first n train tasks the same for every n")
    out = {"train": drawn[:train_n], "test": env.tasks("test", test_n), VAL: drawn[train_n:]}
    for want in ("train", "test"):
        wrong = [t for t in out[want] + (out[VAL] if want == "train" else []) if t.split != want]
        if wrong:
            raise ValueError(f"env {env.name!r}: tasks({want!r}) returned task "
                             f"{wrong[0].id!r} of split {wrong[0].split!r}")
    seen: dict[str, str] = {}
    for split, tasks in out.items():
        for t in tasks:
            if t.id in seen:
                where = split if seen[t.id] == split else f"{seen[t.id]} and {split}"
                raise ValueError(f"env {env.name!r} returned task id {t.id!r} more than once "
                                 f"({where} tasks)")
            seen[t.id] = split
    out[VAL] = [replace(t, split=VAL) for t in out[VAL]]
    return out


def run_tasks(ctx: StageContext) -> dict:
    cfg = ctx.cfg.env
    env = make_env(ctx.cfg)
    splits = split_tasks(env, cfg.train_tasks, cfg.test_tasks, cfg.val_tasks)
    stats = {"env": env.name, **{k: len(v) for k, v in splits.items() if k != VAL or v}}
    with ctx.store.transaction():  # idx: train, then test, then val (older runs' numbers hold)
        ctx.store.insert_tasks(splits["train"] + splits["test"] + splits[VAL], stage=ctx.stage)
        ctx.mark_done(stats)
    return stats
