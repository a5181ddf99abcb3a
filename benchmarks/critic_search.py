"""Search with the frozen critic vs a run's learned critic, on the same unseen train tasks.

Issue 23's question: does the value model the `critic` stage fitted make search find more
solutions for the model work it spends? Both searches use the run's base policy, search
settings, simulation budget and seeds, on train tasks the critic never saw (the env's train
tasks after the run's first env.train_tasks); only the critic differs: the frozen critic
(the policy's own log-probs, the named baseline) or the learned one in the critic stage's
checkpoint. Printed per critic: tasks solved at least once (a rollout or ending that got
reward 1), model calls (policy and critic; batched calls, as the searcher makes them) and
tokens generated, each per solved task, and the
critic's concordance with the returns of the trees it helped to grow.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/critic_search.py RUN_DIR --tasks 16
    # while RUN_DIR's run goes on (it holds the store): name the critic stage's folder
    PYTHONPATH=$PWD .venv/bin/python benchmarks/critic_search.py RUN_DIR --tasks 16 \
        --critic RUN_DIR/checkpoints/critic/final
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, replace
from pathlib import Path

from _counters import Watch

from offline_agent.search.concordance import concordance
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import Tree
from offline_agent.search.searcher import Searcher
from offline_agent.value.learned_critic import LearnedCritic
from offline_agent.value.value_model import resolve_device
from pipelines.artifacts import fitted_folder
from pipelines.config import RunConfig, make_env
from storage import Store


@dataclass
class Child:
    """A search Node as offline_agent.search.concordance reads it."""

    node_id: int
    parent_id: int | None
    depth: int
    visits: int
    value_sum: float
    terminal: bool
    reward: float | None
    critic_score: float | None


def children(tree: Tree) -> list[Child]:
    return [Child(n.id, n.parent, n.depth, n.visits, n.value_sum, n.terminal, n.reward,
                  n.critic_score) for n in tree.nodes]


class Counted:
    """A critic whose score calls (one per batch of Critique requests) are counted."""

    def __init__(self, critic):
        self.critic, self.calls, self.requests, self.seconds = critic, 0, 0, 0.0

    def score(self, requests):
        start = time.perf_counter()
        out = self.critic.score(requests)
        self.calls, self.requests = self.calls + 1, self.requests + len(requests)
        self.seconds += time.perf_counter() - start
        return out


def search(policy, cfg: RunConfig, tasks, critic, name: str, own_model: bool) -> dict:
    """One batched search of `tasks` with `critic`, from a cold prefix cache. own_model: the
    critic runs a model of its own (the learned one); the frozen critic's calls are policy
    calls (choice_logprobs), so they are counted there and not twice."""
    policy.clear_cache()
    counted = Counted(critic)
    trees = [Tree.new(t, make_env(cfg)) for t in tasks]
    with Watch(policy.model, policy=policy) as watch:
        stats = Searcher(policy, lambda: make_env(cfg), cfg.search, counted).run(
            trees, lambda _: None, progress=False)
    c = concordance((cfg.env.name, children(t)) for t in trees)["overall"]
    solved = stats["tasks_solved"]
    calls = watch.counts.calls + (counted.calls if own_model else 0)
    per = (lambda x: f"{x / solved:.1f}") if solved else (lambda x: "n/a")
    print(f"{name:7s} solved {solved}/{len(tasks)} tasks; per solved task: {per(calls)} model "
          f"calls ({per(counted.calls)} of them the critic's), "
          f"{per(watch.counts.generated)} tokens generated; {stats['nodes']} nodes in "
          f"{stats['seconds']:.0f} s ({counted.seconds:.0f} s in the critic); concordance "
          f"{c['concordance']} (n {c['n']})", flush=True)
    return {"solved": solved, "calls": calls}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path, help="a run whose critic stage fitted a critic")
    ap.add_argument("--tasks", type=int, default=16, help="unseen train tasks searched")
    ap.add_argument("--simulations", type=int, default=0, help="0: the run's search.simulations")
    ap.add_argument("--leaf-value", choices=("rollout", "critic", "mix"),
                    help="search.leaf_value on both sides; default: the run's")
    ap.add_argument("--critic", type=Path, help="a fitted value model folder; default: the one "
                    "the run's critic stage recorded (needs the store, which a live run holds)")
    args = ap.parse_args()

    from offline_agent.policy import load_policy

    cfg = RunConfig.load(args.run_dir / "config.yaml", [])
    if args.simulations:
        cfg = replace(cfg, search=replace(cfg.search, simulations=args.simulations))
    if args.leaf_value:
        cfg = replace(cfg, search=replace(cfg.search, leaf_value=args.leaf_value))
    folder = args.critic
    if folder is None:
        with Store(args.run_dir / "store.duckdb", read_only=True) as store:
            folder = fitted_folder(store, args.run_dir, 1)
    if folder is None:
        raise SystemExit(f"{args.run_dir}: its critic stage fitted no critic "
                         "(run it with search.critic=learned)")
    env = make_env(cfg)
    skip = cfg.env.train_tasks + cfg.env.val_tasks  # the tasks the critic may have seen
    tasks = env.tasks("train", skip + args.tasks)[skip:]
    policy = load_policy(**vars(cfg.model), seed=cfg.run.seed)  # as the search stage loads it
    learned = LearnedCritic.load(folder, env, resolve_device(cfg.model.device),
                                 cfg.critic.pack_tokens)
    print(f"{len(tasks)} unseen {cfg.env.name} train tasks x {cfg.search.simulations} "
          f"simulations, k {cfg.search.k}, leaf_value {cfg.search.leaf_value}, selection "
          f"{cfg.search.selection}, alpha {cfg.search.alpha}; learned critic {folder}")
    frozen = search(policy, cfg, tasks, FrozenCritic(policy, env), "frozen", own_model=False)
    fitted = search(policy, cfg, tasks, learned, "learned", own_model=True)
    rate = {k: (v["calls"] / v["solved"] if v["solved"] else float("inf"))
            for k, v in (("frozen", frozen), ("learned", fitted))}
    print(f"ratio solved learned / frozen (named baseline: frozen): "
          f"{fitted['solved'] / max(frozen['solved'], 1):.2f}x; model calls per solved task "
          f"learned / frozen: {rate['learned'] / rate['frozen']:.2f}x")


if __name__ == "__main__":
    main()
