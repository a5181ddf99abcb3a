"""Checkpoint selection on the validation split (train.select: val), part of the train stage.

While a policy trains, each step checkpoint's adapter (not its optimizer state) is kept under
RUN_DIR/checkpoints/<train stage>/<policy>/candidates/step-<n> (pipelines/artifacts.py); the
trainer keeps only the latest full checkpoint. Once the policy is trained, every candidate and the final adapter
play the validation tasks greedily (episodes stored like eval episodes, as policy
`<policy>/step-<n>` on split "val", so they never enter the test table), and the best one
(validation success, then mean reward, then the later step) becomes the policy's final
adapter: the store's "<policy>/final" record points at its folder and says which and why
under "selected". A crash mid-selection resumes: the record without "selected" makes the
stage select again, and the episodes already stored are not replayed. While candidates play,
`offline-agent status` shows which and how many of their validation episodes are done.
"""

from __future__ import annotations

from offline_agent.evaluation import MODE, VAL, Episode, rates
from pipelines.artifacts import candidates, round_model
from pipelines.play import play_stored
from pipelines.rounds import round_name
from pipelines.runner import StageContext


def choose(scores: list[dict]) -> dict:
    """The best candidate: highest validation success, then mean reward, then the later step
    (so a tie keeps what train.select=last would)."""
    return max(scores, key=lambda s: (s["success_rate"] or 0.0, s["mean_reward"] or 0.0,
                                      s["step"]))


def reason(best: dict, scores: list[dict]) -> str:
    """Why `best` was chosen, in words, for the store and the report."""
    top = [s for s in scores if s["success_rate"] == best["success_rate"]]
    why = ("highest validation success" if len(top) == 1 else
           "highest validation success, tied; mean reward broke the tie"
           if sum(s["mean_reward"] == best["mean_reward"] for s in top) == 1
           else "highest validation success and mean reward, tied; the later step")
    return (f"step {best['step']} of {len(scores)} checkpoints: {why} "
            f"({best['success_rate']:.1%} of {best['n_tasks']} tasks, mean reward "
            f"{best['mean_reward']:.3f})")


def select_checkpoint(ctx: StageContext, policy: str, final: dict) -> dict:
    """Score each candidate of `policy` on the validation tasks, record the best as its final
    adapter (with the scores and the reason under "selected"); returns that record. While it
    plays, progress.json counts the episodes of all candidates (policy `<policy>/step-<n>`)."""
    store, folder = ctx.store, ctx.checkpoint_dir / policy
    tasks = store.tasks(VAL)
    model = round_model(ctx.cfg, store, ctx.run_dir, ctx.round)
    labelled = [(f"{round_name(policy, ctx.round)}/step-{step}", step, adapter)
                for step, adapter in candidates(folder, final)]
    todo = {label: [t for t in tasks if t.id not in store.eval_tasks(label, MODE)]
            for label, _, _ in labelled}
    count = {"all": len(tasks) * len(labelled)}
    count["done"] = count["all"] - sum(map(len, todo.values()))
    scores = []
    for label, step, adapter in labelled:
        if todo[label]:
            print(f"{ctx.stage}: select {policy}: step {step} on {len(todo[label])} "
                  "validation tasks", flush=True)
            play_stored(ctx, label, model, str(adapter), MODE, todo[label], count)  # greedy
        played = [Episode.from_row(r) for r in store.eval_episodes(label, MODE)]
        scores.append({"step": step, "folder": str(adapter.relative_to(ctx.run_dir)),
                       "policy": label, **rates(played)})
    best = choose(scores)
    value = {**final, "folder": best["folder"],
             "selected": {"by": "val", "step": best["step"], "last_step": final["step"],
                          "why": reason(best, scores), "candidates": scores}}
    store.set_checkpoint(ctx.stage, ctx.shard, f"{policy}/final", value)
    return value
