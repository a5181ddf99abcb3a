"""Step-pair mining: the one SQL pass (storage/step_pairs.py: self-join of siblings + window-function
caps) vs the plain-Python oracle (offline_agent.mining.pairs.step_pairs) over the same rows.
Both must return the same pairs; prints the time of each and the ratio.

The store is synthetic: `--trees` trees of `--nodes-per-tree` nodes (a 4-ary shape like
search with k=4), random visits, returns, critic scores, terminal and invalid children.
The Python time excludes fetching the rows from DuckDB (printed apart), which favours it.

    .venv/bin/python benchmarks/mining.py [--trees 1000] [--nodes-per-tree 1000]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from offline_agent.mining.config import MineConfig  # noqa: E402
from offline_agent.mining.pairs import step_pairs, step_params  # noqa: E402
from offline_agent.types import Task  # noqa: E402
from storage import (  # noqa: E402
    NodeRow,
    Store,
    TreeRow,
    make_node_id,
    select_step_pairs,
    step_pair_inputs,
)


def fill(store: Store, trees: int, per_tree: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    store.insert_tasks([Task(f"t{t:06d}", "synthetic", f"task {t}") for t in range(trees)],
                       "tasks")
    store.upsert_trees([TreeRow(t, f"t{t:06d}", "done") for t in range(trees)], "search")
    for start in range(0, trees, 100):
        rows = []
        for t in range(start, min(start + 100, trees)):
            for i in range(per_tree):
                visits = rng.choice((0, 1, 1, 2, 3, 8))
                rows.append(NodeRow(
                    node_id=make_node_id(t, i), tree_id=t,
                    parent_id=None if i == 0 else make_node_id(t, (i - 1) // 4),
                    depth=0, visits=visits, value_sum=rng.random() * visits,
                    critic_score=rng.random(), terminal=rng.random() < 0.1,
                    reward=rng.choice((0.0, 0.5, 1.0)), invalid=rng.random() < 0.1,
                    ending=rng.choice((None, 1.0))))
        store.insert_nodes(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=1000)
    ap.add_argument("--nodes-per-tree", type=int, default=1000)
    args = ap.parse_args()
    params = step_params(MineConfig())
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "bench.duckdb") as store:
        t0 = time.perf_counter()
        fill(store, args.trees, args.nodes_per_tree)
        print(f"synthetic store: {store.counts()['nodes']:,} nodes in {args.trees} trees "
              f"({time.perf_counter() - t0:.1f}s to build)")
        t0 = time.perf_counter()
        sql, _ = select_step_pairs(store, params)
        t_sql = time.perf_counter() - t0
        t0 = time.perf_counter()
        nodes, tasks = step_pair_inputs(store)
        t_fetch = time.perf_counter() - t0
        t0 = time.perf_counter()
        py = step_pairs(nodes, tasks, params)
        t_py = time.perf_counter() - t0
    assert sql == py, "SQL and Python mining disagree"
    print(f"pairs kept: {len(sql):,} (identical in both passes)")
    print(f"SQL pass (select_step_pairs):       {t_sql:7.2f} s")
    print(f"Python pass (mining.pairs oracle):  {t_py:7.2f} s  (+ {t_fetch:.2f} s to fetch rows)")
    print(f"ratio Python / SQL: {t_py / t_sql:.1f}x  (with the fetch: "
          f"{(t_py + t_fetch) / t_sql:.1f}x)")


if __name__ == "__main__":
    main()
