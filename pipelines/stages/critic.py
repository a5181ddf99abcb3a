"""Stage `critic`: fit the learned value critic on the stored trees (search.critic: learned),
their children's returns and the rewards of the listed endings at their states (read on the
stored snapshots: offline_agent/value/endings.py).

It runs between search and mine because mining reads it: with search.critic learned, eq. 10's
Q_critic of every stored child is the fitted V(state, action), not the frozen critic's stored
score (offline_agent/mining/value.py). A stage of its own, not part of mine, so `--force`
after a change of `mine.*` re-mines without refitting, and a change of `critic.*` refits
without searching again. Round k's stage (critic@k) fits on the trees of every round so far
(search, search@2, ..., search@k); search@(k+1) scores its proposals with it. Round 1's search
has no trees to learn from and uses the frozen critic.

Resumable: the fitted folder (value_model.save: head, metadata, LoRA adapter) is written whole
under RUN_DIR/checkpoints/<stage>/final with every stored node's predicted value
(values.json), then recorded in the store under "critic/final" with the fit's statistics
(search, mine and eval load it through pipelines/artifacts.py); a stage that finds that
record skips the fit. A fit interrupted before it refits from the start
(seeded: the same critic). Its stats hold the learned critic's concordance on the held-out
tasks' trees and, beside it, the frozen critic's on the same trees.
"""

from __future__ import annotations

import json
from pathlib import Path

from offline_agent.search.concordance import concordance
from pipelines.artifacts import CONCORDANCE, CRITIC, FROZEN, VALUES
from pipelines.config import make_env
from pipelines.errors import RunError
from pipelines.rounds import round_name
from pipelines.runner import StageContext
from storage import NodeRow, Store


def run_critic(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    if cfg.search.critic != "learned":
        stats = {"skipped": "search.critic is not learned"}
    else:
        stats = store.checkpoint(ctx.stage, ctx.shard, CRITIC) or _fit(ctx)
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def stored_trees(store: Store, r: int) -> list[tuple[str, list[NodeRow]]]:
    """(task id, its nodes with texts and snapshots) of every tree of rounds 1..r, round by
    round."""
    return [(t.task_id, store.load_tree(t.tree_id))
            for j in range(1, r + 1) for t in store.trees(round_name("search", j))]


def _fit(ctx: StageContext) -> dict:
    from offline_agent.training.checkpoint import write_atomic
    from offline_agent.value import value_model
    from offline_agent.value.endings import stored_endings
    from offline_agent.value.fit import encode_tree, fit, predict

    cfg, store = ctx.cfg, ctx.store
    trees = stored_trees(store, ctx.round)
    tasks = {t.id: t for t in store.tasks("train")}
    env = make_env(cfg)
    device = value_model.resolve_device(cfg.model.device)
    tokenizer = value_model.load_tokenizer(cfg.model.id)
    items = [item for task_id, nodes in trees for item in encode_tree(
        tokenizer, env.system_prompt(), env.demonstration(), tasks[task_id], nodes,
        stored_endings(env, nodes), cfg.critic.state)]
    if not items:
        raise RunError(f"stage {ctx.stage}: the stored trees hold no visited child to learn from")
    ctx.progress.update(families=len(items))
    model = value_model.build(value_model.load_lm(cfg.model.id, device), cfg.critic)
    fitted = fit(model, items, cfg.critic)
    values = predict(fitted.model, items, cfg.critic.pack_tokens)

    def fill(tmp: Path) -> None:
        value_model.save(fitted.model, tmp, cfg.model.id, cfg.critic)
        (tmp / VALUES).write_text(json.dumps({str(k): v for k, v in values.items()}))

    folder = write_atomic(ctx.checkpoint_dir / "final", fill)
    val = set(fitted.val_tasks)
    held_out = [(tasks[t].env, nodes) for t, nodes in trees if t in val]
    stats = {"folder": str(folder.relative_to(ctx.run_dir)), "trees": len(trees),
             **fitted.metrics, "concordance_trees": len(held_out),
             CONCORDANCE: concordance(held_out, lambda c: values.get(c.node_id)),
             FROZEN: concordance(held_out)}
    store.set_checkpoint(ctx.stage, ctx.shard, CRITIC, stats)
    return stats

