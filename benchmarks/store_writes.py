"""Node writes: the Store's bulk path (Arrow batch, one INSERT / UPDATE ... FROM per
transaction) vs the naive path (one autocommitted statement per row), rows/s and ratio.

Search commits a batch of new nodes and visit/value updates after every tick; this is the
cost of that commit. The naive baseline writes SQL directly on purpose: it is what the
Store exists to avoid.

    .venv/bin/python benchmarks/store_writes.py [--rows 20000] [--batch 500]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

import duckdb  # noqa: E402

from storage import NodeRow, NodeVisits, Store, make_node_id  # noqa: E402


def node_rows(n: int, tree_id: int = 0) -> list[NodeRow]:
    rng = random.Random(0)
    return [
        NodeRow(
            node_id=make_node_id(tree_id, i),
            tree_id=tree_id,
            parent_id=None if i == 0 else make_node_id(tree_id, rng.randrange(i)),
            depth=min(i, 8),
            action=f'{{"name": "search", "arguments": {{"query": "red shoes {i}"}}}}',
            tool_call={"name": "search", "arguments": {"query": f"red shoes {i}"}},
            observation="Results: " + " | ".join(f"item {i}-{j} $12.99" for j in range(20)),
            critic_rank=i % 4,
            critic_score=rng.random(),
            reward=0.0,
            terminal=i % 7 == 0,
            snapshot={"num_steps": i % 8, "state": os.urandom(400).hex()},  # ~1 KB of JSON
            created_sim=i // 4,
        )
        for i in range(n)
    ]


def bulk(path: Path, rows: list[NodeRow], batch: int) -> tuple[float, float]:
    with Store(path) as store:
        start = time.perf_counter()
        for i in range(0, len(rows), batch):
            store.insert_nodes(rows[i : i + batch])
        insert = time.perf_counter() - start
        updates = [NodeVisits(r.node_id, 3, 1.5, 1.5) for r in rows]
        start = time.perf_counter()
        for i in range(0, len(updates), batch):
            store.update_visits(updates[i : i + batch])
        update = time.perf_counter() - start
    return len(rows) / insert, len(rows) / update


def row_by_row(path: Path, rows: list[NodeRow]) -> tuple[float, float]:
    Store(path).close()  # same schema
    con = duckdb.connect(str(path))
    cols = list(rows[0].to_row())
    sql = f"INSERT INTO nodes ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
    start = time.perf_counter()
    for row in rows:
        r = row.to_row()
        con.execute(sql, [json.dumps(v) if isinstance(v, (dict, list)) else v
                          for v in r.values()])
    insert = time.perf_counter() - start
    start = time.perf_counter()
    for r in rows:
        con.execute("UPDATE nodes SET visits = ?, value_sum = ? WHERE node_id = ?",
                    [3, 1.5, r.node_id])
    update = time.perf_counter() - start
    con.close()
    return len(rows) / insert, len(rows) / update


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=20000, help="rows through the bulk path")
    p.add_argument("--naive-rows", type=int, default=2000, help="rows through the naive path")
    p.add_argument("--batch", type=int, default=500, help="rows per bulk transaction")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        b_ins, b_upd = bulk(Path(tmp) / "bulk.duckdb", node_rows(args.rows), args.batch)
        n_ins, n_upd = row_by_row(Path(tmp) / "naive.duckdb", node_rows(args.naive_rows))
    print(f"duckdb {duckdb.__version__}, {os.cpu_count()} cpus, ~1.5 KB per node row")
    print(f"insert  bulk ({args.batch}/txn): {b_ins:10,.0f} rows/s   row-by-row autocommit: "
          f"{n_ins:8,.0f} rows/s   ratio {b_ins / n_ins:6.1f}x")
    print(f"update  bulk ({args.batch}/txn): {b_upd:10,.0f} rows/s   row-by-row autocommit: "
          f"{n_upd:8,.0f} rows/s   ratio {b_upd / n_upd:6.1f}x")


if __name__ == "__main__":
    main()
