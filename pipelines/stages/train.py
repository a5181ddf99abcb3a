"""Stage `train`: each policy of train.policies, LoRA on the mined pairs or the RFT set.

Per policy: a finished one (checkpoint key "<policy>/final" in the store) is skipped; an
interrupted one resumes from the step checkpoint the store records under "<policy>". Every
optimizer step's metrics land in the store's metrics table (series = policy) as it ends and
in run.report_to's trackers, and a progress bar per policy on stderr shows its step of the
total, the loss, elapsed and remaining time (progress.json: `step` of `steps`).
Round k's train stage (train@k) trains on mine@k's data, on top of round k's model
(pipelines/artifacts.py). With train.select: val, each policy's final adapter is then its best
checkpoint on the validation tasks (pipelines/selection.py). That final adapter is then
scored on the mined pairs its seeded sample (train.max_pairs) left out, recorded under
"held_out" in the same record (offline_agent/training/heldout.py; n 0 when it took them all),
and with train.merge written merged into a full model (under "merged").
"""

from __future__ import annotations

import random
from pathlib import Path

from offline_agent.mining.advice import NO_ROWS, NO_STEP_PAIRS
from offline_agent.policy.models import copy_note, public_id
from offline_agent.training.card import Provenance
from pipelines.artifacts import (
    HELD_OUT,
    iterate_policy,
    keep_candidate,
    round_model,
    stored_iterate,
    write_iterate,
    write_merged_whole,
)
from pipelines.config import RunConfig
from pipelines.errors import RunError
from pipelines.rounds import round_name
from pipelines.runner import StageContext
from pipelines.selection import select_checkpoint
from storage import Store

MERGED = "merged"  # the "<policy>/final" record's key (and folder) of train.merge's model
# policy -> the pair kinds it trains on (rft trains on examples instead)
PAIR_KINDS = {"dpo_outcome": ("trajectory",), "dpo_step": ("step",),
              "dpo_step_outcome": ("step", "trajectory")}


def policy_rows(store, policy: str, max_rows: int, seed: int,
                hindsight: bool = True, mine: str = "mine") -> list[dict]:
    """The policy's training rows (of stage `mine`) in a stable order, as dicts by column
    (what offline_agent.training reads); a seeded sample of max_rows when set. RFT trains on
    the successes, plus the hindsight relabels when `hindsight` (mine.rft_hindsight)."""
    if policy == "rft":
        kinds = ("rft", "hindsight") if hindsight else ("rft",)
        rows = [r.to_row() for r in store.examples(kinds=kinds, stage=mine)]
    else:
        rows = mined_pairs(store, policy, mine)
    return split_sample(rows, max_rows, seed)[0]


def mined_pairs(store, policy: str, mine: str) -> list[dict]:
    """Every mined pair of the kinds a DPO policy trains on, in pair_id order."""
    return sorted((r.to_row() for kind in PAIR_KINDS[policy] for r in store.pairs(kind, mine)),
                  key=lambda r: r["pair_id"])


def split_sample(rows: list, max_rows: int, seed: int) -> tuple[list, list]:
    """(the seeded sample of max_rows rows, in their order; the rows it leaves out); all rows
    and none left out when max_rows is 0 or not below their number."""
    if not max_rows or len(rows) <= max_rows:
        return rows, []
    keep = set(random.Random(seed).sample(range(len(rows)), max_rows))
    return ([r for i, r in enumerate(rows) if i in keep],
            [r for i, r in enumerate(rows) if i not in keep])


def held_out_pairs(store, policy: str, max_rows: int, seed: int,
                   mine: str = "mine") -> tuple[str, list[dict], list[dict]]:
    """(the policy whose sample they are left out of, the mined pairs, those left out): the
    pairs of the policy's kinds its training sample did not take. RFT trains on no pair: it
    is scored on the step pairs dpo_step's sample leaves out, so both rows score the same."""
    source = "dpo_step" if policy == "rft" else policy
    rows = mined_pairs(store, source, mine)
    return source, rows, split_sample(rows, max_rows, seed)[1]


def run_train(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    _check_needed(ctx)
    stats = {}
    for policy in cfg.train.policies:
        final = store.checkpoint(ctx.stage, ctx.shard, f"{policy}/final")
        if final is None:
            rows = _rows(ctx, policy)
            if not rows:
                stats[policy] = {"skipped": no_data_why(ctx, policy, why=False)}
                print(f"{ctx.stage}: {policy}: skipped, {no_data_why(ctx, policy)}", flush=True)
                continue
            ctx.progress.update(policy=policy, steps=_num_steps(len(rows), cfg))
            final = _train_policy(ctx, policy, rows)
        if cfg.train.select == "val" and "selected" not in final:
            final = select_checkpoint(ctx, policy, final)
        if HELD_OUT not in final:
            final = _score_held_out(ctx, policy, final)
        if cfg.train.merge and MERGED not in final:
            final = _merge(ctx, policy, final)
        stats[policy] = final
    if ctx.round < cfg.run.iterations:
        _next_round_model(ctx)
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def _num_steps(rows: int, cfg: RunConfig) -> int:
    """The optimizer steps a policy trains for (progress.json's `steps`, beside `step`)."""
    from offline_agent.training.trainer import num_steps

    return num_steps(rows, cfg.train)


def _next_round_model(ctx: StageContext) -> None:
    """The next round's model, written where its adapter was trained: this round's model with
    the train.iterate policy's final adapter merged in (pipelines/artifacts.py), which
    search@(k+1) loads. Written again by each attempt of this stage, so a retrained adapter
    never leaves an older merge behind; where that policy trained nothing, search@(k+1) says
    so."""
    if ctx.store.checkpoint(ctx.stage, ctx.shard, f"{iterate_policy(ctx.cfg)}/final"):
        write_iterate(ctx.cfg, ctx.store, ctx.run_dir, ctx.round + 1)


def _rows(ctx: StageContext, policy: str) -> list[dict]:
    """The policy's training rows in this round."""
    cfg = ctx.cfg
    return policy_rows(ctx.store, policy, cfg.train.max_pairs, cfg.train.seed,
                       cfg.mine.rft_hindsight, round_name("mine", ctx.round))


def no_data_why(ctx: StageContext, policy: str, why: bool = True) -> str:
    """Why a policy has no training rows; with `why`, the mine stage's own why (and what to
    change) where it trains on step pairs."""
    kinds = PAIR_KINDS.get(policy) or (("rft", "hindsight") if ctx.cfg.mine.rft_hindsight
                                       else ("rft",))
    text = "no training data: " + "; ".join(NO_ROWS[k] for k in kinds)
    mine = ctx.store.stage(round_name("mine", ctx.round))
    advice = (mine.stats or {}).get(NO_STEP_PAIRS) if mine and why and "step" in kinds else None
    return text + (f"; {advice}" if advice else "")


def _check_needed(ctx: StageContext) -> None:
    """Refuse, before training anything, a run whose later stage needs a policy this round
    cannot train (no rows): grpo.init, or train.iterate for the next round. Known now, it
    would otherwise stop the run after training the others."""
    cfg, store = ctx.cfg, ctx.store
    needed = {}
    if ctx.round == 1 and cfg.grpo.enabled and cfg.grpo.init != "base":
        needed[cfg.grpo.init] = (f"grpo.init={cfg.grpo.init}", "grpo.init to base or another "
                                 "policy")
    if ctx.round < cfg.run.iterations:
        needed.setdefault(iterate_policy(cfg), (f"train.iterate={iterate_policy(cfg)}",
                                                "train.iterate to another policy"))
    for policy, (key, fix) in needed.items():
        done = store.checkpoint(ctx.stage, ctx.shard, f"{policy}/final") is not None
        if not done and not _rows(ctx, policy):
            raise RunError(f"{key}, but stage {ctx.stage} cannot train {policy!r}, "
                           f"{no_data_why(ctx, policy)}. Set {fix}, or mine data for it")


def _train_policy(ctx: StageContext, policy: str, rows: list[dict]) -> dict:
    from offline_agent.training.fit import fit_policy

    cfg, store = ctx.cfg, ctx.store
    folder = ctx.checkpoint_dir / policy
    saved = store.checkpoint(ctx.stage, ctx.shard, policy)

    def on_metrics(step: int, metrics: dict) -> None:
        ctx.log_metrics(policy, step, metrics)
        ctx.progress.update(policy=policy, step=step, loss=round(metrics["loss"], 4))

    def on_checkpoint(step: int, path: Path) -> None:
        if cfg.train.select == "val":  # kept before the store points past it
            keep_candidate(folder, step, path)
        store.set_checkpoint(ctx.stage, ctx.shard, policy,
                             {"step": step, "folder": _in_run(ctx, path)})

    model = round_model(cfg, store, ctx.run_dir, ctx.round)
    metrics = fit_policy(policy, rows, model.id, cfg.train, folder, adapter=model.adapter,
                         resume=str(ctx.run_dir / saved["folder"]) if saved else None,
                         provenance=provenance(cfg, store, ctx.round),
                         on_metrics=on_metrics,
                         on_checkpoint=on_checkpoint)
    final = {"folder": _in_run(ctx, folder / "final"), "step": metrics["step"],
             "items": metrics["items"], "loss": round(metrics["loss"], 4),
             "trained_tokens": metrics["action_tokens"], "agent_tokens": metrics["agent_tokens"]}
    store.set_checkpoint(ctx.stage, ctx.shard, f"{policy}/final", final)
    return final


def _merge(ctx: StageContext, policy: str, final: dict) -> dict:
    """train.merge: the final adapter (after selection, so the one the policy's rows are
    about) merged into a full model at checkpoints/<stage>/<policy>/merged, written whole
    before the record points at it."""
    out = ctx.checkpoint_dir / policy / MERGED
    write_merged_whole(out, round_model(ctx.cfg, ctx.store, ctx.run_dir, ctx.round),
                       ctx.run_dir / final["folder"], ctx.cfg)
    value = {**final, MERGED: _in_run(ctx, out)}
    ctx.store.set_checkpoint(ctx.stage, ctx.shard, f"{policy}/final", value)
    return value


def _score_held_out(ctx: StageContext, policy: str, final: dict) -> dict:
    """Score the final adapter (the selected one with train.select: val) on the mined pairs
    its training sample left out (offline_agent/training/heldout.py) and record the figures
    under "held_out" in its "<policy>/final" record; a crash before that scores again."""
    from offline_agent.training.heldout import score_pairs

    cfg, store = ctx.cfg, ctx.store
    source, mined, rows = held_out_pairs(store, policy, cfg.train.max_pairs, cfg.train.seed,
                                         round_name("mine", ctx.round))
    if rows:
        print(f"train: {policy}: scoring {len(rows)} held-out pairs", flush=True)
    model = round_model(cfg, store, ctx.run_dir, ctx.round)

    def on_scored(done: int, total: int) -> None:
        ctx.progress.update(policy=f"{policy}/held-out", pairs_scored=done, pair_scores=total)

    scores = score_pairs(rows, model.id, str(ctx.run_dir / final["folder"]), cfg.train,
                         model.adapter, on_scored=on_scored)
    value = {**final, HELD_OUT: {"left_out_of": source, "kinds": list(PAIR_KINDS[source]),
                                 "mined": len(mined), **scores}}
    store.set_checkpoint(ctx.stage, ctx.shard, f"{policy}/final", value)
    return value


def provenance(cfg: RunConfig, store: Store, k: int) -> Provenance:
    """For the adapter's card: round k trains on cfg.model (named by its public id) with
    model.adapter, then each earlier round's iterate adapter, merged in (artifacts.py)."""
    merged = [f"`{cfg.model.adapter}` (model.adapter)"] if cfg.model.adapter else []
    for j in range(2, k + 1):
        iterate = stored_iterate(store, j)
        merged.append(f"the final adapter of policy `{iterate['policy']}` of offline-agent run "
                      f"`{store.run_id}` (`{iterate['adapter']}` in its run directory)")
    return Provenance(public_id(cfg.model.id), merged, copy_note(cfg.model.id), store.run_id, k)


def _in_run(ctx: StageContext, path: Path) -> str:
    """A folder as the store records it: relative to the run directory, so a run directory
    can move (or be read from another working directory) and its records still hold."""
    return str(path.relative_to(ctx.run_dir))

