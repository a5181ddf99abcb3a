"""Stage `tasks`: fix the run's train and test tasks in the store, so every later stage (and
every shard) works on the same list, whatever the env does later."""

from __future__ import annotations

from pipelines.config import make_env
from pipelines.runner import StageContext


def run_tasks(ctx: StageContext) -> dict:
    cfg = ctx.cfg.env
    env = make_env(ctx.cfg)
    train, test = env.tasks("train", cfg.train_tasks), env.tasks("test", cfg.test_tasks)
    ids = [t.id for t in train + test]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"env {cfg.name!r} returned task id {dup!r} more than once")
    for want, tasks in (("train", train), ("test", test)):
        wrong = [t for t in tasks if t.split != want]
        if wrong:
            raise ValueError(f"env {cfg.name!r}: tasks({want!r}) returned task "
                             f"{wrong[0].id!r} of split {wrong[0].split!r}")
    stats = {"env": env.name, "train": len(train), "test": len(test)}
    with ctx.store.transaction():
        ctx.store.insert_tasks(train + test, stage=ctx.stage)
        ctx.mark_done(stats)
    return stats
