"""Frozen vs learned critic: concordance with search's returns on trees the critic never saw.

Reads a run's stored trees (stage `search`), cuts its tasks into `--folds` folds, and for each
fold fits the value model (offline_agent/critic/fit.py, its own early-stopping split inside
the other folds) and predicts the fold's children. Every tree is thus scored by a critic fitted
without it; the learned critic's concordance (offline_agent/search/concordance.py) is counted
over all of them and printed beside the frozen critic's stored scores on the same trees, with
n, per architecture (`--lora-r`, 0: the head on the frozen base) and per target set
(`--targets`: `children`, the tree's children alone, the critic stage's targets before
ending targets; `endings`, with the listed endings at every stored state, the stage's now;
critic/targets.py). The same folds and the same pairs for all. The store is opened
read-only; nothing is written.

    PYTHONPATH=. .venv/bin/python benchmarks/critic_concordance.py RUN_DIR [--folds 4]
        [--lora-r 0 8] [--epochs 200] [--lora-epochs 4] [--targets children endings]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from offline_agent.critic import value_model
from offline_agent.critic.config import CriticConfig
from offline_agent.critic.endings import stored_endings
from offline_agent.critic.fit import encode_tree, fit, predict
from offline_agent.critic.targets import seeded_order
from offline_agent.search.concordance import concordance
from pipelines.config import RunConfig, make_env
from pipelines.stages.critic import stored_trees
from storage import Store


def folds_of(task_ids: list[str], folds: int, seed: int) -> list[list[str]]:
    """Task ids in `folds` seeded folds (a seeded hash order, dealt round-robin)."""
    order = seeded_order(task_ids, seed)
    return [order[f::folds] for f in range(folds)]


def cross_fitted(items, tokenizer_model: str, device: str, cfg: CriticConfig,
                 folds: list[list[str]]) -> tuple[dict[int, float], list[dict]]:
    """node id -> V from the fold's critic; and each fold's fit metrics and seconds."""
    values, metrics = {}, []
    for fold in folds:
        held = set(fold)
        start = time.perf_counter()
        model = value_model.build(value_model.load_lm(tokenizer_model, device), cfg.lora_r,
                                  cfg.seed, cfg.target_modules)
        fitted = fit(model, [i for i in items if i.task_id not in held], cfg)
        values.update(predict(fitted.model, [i for i in items if i.task_id in held],
                              cfg.pack_tokens))
        metrics.append({**fitted.metrics, "seconds": round(time.perf_counter() - start, 1)})
    return values, metrics


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument("--lora-r", type=int, nargs="+", default=[0])
    ap.add_argument("--epochs", type=int, default=None, help="head alone; default critic.epochs")
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
        for r in args.lora_r:
            epochs = args.lora_epochs if r else args.epochs or cfg.critic.epochs
            ccfg = replace(cfg.critic, lora_r=r, epochs=epochs,
                           patience=min(epochs, cfg.critic.patience))
            values, metrics = cross_fitted(items, cfg.model.id, device, ccfg, folds)
            learned = concordance(scored, lambda c, v=values: v.get(c.node_id))
            seconds = sum(m["seconds"] for m in metrics)
            print(f"learned critic, targets {kind}, lora_r={r}: concordance "
                  f"{learned['overall']['concordance']} (n {learned['overall']['n']}), by depth "
                  f"{ {d: (x['concordance'], x['n']) for d, x in learned['by_depth'].items()} }, "
                  f"fit {seconds:.0f} s over {args.folds} folds; best epochs "
                  f"{[m['best_epoch'] for m in metrics]}, val loss "
                  f"{[m['val_loss'] for m in metrics]}", flush=True)


if __name__ == "__main__":
    main()
