"""Checkpoint selection on the validation split (train.select: val), part of the train stage.

While a policy trains, each step checkpoint's adapter (not its optimizer state) is kept under
RUN_DIR/checkpoints/<train stage>/<policy>/candidates/step-<n> (pipelines/artifacts.py); the
trainer keeps only the latest full checkpoint. Once the policy is trained, every candidate and the final adapter
play the validation tasks greedily (episodes stored like eval episodes, as policy
`<policy>/step-<n>` on split "val", so they never enter the test table), and the best one
(validation success, then mean reward, then the later step) becomes the policy's final
adapter: the store's "<policy>/final" record points at its folder and says which and why
under "selected". A crash mid-selection resumes: the record without "selected" makes the
stage select again, and the episodes already stored are not replayed.
"""

from __future__ import annotations

from offline_agent.evaluation import MODE, VAL, Episode, episode_row, rates
from pipelines.artifacts import candidates, round_model
from pipelines.play import play
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
    adapter (with the scores and the reason under "selected"); returns that record."""
    store, folder = ctx.store, ctx.checkpoint_dir / policy
    tasks = store.tasks(VAL)
    model = round_model(ctx.cfg, store, ctx.run_dir, ctx.round)
    scores = []
    for step, adapter in candidates(folder, final):
        label = f"{round_name(policy, ctx.round)}/step-{step}"
        have = store.eval_tasks(label, MODE)
        todo = [t for t in tasks if t.id not in have]
        if todo:
            print(f"train: select {policy}: step {step} on {len(todo)} validation tasks",
                  flush=True)

            def on_done(t, mode: str, label: str = label) -> None:
                store.insert_eval_episodes([episode_row(t, label, mode)], ctx.stage)

            play(ctx, model, str(adapter), {MODE: todo}, on_done)  # greedy only
        played = [Episode.from_row(r) for r in store.eval_episodes(label, MODE)]
        scores.append({"step": step, "folder": str(adapter.relative_to(ctx.run_dir)),
                       "policy": label, **rates(played)})
    best = choose(scores)
    value = {**final, "folder": best["folder"],
             "selected": {"by": "val", "step": best["step"], "last_step": final["step"],
                          "why": reason(best, scores), "candidates": scores}}
    store.set_checkpoint(ctx.stage, ctx.shard, f"{policy}/final", value)
    return value
