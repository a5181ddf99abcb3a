"""Frozen vs learned critic: concordance with search's returns on trees the critic never saw.

Reads a run's stored trees (stage `search`), cuts its tasks into `--folds` folds, and for each
fold fits the value model (offline_agent/value/fit.py, its own early-stopping split inside
the other folds) and predicts the fold's children. Every tree is thus scored by a critic fitted
without it; the learned critic's concordance (offline_agent/search/concordance.py) is counted
over all of them and printed beside the frozen critic's stored scores on the same trees, with
n, per architecture (`--lora-r`, 0: the head on the frozen base; `--layer-share`, the decoder
layers the head reads through) and per target set
(`--targets`: `children`, the tree's children alone, the critic stage's targets before
ending targets; `endings`, with the listed endings at every stored state, the stage's now;
value/targets.py). With ending targets it also counts, for each task, the pairs of its
endings at different states (V against the reward of ending there): on MiniShop `buy` on one
item page against another, the product choice search at inference leans on. The same folds
and the same pairs for all. The store is opened read-only; nothing is written.

    PYTHONPATH=. .venv/bin/python benchmarks/critic_concordance.py RUN_DIR [--folds 4]
        [--lora-r 0 8] [--layer-share 0.6 1] [--epochs 200] [--lora-epochs 4]
        [--targets children endings]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from itertools import combinations, product
from pathlib import Path

from offline_agent.search.concordance import Counts, concordance
from offline_agent.value import value_model
from offline_agent.value.config import CriticConfig
from offline_agent.value.endings import stored_endings
from offline_agent.value.fit import encode_tree, fit
from offline_agent.value.targets import seeded_order
from pipelines.config import RunConfig, make_env
from pipelines.stages.critic import stored_trees
from storage import Store


def folds_of(task_ids: list[str], folds: int, seed: int) -> list[list[str]]:
    """Task ids in `folds` seeded folds (a seeded hash order, dealt round-robin)."""
    order = seeded_order(task_ids, seed)
    return [order[f::folds] for f in range(folds)]


def cross_fitted(items, tokenizer_model: str, device: str, cfg: CriticConfig,
                 folds: list[list[str]]) -> tuple[dict[int, float], Counts, list[dict]]:
    """node id -> V from the fold's critic; the ending pairs across a task's states; and each
    fold's fit metrics and seconds."""
    values, endings, metrics = {}, {}, []
    for item in items:
        item.base_features = None  # another layer_share reads other features
    for fold in map(set, folds):
        held = [i for i in items if i.task_id in fold]
        start = time.perf_counter()
        model = value_model.build(value_model.load_lm(tokenizer_model, device), cfg)
        fitted = fit(model, [i for i in items if i.task_id not in fold], cfg)
        predicted = value_model.values_of(fitted.model, [i.seqs for i in held], cfg.pack_tokens)
        for item, vs in zip(held, predicted):
            for t, v in zip(item.targets, vs):
                if t.node_id is None:
                    endings.setdefault(item.task_id, []).append((t.value, v))
                else:
                    values[t.node_id] = v
        metrics.append({**fitted.metrics, "seconds": round(time.perf_counter() - start, 1)})
    return values, across_states(endings), metrics


def across_states(endings: dict[str, list[tuple[float, float]]]) -> Counts:
    """Pairs of ending targets of one task at different states ((return, V) each), counted as
    concordance.py counts siblings: does V rank a task's pages by what ending there earns
    (on MiniShop, `buy` on one item page against another: the product choice)?"""
    counts = Counts()
    for pairs in endings.values():
        for (ra, va), (rb, vb) in combinations(pairs, 2):
            counts.add((ra, rb), (va, vb))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--lora-r", type=int, nargs="+", default=[0])
    ap.add_argument("--epochs", type=int, default=None, help="head alone; default critic.epochs")
    ap.add_argument("--layer-share", type=float, nargs="+", default=None,
                    help="critic.layer_share values to compare; default the run's")
    ap.add_argument("--targets", nargs="+", choices=("children", "endings"),
                    default=["children", "endings"])
    ap.add_argument("--lora-epochs", type=int, default=4,
                    help="with --lora-r > 0: most epochs (each a forward and backward of the "
                         "data) and the patience")
    args = ap.parse_args()
    cfg = RunConfig.load(args.run_dir / "config.yaml")
    env = make_env(cfg)
    with Store(args.run_dir / "store.duckdb", read_only=True) as store:
        trees = stored_trees(store, 1)
        tasks = {t.id: t for t in store.tasks("train")}
    tokenizer = value_model.load_tokenizer(cfg.model.id)
    folds = folds_of([t for t, _ in trees], args.folds, cfg.critic.seed)
    scored = [(env.name, nodes) for _, nodes in trees]
    frozen = concordance(scored)["overall"]
    print(f"{len(trees)} trees; {args.folds} folds by task")
    print(f"frozen critic (stored scores): concordance {frozen['concordance']} (n {frozen['n']})")
    device = value_model.resolve_device(cfg.model.device)
    for kind in args.targets:
        items = [i for task_id, nodes in trees for i in encode_tree(
            tokenizer, env.system_prompt(), env.demonstration(), tasks[task_id], nodes,
            stored_endings(env, nodes) if kind == "endings" else None, cfg.critic.state)]
        print(f"targets {kind}: {len(items)} states, {sum(len(i.targets) for i in items)} "
              "targets", flush=True)
        for r, share in product(args.lora_r, args.layer_share or [cfg.critic.layer_share]):
            epochs = args.lora_epochs if r else args.epochs or cfg.critic.epochs
            ccfg = replace(cfg.critic, lora_r=r, epochs=epochs, layer_share=share,
                           patience=min(epochs, cfg.critic.patience))
            values, across, metrics = cross_fitted(items, cfg.model.id, device, ccfg, folds)
            learned = concordance(scored, lambda c, v=values: v.get(c.node_id))
            seconds = sum(m["seconds"] for m in metrics)
            pages = across.to_dict()
            print(f"learned critic, targets {kind}, lora_r={r}, layer_share={share}: ending "
                  f"pairs across a task's states {pages['concordance']} (n {pages['n']}); "
                  f"concordance "
                  f"{learned['overall']['concordance']} (n {learned['overall']['n']}), by depth "
                  f"{ {d: (x['concordance'], x['n']) for d, x in learned['by_depth'].items()} }, "
                  f"fit {seconds:.0f} s over {args.folds} folds; best epochs "
                  f"{[m['best_epoch'] for m in metrics]}, val loss "
                  f"{[m['val_loss'] for m in metrics]}", flush=True)


if __name__ == "__main__":
    main()
