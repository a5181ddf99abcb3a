"""Rounds of `run.iterations`: the names of round k's stages and policies, and its model.

Round 1 is the plain pipeline. Round k >= 2 runs search, critic, mine, train and eval again
as `search@k`, `critic@k`, `mine@k`, `train@k`, `eval@k`; every row a stage writes carries
its stage name, so each round's trees, episodes, pairs, examples, checkpoints and metrics
stay apart (and `--force` clears one round only). Round k's trained policies are named `<policy>@k`.
A stage knows its round as data (Stage.round, ctx.round); the name only labels the rows.

Round k >= 2 searches with, and trains a fresh LoRA on top of, the iterate of round k-1:
round k-1's model with the final adapter of its `train.iterate` policy merged in, written
once as a full model folder by search@k. The DPO reference of round k (the model with its
adapter disabled) is therefore that iterate.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pipelines.config import ModelConfig, RunConfig
from pipelines.runner import RunError, StageContext
from storage import Store

ITERATE = "iterate"  # search@k's checkpoint key (and folder) of the model round k runs with


def round_name(name: str, r: int) -> str:
    """Round r's name of a stage or policy: unchanged in round 1, `name@r` after."""
    return name if r == 1 else f"{name}@{r}"


def stored_rounds(rows: Callable[[str], list], name: str) -> list[int]:
    """The rounds r whose stage `name` left rows (rows(round_name(name, r)), e.g.
    store.trees and "search"), in order. Rounds run one after another (round r starts from
    round r-1's training), so the first round without rows ends the list."""
    out: list[int] = []
    while rows(round_name(name, len(out) + 1)):
        out.append(len(out) + 1)
    return out


def trained_policies(store: Store) -> dict[str, dict]:
    """{policy name of its round: the final checkpoint train@k recorded}, by round, then in
    the order each round finished them. A round without any trained policy ends the list:
    no later round can have run (it would start from one)."""
    out: dict[str, dict] = {}
    r = 1
    while finals := store.final_checkpoints(round_name("train", r)):
        out.update({round_name(name, r): value for name, value in finals.items()})
        r += 1
    return out


def round_model(cfg: RunConfig, store: Store, run_dir: Path, r: int) -> ModelConfig:
    """The model round r searches with and trains on: cfg.model in round 1, else the iterate
    search@r wrote (a full model folder, so no adapter)."""
    if r == 1:
        return cfg.model
    value = store.checkpoint(round_name("search", r), "", ITERATE)
    if value is None:
        raise RunError(f"round {r} has no model yet: stage {round_name('search', r)!r} writes "
                       f"it (round {r - 1}'s iterate); run that stage first")
    return replace(cfg.model, id=str(run_dir / value["folder"]), adapter=None)


def iterate_policy(cfg: RunConfig) -> str:
    """The policy whose final adapter the next round continues from."""
    return cfg.train.iterate or cfg.train.policies[-1]


def make_iterate(ctx: StageContext) -> dict:
    """Round r's model (r >= 2): round r-1's model with its iterate policy's final adapter
    merged in, written to RUN_DIR/checkpoints/search@r/iterate once (a resumed stage reuses
    it); returns the checkpoint recorded for it."""
    from offline_agent.training.model import write_merged

    cfg, store, r = ctx.cfg, ctx.store, ctx.round
    done = store.checkpoint(ctx.stage, ctx.shard, ITERATE)
    if done is not None:
        return done
    previous = round_model(cfg, store, ctx.run_dir, r - 1)
    policy = iterate_policy(cfg)
    train = round_name("train", r - 1)
    final = store.checkpoint(train, "", f"{policy}/final")
    if final is None:
        row = store.stage(train)
        raise RunError(f"round {r} starts from round {r - 1}'s {policy!r} policy, which stage "
                       f"{train!r} has not trained (stats: {row.stats if row else None}); "
                       "set train.iterate to a policy it trained")
    out = ctx.checkpoint_dir / ITERATE
    tmp = ctx.checkpoint_dir / f".{ITERATE}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    write_merged(previous.id, str(ctx.run_dir / final["folder"]), str(tmp), cfg.train,
                 base_adapter=previous.adapter)
    shutil.rmtree(out, ignore_errors=True)  # a crash between write and record left one
    os.replace(tmp, out)
    value = {"folder": str(out.relative_to(ctx.run_dir)), "policy": round_name(policy, r - 1),
             "adapter": final["folder"]}
    store.set_checkpoint(ctx.stage, ctx.shard, ITERATE, value)
    return value
