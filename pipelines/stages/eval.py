"""Stage `eval`: greedy episodes on the held-out test tasks, for the base model and for every
policy the train and grpo stages finished.

Trained policies are found in the store (checkpoints `train/<policy>/final` and
`grpo/final`, written once the adapter folder is complete), so the stage needs no list of
them. Each episode is
committed as it ends; a resumed stage skips the (policy, mode, task) rows it already has.
The statistics are left to the report, which recomputes them from the rows. With eval.mcts,
each policy also plays the first eval.mcts_tasks test tasks with search at inference
(pipelines/play.py, offline_agent/search/inference.py: verifier-free MCTS, then the committed
episode), stored as mode `mcts` one task at a time, so a resumed stage searches only the tasks
it lacks.
Round k >= 2's stage (eval@k) plays the policies train@k finished (named `<policy>@k`), each
on top of round k's model; base is played once, by round 1's.
"""

from __future__ import annotations

from pathlib import Path

from offline_agent.evaluation import BASE, MCTS_MODE, MODE, Episode, episode_row, summarize
from offline_agent.types import Trajectory
from pipelines.artifacts import round_model
from pipelines.play import play
from pipelines.rounds import round_name
from pipelines.runner import StageContext


def eval_policies(store, run_dir: Path, r: int = 1) -> dict[str, str | None]:
    """{policy: adapter folder}: base (no adapter; round 1 only), then each policy round r
    trained, named for its round. A relative folder is relative to the run directory."""
    out: dict[str, str | None] = {BASE: None} if r == 1 else {}
    finals = store.final_checkpoints(round_name("train", r))
    if r == 1:  # GRPO refines round 1's policy (stage grpo)
        finals.update(store.final_checkpoints("grpo"))
    for name, value in finals.items():
        name = round_name(name, r)
        folder = Path(value["folder"])
        folder = folder if folder.is_absolute() else run_dir / folder
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"policy {name!r}: the train stage recorded adapter folder "
                                    f"{folder}, which holds no adapter_config.json")
        out[name] = str(folder)
    return out


def run_eval(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    modes = cfg.eval.modes(store.tasks("test"))
    policies = eval_policies(store, ctx.run_dir, ctx.round)
    total = sum(len(tasks) for tasks in modes.values()) * len(policies)
    done = sum(len(store.eval_tasks(p, m)) for p in policies for m in modes)
    searched: dict[str, dict] = {}
    for name, adapter in policies.items():
        have = {m: store.eval_tasks(name, m) for m in modes}
        todo = {m: [t for t in tasks if t.id not in have[m]] for m, tasks in modes.items()}
        if not any(todo.values()):
            continue
        print(f"eval: {name}: " + ", ".join(f"{len(todo[m])} of {len(modes[m])} test tasks to "
                                           f"play {m}" for m in modes), flush=True)
        # `offline-agent status` shows where a (resumed) stage stands before its first episode
        ctx.progress.update(policy=name, episodes_done=done, episodes=total)

        def on_done(t: Trajectory, mode: str, name: str = name) -> None:
            nonlocal done
            store.insert_eval_episodes([episode_row(t, name, mode)], ctx.stage)
            done += 1
            ctx.progress.update(policy=name, episodes_done=done, episodes=total)

        model = cfg.model if name == BASE else round_model(cfg, store, ctx.run_dir, ctx.round)
        searched[name] = play(ctx, model, adapter, todo, on_done)
    stats = _stats(store, cfg.eval, policies, modes, searched)
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def _stats(store, eval_cfg, policies, modes, searched: dict[str, dict]) -> dict:
    """Each policy's summary (`<policy>+mcts` for search at inference, with its searches'
    totals when this attempt ran them)."""
    stats = {}
    for name in policies:
        for mode in modes:
            summary = summarize([Episode.from_row(r) for r in store.eval_episodes(name, mode)],
                                eval_cfg)
            key = name if mode == MODE else f"{name}+{mode}"
            stats[key] = {k: summary[k] for k in ("n_tasks", "success_rate", "ci95",
                                                  "mean_reward", "mean_reward_ci95")}
            if mode == MCTS_MODE and name in searched:
                stats[key]["search"] = searched[name]
    return stats
