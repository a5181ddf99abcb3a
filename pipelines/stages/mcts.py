"""Stage `mcts`: search at inference on the test tasks (eval.mcts), the `<policy>+mcts` rows.

It runs after the last round's eval, so it can search with any final policy of any round,
GRPO's included, and with `best` (eval.mcts_policies) the one best on the validation tasks,
which only the last round knows. Each policy plays the first eval.mcts_tasks test tasks with
verifier-free MCTS before every committed step or path (pipelines/play.py,
offline_agent/search/inference.py), valued by the last round's learned critic (search.critic
learned, fitted on every round's trees) or the frozen one; each episode is stored as mode
`mcts` as it ends, so a resumed stage searches only the tasks it lacks. Kept apart from the
greedy eval so that choosing its settings never replays (or clears) a greedy episode.
"""

from __future__ import annotations

from offline_agent.evaluation import BASE, MCTS_MODE
from pipelines.artifacts import best_on_validation, eval_policies, round_model
from pipelines.errors import RunError
from pipelines.play import play_stored, played_summary
from pipelines.rounds import round_name
from pipelines.runner import StageContext


def search_policies(ctx: StageContext) -> dict[str, tuple[int, str | None]]:
    """{policy: (its round, adapter folder)} of eval.mcts_policies (every evaluated policy
    when empty), in the order the report lists them."""
    evaluated = {name: (r, folder) for r in range(1, ctx.round + 1)
                 for name, folder in eval_policies(ctx.store, ctx.run_dir, r).items()}
    asked = ctx.cfg.eval.mcts_policies or list(evaluated)
    names = [best_on_validation(ctx.store) if name == "best" else name for name in asked]
    unknown = [n for n in names if n not in evaluated]
    if unknown:
        raise RunError(f"eval.mcts_policies names {', '.join(map(repr, unknown))}, which this "
                       f"run has not evaluated; evaluated: {', '.join(evaluated)}")
    return {name: evaluated[name] for name in dict.fromkeys(names)}


def run_mcts(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    if not cfg.eval.mcts:
        stats = {"skipped": "eval.mcts is false"}
        with store.transaction():
            ctx.mark_done(stats)
        return stats
    tasks = cfg.eval.mcts_test_tasks(store.tasks("test"))
    policies = search_policies(ctx)
    ids = {t.id for t in tasks}
    count = {"all": len(tasks) * len(policies),
             "done": sum(len(store.eval_tasks(p, MCTS_MODE) & ids) for p in policies)}
    searched: dict[str, dict] = {}
    for name, (r, adapter) in policies.items():
        have = store.eval_tasks(name, MCTS_MODE)
        todo = [t for t in tasks if t.id not in have]
        if not todo:
            continue
        print(f"mcts: {name}: {len(todo)} of {len(tasks)} test tasks to search", flush=True)
        model = cfg.model if name == BASE else round_model(cfg, store, ctx.run_dir, r)
        searched[name] = play_stored(ctx, name, model, adapter, MCTS_MODE, todo, count)
    stats = {}
    for name in policies:
        stats[f"{name}+{MCTS_MODE}"] = played_summary(store, cfg.eval, name, MCTS_MODE)
        if name in searched:
            stats[f"{name}+{MCTS_MODE}"]["search"] = searched[name]
    stats["critic"] = round_name("critic", ctx.round) if cfg.search.critic == "learned" else "frozen"
    with store.transaction():
        ctx.mark_done(stats)
    return stats
