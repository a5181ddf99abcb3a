"""Resume and merge never unpickle untrusted bytes.

A crafted shard whose snapshot bytes would run code on load is refused by merge (the code
does not run); a shard whose snapshots are crafted JSON data is merged and resumed as data.
A store made before schema v5 (pickled snapshots) is converted when its owner opens it as a
run: the JSON it gets equals what this code stores, and search resumes from it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import duckdb
import pytest

from offline_agent.envs.base import load_env
from offline_agent.types import Task
from pipelines.cli import main
from storage import SCHEMA_VERSION, Store, make_node_id
from storage.schema import MIGRATIONS


class RunsCode:
    """Unpickling this creates `marker`: stands for any code a crafted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def shard_with_one_tree(path: Path, snapshot: dict | None, pickled: bytes | None,
                        simulations_done: int = 1) -> None:
    """A shard store holding one running tree of FakeEnv's first train task, root only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store(path) as s:
        s.upsert_trees([{"tree_id": 0, "task_id": "t-train-0-0", "status": "running",
                         "simulations_done": simulations_done, "best_reward": 0.0}],
                       stage="search")
        s.insert_nodes([{"node_id": make_node_id(0, 0), "tree_id": 0, "depth": 0,
                         "observation": "start", "visits": simulations_done, "value_sum": 0.0,
                         "snapshot": snapshot, "pickled_snapshot": pickled}])


def test_merge_refuses_a_shard_whose_pickle_would_run_code(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(RunsCode(marker))
    shard_with_one_tree(tmp_path / "shard" / "store.duckdb", {"state": None}, payload)
    assert main(["merge", str(tmp_path / "out"), str(tmp_path / "shard")]) == 2
    err = capsys.readouterr().err
    assert "holds 1 pickled env snapshots" in err and "never loads pickles" in err
    assert "--until search" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()
    pickle.loads(payload)  # the payload is live: loading it is what merge never does
    assert marker.exists()


def test_merge_refuses_an_older_shard_with_pickled_snapshots(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    shard = tmp_path / "old" / "store.duckdb"
    shard.parent.mkdir()
    con = duckdb.connect(str(shard))  # a store as schema version 3 wrote it
    for statements in MIGRATIONS[:3]:
        for sql in statements:
            con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', '3'), ('run_id', 'old')")
    con.execute("INSERT INTO nodes (node_id, tree_id, depth, env_snapshot) VALUES (0, 0, 0, ?)",
                [pickle.dumps(RunsCode(marker))])
    con.close()
    assert main(["merge", str(tmp_path / "out"), str(shard.parent)]) == 2
    err = capsys.readouterr().err
    assert f"schema version 3, this offline-agent merges {SCHEMA_VERSION}" in err
    assert "open it as a run once" in err and "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_merge_refuses_views_and_computed_columns(tmp_path, capsys):
    """A view or computed column would run the shard's SQL (e.g. read a local file) on merge."""
    for i, sql in enumerate([
        "DROP TABLE runs; CREATE VIEW runs AS SELECT 'r' AS run_id, now()::TIMESTAMP AS "
        "created_at, now()::TIMESTAMP AS updated_at, '{}'::JSON AS config",
        "DROP TABLE tasks; CREATE TABLE tasks (task_id VARCHAR PRIMARY KEY, idx INTEGER NOT "
        "NULL, env VARCHAR NOT NULL, split VARCHAR NOT NULL, instruction VARCHAR NOT NULL, "
        "data JSON GENERATED ALWAYS AS ('{}'::JSON) VIRTUAL, stage VARCHAR NOT NULL)",
    ]):
        shard = tmp_path / f"s{i}" / "store.duckdb"
        shard_with_one_tree(shard, {"state": None}, None)
        con = duckdb.connect(str(shard))
        con.execute(sql)
        con.close()
        assert main(["merge", str(tmp_path / f"out{i}"), str(shard.parent)]) == 2
        assert "is not as this offline-agent writes it" in capsys.readouterr().err


def test_crafted_json_snapshot_is_merged_and_resumed_as_data(tmp_path, tiny_model_dir, capsys):
    marker = tmp_path / "code-ran"
    env = load_env("tests.fakes:FakeEnv", seed=0, max_steps=2)
    (task,) = env.tasks("train", 1)
    env.reset(task)
    snapshot = env.snapshot()
    # the bytes of a code-running pickle, carried as JSON text: data, whatever they spell
    snapshot["state"]["note"] = pickle.dumps(RunsCode(marker)).decode("latin-1")
    snapshot["state"]["__reduce__"] = ["builtins.open", str(marker)]
    shard_with_one_tree(tmp_path / "shard" / "store.duckdb", snapshot, None)
    out = tmp_path / "merged"
    assert main(["merge", str(out), str(tmp_path / "shard")]) == 0
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {{id: {tiny_model_dir}, device: cpu}}\n"
        "env: {name: tests.fakes:FakeEnv, kwargs: {max_steps: 2}, train_tasks: 1, "
        "test_tasks: 1}\n"
        "search: {simulations: 2, k: 2, max_depth: 2, trees_per_batch: 1}\n")
    assert main(["run", str(config), "--run-dir", str(out), "--until", "search"]) == 0
    assert "trees_resumed': 1" in capsys.readouterr().out
    with Store(out / "store.duckdb", read_only=True) as s:
        (tree,) = s.trees()
        assert (tree["status"], tree["simulations_done"]) == ("done", 2)
        assert s.load_tree(0)[0]["snapshot"] == snapshot  # stored as it came: data
    assert not marker.exists()


# ---- a store made before schema v5, opened by its owner ---------------------------------------
MINISHOP = """\
model: {{id: {model}, device: cpu, prefix_cache_gb: 0}}
env: {{name: minishop, kwargs: {{max_steps: 3, num_products: 300}}, train_tasks: 2, test_tasks: 1}}
search: {{simulations: 2, k: 2, max_depth: 2, trees_per_batch: 2}}
"""


PICKLED = 4  # the last schema version whose snapshots were pickles


def as_pickled_store(new: Path, old: Path, make_env) -> int:
    """Copy a store into one as schema version PICKLED wrote it: snapshots pickled the way
    Env.snapshot did then, `pickle.dumps((task, num_steps, state))`. Returns nodes copied."""
    env = make_env()
    con = duckdb.connect(str(old))
    for statements in MIGRATIONS[:PICKLED]:
        for sql in statements:
            con.execute(sql)
    con.execute(f"ATTACH '{new}' AS new (READ_ONLY)")
    for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                "WHERE table_catalog = 'new' AND table_name != 'nodes'").fetchall():
        con.execute(f"INSERT INTO {table} SELECT * FROM new.{table}")
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(PICKLED)])
    columns = [c for (c,) in con.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_catalog = current_database() AND table_name = 'nodes'").fetchall()]
    with Store(new, read_only=True) as s:
        rows = [n for t in s.trees() for n in s.load_tree(t["tree_id"])]
    for row in rows:
        env.restore(row["snapshot"])
        row["env_snapshot"] = pickle.dumps((env.task, env.num_steps, env.state))
    con.executemany(
        f"INSERT INTO nodes ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
        [[_sql_value(row[c]) for c in columns] for row in rows])
    con.close()
    return len(rows)


def _sql_value(value):
    import json

    return json.dumps(value) if isinstance(value, dict) else value


def test_store_from_before_v5_is_converted_when_opened_as_own_run(tmp_path, tiny_model_dir,
                                                                  capsys):
    config = tmp_path / "c.yaml"
    config.write_text(MINISHOP.format(model=tiny_model_dir))
    new = tmp_path / "new"
    assert main(["run", str(config), "--run-dir", str(new), "--until", "search"]) == 0
    old = tmp_path / "old"
    old.mkdir()
    n = as_pickled_store(new / "store.duckdb", old / "store.duckdb",
                     lambda: load_env("minishop", seed=0, max_steps=3, num_products=300))
    assert n > 2
    con = duckdb.connect(str(old / "store.duckdb"))  # unfinished, so the run resumes it
    con.execute("UPDATE trees SET status = 'running'")
    con.execute("UPDATE stages SET status = 'running' WHERE stage = 'search'")
    con.close()
    capsys.readouterr()
    assert main(["status", str(old)]) == 2
    assert "needs migrating" in capsys.readouterr().err  # a reader converts nothing

    assert main(["run", str(config), "--run-dir", str(old), "--until", "search"]) == 0
    out = capsys.readouterr().out
    assert f"store: {n} pickled env snapshots (made before schema v5) re-stored as JSON" in out
    assert "trees_resumed': 2" in out

    def snapshots(run_dir: Path) -> dict:
        with Store(run_dir / "store.duckdb", read_only=True) as s:
            assert s.pickled_snapshots() == []
            return {r["node_id"]: r["snapshot"] for t in s.trees()
                    for r in s.load_tree(t["tree_id"])}

    assert snapshots(old) == snapshots(new)
    assert main(["run", str(config), "--run-dir", str(old), "--until", "search"]) == 0
    assert "pickled" not in capsys.readouterr().out  # converted once


def test_conversion_names_a_snapshot_it_cannot_read(tmp_path):
    path = tmp_path / "store.duckdb"
    with Store(path) as s:
        s.insert_nodes([{"node_id": 5, "tree_id": 0, "depth": 0, "pickled_snapshot": b"junk"}])
        from pipelines.legacy_snapshots import convert_pickled_snapshots
        from storage import StoreError

        with pytest.raises(StoreError, match="node 5's pickled env snapshot cannot be read"):
            convert_pickled_snapshots(s, lambda: load_env("math"))
        assert len(s.pickled_snapshots()) == 1  # nothing half-converted


def test_task_of_a_snapshot_is_data_too():
    env = load_env("math")
    (task,) = env.tasks("train", 1)
    env.reset(task)
    snap = env.snapshot()
    assert snap["task"] == {"id": task.id, "env": "math", "instruction": task.instruction,
                            "split": "train", "data": task.data}
    env.reset(Task("other", "math", "?", data={"answer": 1}))
    env.restore(snap)
    assert env.task == task
