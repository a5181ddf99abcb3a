"""Search at inference on the validation tasks: choose eval.mcts_commit and
eval.mcts_simulations without reading a test task.

For one policy of a run (base, or an adapter its train stage finished), plays the run's
validation tasks (env.val_tasks) greedily, then with verifier-free search at inference under
each `COMMIT:SIMULATIONS` setting, with the run's search settings and the critic the mcts
stage would use (where search.critic is learned: the last round's, fitted on every round's
trees). Printed per setting: success and
mean reward with 95% intervals, the paired difference against the same policy greedy (the
named baseline), wins:losses with McNemar's p, simulations and seconds.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/inference_val.py RUN_DIR \
        --policy base --settings step:1 path:8 [--set search.step_cost=0.01]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from offline_agent.evaluation import (
    BASE,
    VAL,
    Episode,
    EvalConfig,
    compare,
    greedy_episodes,
    summarize,
)
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.inference import inference_config, search_and_commit
from offline_agent.search.searcher import Searcher
from offline_agent.value.learned_critic import LearnedCritic
from offline_agent.value.value_model import resolve_device
from pipelines.artifacts import fitted_folder
from pipelines.config import RunConfig, make_env
from pipelines.rounds import round_name
from storage import Store


def row(name: str, episodes: list[Episode], greedy: list[Episode], seconds: float,
        simulations: int) -> dict:
    cfg = EvalConfig()
    s, d = summarize(episodes, cfg), compare(episodes, greedy, cfg)
    print(f"{name:8s} n {s['n_tasks']}  success {s['success_rate']:.3f} {s['ci95']}  "
          f"reward {s['mean_reward']:.3f} {s['mean_reward_ci95']}  vs greedy: success "
          f"{d['success_rate']:+.3f} {d['ci95']}, reward {d['mean_reward']:+.3f} "
          f"{d['mean_reward_ci95']}, {d['wins']}:{d['losses']} p {d['mcnemar_p']:.3f}  "
          f"steps {s['mean_steps']:.2f}  {simulations} simulations, {seconds:.0f} s", flush=True)
    return {"setting": name, "summary": s, "vs_greedy": d, "seconds": round(seconds, 1),
            "simulations": simulations,
            "episodes": [[e.task_id, e.reward, list(e.actions)] for e in episodes]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a run with validation tasks (env.val_tasks)")
    ap.add_argument("--policy", default=BASE, help="base, or a policy the train stage finished")
    ap.add_argument("--settings", nargs="+", default=["step:1", "path:8"],
                    help="COMMIT:SIMULATIONS, e.g. path:8 (per task) step:2 (per step)")
    ap.add_argument("--tasks", type=int, default=0, help="the first N validation tasks; 0: all")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override on the run's config.yaml, as `offline-agent run` "
                         "takes it (e.g. search.step_cost=0.01); repeatable")
    ap.add_argument("--out", type=Path, help="also write the rows (and each setting's episodes: "
                    "task, reward, actions) here as JSON")
    args = ap.parse_args()

    from offline_agent.policy import load_policy

    cfg = RunConfig.load(args.run_dir / "config.yaml", args.set)
    with Store(args.run_dir / "store.duckdb", read_only=True) as store:
        tasks = store.tasks(VAL)
        adapter = None if args.policy == BASE else store.final_checkpoints("train")[
            args.policy]["folder"]
        last = cfg.run.iterations
        critic_folder = fitted_folder(store, args.run_dir, last)
    if cfg.search.critic == "learned" and critic_folder is None:
        raise SystemExit(f"{args.run_dir}: its last round's critic stage "
                         f"({round_name('critic', last)}, the one the mcts stage reads) "
                         "has not fitted a critic yet")
    tasks = tasks[:args.tasks] if args.tasks else tasks
    if not tasks:
        raise SystemExit(f"{args.run_dir}: no validation tasks (set env.val_tasks)")
    if adapter is not None and not Path(adapter).is_absolute():
        adapter = str(args.run_dir / adapter)
    model = {**vars(cfg.model), "adapter": adapter or cfg.model.adapter}
    policy = load_policy(**model, seed=cfg.run.seed)
    env = make_env(cfg)
    critic = (FrozenCritic(policy, env) if cfg.search.critic != "learned" else
              LearnedCritic.load(critic_folder, env, resolve_device(cfg.model.device),
                                 cfg.critic.pack_tokens))
    print(f"{args.policy} on {len(tasks)} {cfg.env.name} validation tasks; critic "
          f"{cfg.search.critic if cfg.search.critic == 'learned' else 'frozen'}", flush=True)
    start = time.perf_counter()
    greedy = [Episode.from_trajectory(t) for t in greedy_episodes(
        policy, lambda: make_env(cfg), tasks, cfg.model.max_batch, lambda t: None)]
    rows = [row("greedy", greedy, greedy, time.perf_counter() - start, 0)]
    for setting in args.settings:
        commit, sims = setting.split(":")
        searcher = Searcher(policy, lambda: make_env(cfg), inference_config(cfg.search, int(sims)),
                            critic)
        played: list = []
        totals = search_and_commit(policy, lambda: make_env(cfg), tasks, searcher,
                                   cfg.model.max_batch, played.append, commit=commit,
                                   progress=False)
        rows.append(row(setting, [Episode.from_trajectory(t) for t in played], greedy,
                        totals["seconds"], int(totals["simulations"])))
    if args.out:
        args.out.write_text(json.dumps({"policy": args.policy, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
