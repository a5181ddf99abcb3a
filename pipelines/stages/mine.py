"""Stage `mine`: the stored trees and episodes -> preference pairs and SFT examples.

Step pairs are mined and balanced in one SQL pass over every node (storage/mining.py); their
conversations are rebuilt from the stored trees. Outcome pairs, RFT examples and hindsight
relabels come from the stored episodes (search rollouts and greedy baseline) of the train
tasks. Everything lands in one transaction with the stage's done mark; `--force` after a
change of `mine.*` re-mines from the stored trees without searching again.

Round k's mine stage reads only round k's trees and episodes: round 1's search and the
greedy baseline, round k >= 2 its own search@k (pipelines/stages/rounds.py).
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import replace

from offline_agent.mining.build import Context, episode_messages, step_pair_messages
from offline_agent.mining.config import MineConfig
from offline_agent.mining.hindsight import Relabel, relabel
from offline_agent.mining.pairs import distinct_episodes, outcome_pairs, step_params
from offline_agent.types import SUCCESS, Task, step_from_dict
from pipelines.config import make_env
from pipelines.runner import StageContext
from pipelines.stages.rounds import round_name
from storage import (
    IDS_PER_ROUND,
    ExampleRow,
    PairRow,
    Store,
    TrajectoryRow,
    select_step_pairs,
)


def sources(r: int) -> list[tuple[str, str]]:
    """(source, stage) of the stored episodes round r mines."""
    search = [("mcts_rollout", round_name("search", r))]
    return search + [("greedy", "baseline")] if r == 1 else search


def run_mine(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    search = round_name("search", ctx.round)

    env = make_env(cfg)
    tasks = {t.id: t for t in store.tasks("train")}
    wrong = {t.env for t in tasks.values()} - {env.name}
    if wrong:
        raise ValueError(f"mine: the store holds tasks of env(s) {sorted(wrong)}, the config's "
                         f"env is {env.name!r}; mine each env's run on its own")
    context = Context(env.system_prompt(), env.demonstration())
    firsts = {tid: make_env(cfg).reset(task) for tid, task in tasks.items()}
    trajs = [t for src, stage in sources(ctx.round)
             for t in store.trajectories(src, stage) if t.task_id in tasks]

    first = (ctx.round - 1) * IDS_PER_ROUND  # the round's first pair / example id
    steps, stats = mine_step_pairs(store, cfg.mine, context, tasks, search, first)
    ctx.progress.update(step_pairs=len(steps))
    outcome = mine_outcome_pairs(trajs, cfg.mine, context, tasks, firsts, first + len(steps))
    relabels, hindsight_stats = mine_hindsight(trajs, cfg.mine, lambda: make_env(cfg), tasks)
    rft = rft_examples(trajs, context, tasks, firsts, first)
    examples = rft + [hindsight_example(src, r, context, first + len(rft) + i)
                      for i, (src, r) in enumerate(relabels)]
    pairs = steps + outcome
    stats.update(trajectory_pairs=len(outcome), rft_examples=sum(e.kind == "rft"
                                                                  for e in examples),
                 hindsight_examples=len(relabels), **hindsight_stats)
    with store.transaction():
        store.insert_pairs(pairs, ctx.stage)
        store.insert_examples(examples, ctx.stage)
        ctx.mark_done(stats)
    return stats


def mine_step_pairs(store: Store, cfg: MineConfig, context: Context, tasks: dict[str, Task],
                    search: str, first_id: int) -> tuple[list[PairRow], dict]:
    """Step pairs of the trees stage `search` grew, ids from `first_id` on."""
    kept, counts = select_step_pairs(store, step_params(cfg), stage=search)
    trees = {t.task_id: t.tree_id for t in store.trees(search)}
    nodes = {r.node_id: r for r in store.tree_edges(sorted({trees[p.task_id] for p in kept}))}
    rows: list[PairRow] = []
    seen = set()
    for p in kept:
        prompt, chosen, rejected = step_pair_messages(
            context, tasks[p.task_id].instruction, nodes, p.node_id, p.chosen_id, p.rejected_id)
        key = json.dumps([prompt, chosen, rejected], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        rows.append(PairRow(pair_id=first_id + len(rows), task_id=p.task_id, env=p.env,
                            kind="step", node_id=p.node_id, prompt=prompt, chosen=chosen,
                            rejected=rejected, chosen_q=p.chosen_q, rejected_q=p.rejected_q,
                            margin=p.margin, chosen_ref=p.chosen_id, rejected_ref=p.rejected_id,
                            info={"margin_bin": p.bin}))
    per_task = Counter(r.task_id for r in rows)
    bins = Counter(r.info["margin_bin"] for r in rows)
    edges = [cfg.theta, *cfg.margin_bins]
    stats = {
        "step_pairs": len(rows),
        "step_candidates": counts["candidates"],
        "dropped_node_cap": counts["candidates"] - counts["after_node_cap"],
        "dropped_task_cap": counts["after_node_cap"] - counts["after_task_cap"],
        "dropped_total_cap": counts["after_task_cap"] - counts["kept"],
        "dropped_duplicate": counts["kept"] - len(rows),
        "margin_histogram": {_bin_label(edges, b): bins[b] for b in range(len(edges))},
        "step_pairs_per_task": {
            "tasks": len(per_task), "min": min(per_task.values(), default=0),
            "median": statistics.median(per_task.values()) if per_task else 0,
            "max": max(per_task.values(), default=0)},
    }
    return rows, stats


def _bin_label(edges: list[float], b: int) -> str:
    hi = edges[b + 1] if b + 1 < len(edges) else None
    return f"[{edges[b]:g}, {hi:g})" if hi is not None else f">= {edges[b]:g}"


def mine_outcome_pairs(trajs: list[TrajectoryRow], cfg: MineConfig, context: Context,
                       tasks: dict[str, Task], firsts: dict[str, str],
                       first_id: int) -> list[PairRow]:
    """The paper's outcome-DPO data: a success vs a failure of the same task, whole episodes;
    ids from `first_id` on."""
    rows = []
    for win, loss in outcome_pairs(trajs, cfg.trajectory_pairs_per_task, cfg.seed):
        task = tasks[win.task_id]
        prompt, chosen = episode_messages(context, task.instruction, firsts[task.id],
                                          [step_from_dict(s) for s in win.steps])
        _, rejected = episode_messages(context, task.instruction, firsts[task.id],
                                       [step_from_dict(s) for s in loss.steps])
        rows.append(PairRow(
            pair_id=first_id + len(rows), task_id=task.id, env=task.env, kind="trajectory",
            prompt=prompt, chosen=chosen, rejected=rejected, chosen_q=win.reward,
            rejected_q=loss.reward, margin=win.reward - loss.reward, chosen_ref=win.traj_id,
            rejected_ref=loss.traj_id,
            info={"chosen_source": win.source, "rejected_source": loss.source,
                  "rejected_truncated": bool(loss.steps) and bool(
                      loss.steps[-1]["info"].get("truncated"))}))
    return rows


def mine_hindsight(trajs: list[TrajectoryRow], cfg: MineConfig, new_env, tasks: dict[str, Task]
                   ) -> tuple[list[tuple[TrajectoryRow, Relabel]], dict]:
    """Verified relabels of the distinct failed episodes, one per (relabeled task, actions)."""
    if not cfg.hindsight:
        return [], {}
    outcomes: Counter = Counter()
    kept, seen = [], set()
    for traj in distinct_episodes([t for t in trajs if t.reward < SUCCESS]):
        actions = [s["action"] for s in traj.steps]
        result = relabel(new_env, tasks[traj.task_id], actions)
        if isinstance(result, str):
            outcomes[result] += 1
            continue
        key = (result.task.id, json.dumps(actions))
        if key in seen:
            outcomes["duplicate"] += 1
            continue
        seen.add(key)
        outcomes["verified"] += 1
        kept.append((traj, result))
    tried = sum(outcomes.values()) - outcomes["not_ended"] - outcomes["already_solved"]
    return kept, {"relabels_tried": tried, "relabels": dict(sorted(outcomes.items()))}


def rft_examples(trajs: list[TrajectoryRow], context: Context, tasks: dict[str, Task],
                 firsts: dict[str, str], first_id: int) -> list[ExampleRow]:
    """Successful episodes, one per distinct action sequence of a task; ids from `first_id`."""
    rows = []
    for traj in distinct_episodes([t for t in trajs if t.reward >= SUCCESS]):
        task = tasks[traj.task_id]
        prompt, rest = episode_messages(context, task.instruction, firsts[task.id],
                                        [step_from_dict(s) for s in traj.steps])
        rows.append(ExampleRow(
            example_id=first_id + len(rows), task_id=task.id, env=task.env, kind="rft",
            instruction=task.instruction, messages=prompt + rest, source_traj=traj.traj_id,
            reward=traj.reward, info={"source": traj.source, "prompt_messages": len(prompt)}))
    return rows


def hindsight_example(source: TrajectoryRow, r: Relabel, context: Context,
                      example_id: int) -> ExampleRow:
    """The relabeled episode; its actions keep the ids the policy generated for them."""
    steps = [replace(s, token_ids=step_from_dict(src).token_ids)
             for s, src in zip(r.steps, source.steps)]
    prompt, rest = episode_messages(context, r.task.instruction, r.first_observation, steps)
    return ExampleRow(
        example_id=example_id, task_id=r.task.id, env=r.task.env, kind="hindsight",
        instruction=r.task.instruction, messages=prompt + rest, source_traj=source.traj_id,
        reward=r.reward,
        info={"prompt_messages": len(prompt), "source_task_id": source.task_id,
              "source_reward": source.reward, "source": source.source,
              "task": r.task.to_dict()})
