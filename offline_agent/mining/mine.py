"""One round's mining: what the store holds of it -> preference pairs, SFT examples, stats.

`mine` is the whole of stage `mine` but the store: the stage reads a MineInputs (the step
pairs the SQL pass kept, the nodes they come from, the round's episodes, the train tasks),
calls it once, and writes what it returns. Step pairs get their conversations rebuilt from
the tree (build.py) and lose exact duplicates; outcome pairs, RFT examples and hindsight
relabels come from the episodes (pairs.py, hindsight.py). Ids are handed out in order from
the round's first id, pairs and examples each.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from offline_agent.envs.base import Env
from offline_agent.mining.build import Context, StoredNode, episode_messages, step_pair_messages
from offline_agent.mining.config import MineConfig
from offline_agent.mining.hindsight import Relabel, relabel
from offline_agent.mining.pairs import distinct_episodes, outcome_pairs
from offline_agent.types import SUCCESS, StepPair, Task, step_from_dict
from storage.rows import ExampleRow, PairRow, TrajectoryRow


@dataclass
class MineInputs:
    """What one round's mine stage reads from the store."""

    tasks: dict[str, Task]  # the train tasks, by id
    step_pairs: list[StepPair]  # the pairs the SQL pass kept (storage.select_step_pairs)
    step_counts: dict[str, int]  # its counts: candidates, after_node_cap, after_task_cap, kept
    nodes: Mapping[int, StoredNode]  # every node of the trees those pairs come from, by id
    trajectories: list[TrajectoryRow]  # the round's stored episodes of the train tasks
    first_id: int  # the round's first pair id and first example id


@dataclass
class Mined:
    """What the stage writes: the rows and its stats."""

    pairs: list[PairRow]  # step pairs, then outcome pairs
    examples: list[ExampleRow]  # rft, then hindsight
    stats: dict


def mine(inputs: MineInputs, cfg: MineConfig, new_env: Callable[[], Env],
         progress: Callable[..., None] = lambda **counts: None) -> Mined:
    """Pairs and examples of one round; `new_env` makes a fresh env of the run's env (the
    conversations' system prompt and first observations, and the hindsight replays);
    `progress(step_pairs=n)` reports the step pairs before the slower hindsight replays."""
    env = new_env()
    tasks = inputs.tasks
    wrong = {t.env for t in tasks.values()} - {env.name}
    if wrong:
        raise ValueError(f"mine: the store holds tasks of env(s) {sorted(wrong)}, the config's "
                         f"env is {env.name!r}; mine each env's run on its own")
    context = Context(env.system_prompt(), env.demonstration())
    firsts = {tid: env.reset(task) for tid, task in tasks.items()}  # deterministic per task
    trajs, first = inputs.trajectories, inputs.first_id

    steps = step_pair_rows(inputs.step_pairs, inputs.nodes, context, tasks, first)
    stats = step_pair_stats(steps, inputs.step_counts, cfg)
    progress(step_pairs=len(steps))
    outcome = outcome_pair_rows(trajs, cfg, context, tasks, firsts, first + len(steps))
    relabels, hindsight_stats = mine_hindsight(trajs, cfg, new_env, tasks)
    rft = rft_examples(trajs, context, tasks, firsts, first)
    examples = rft + [hindsight_example(src, r, context, first + len(rft) + i)
                      for i, (src, r) in enumerate(relabels)]
    stats.update(trajectory_pairs=len(outcome), rft_examples=len(rft),
                 hindsight_examples=len(relabels), **hindsight_stats)
    return Mined(steps + outcome, examples, stats)


def step_pair_rows(kept: list[StepPair], nodes: Mapping[int, StoredNode], context: Context,
                   tasks: dict[str, Task], first_id: int) -> list[PairRow]:
    """The kept step pairs as conversations, the first of each identical (prompt, chosen,
    rejected) only; ids from `first_id` on."""
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
    return rows


def step_pair_stats(rows: list[PairRow], counts: dict[str, int], cfg: MineConfig) -> dict:
    """How many candidates each cap and the deduplication dropped, and the kept pairs' margin
    histogram and spread over tasks."""
    per_task = Counter(r.task_id for r in rows)
    bins = Counter(r.info["margin_bin"] for r in rows)
    edges = [cfg.theta, *cfg.margin_bins]
    return {
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


def _bin_label(edges: list[float], b: int) -> str:
    hi = edges[b + 1] if b + 1 < len(edges) else None
    return f"[{edges[b]:g}, {hi:g})" if hi is not None else f">= {edges[b]:g}"


def outcome_pair_rows(trajs: list[TrajectoryRow], cfg: MineConfig, context: Context,
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


def mine_hindsight(trajs: list[TrajectoryRow], cfg: MineConfig, new_env: Callable[[], Env],
                   tasks: dict[str, Task]) -> tuple[list[tuple[TrajectoryRow, Relabel]], dict]:
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
