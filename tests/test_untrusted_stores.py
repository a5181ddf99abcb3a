"""Resume and merge never unpickle untrusted bytes.

No code path loads a pickle any more: a store that still holds pickled snapshots (made
before schema v5) is refused by merge and at open, and the code its pickles carry never runs;
a shard whose snapshots are crafted JSON data is merged and resumed as data.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import duckdb

from offline_agent.envs.base import load_env
from offline_agent.types import Task
from pipelines.cli import main
from storage import SCHEMA_VERSION, Store, TreeRow
from storage.schema import MIGRATIONS
from tests.rows import node_row


class RunsCode:
    """Unpickling this creates `marker`: stands for any code a crafted pickle would run."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def shard_with_one_tree(path: Path, snapshot: dict | None, simulations_done: int = 1) -> None:
    """A shard store holding one running tree of FakeEnv's first train task, root only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with Store(path) as s:
        s.upsert_trees([TreeRow(0, "t-train-0-0", "running", simulations_done=simulations_done,
                                best_reward=0.0)], stage="search")
        s.insert_nodes([node_row(0, 0, observation="start", visits=simulations_done,
                                 snapshot=snapshot)])


def test_a_v6_shard_whose_pickle_would_run_code_is_refused_by_merge_and_at_open(tmp_path,
                                                                                capsys):
    """The last schema that kept pickles (v6, `pickled_snapshot`), as it wrote a store."""
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(RunsCode(marker))
    shard = tmp_path / "shard" / "store.duckdb"
    shard.parent.mkdir()
    con = duckdb.connect(str(shard))
    for statements in MIGRATIONS[:6]:
        for sql in statements:
            con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', '6'), ('run_id', 'old')")
    con.execute("INSERT INTO nodes (node_id, tree_id, depth, pickled_snapshot) "
                "VALUES (0, 0, 0, ?)", [payload])
    con.close()
    assert main(["merge", str(tmp_path / "out"), str(shard.parent)]) == 2
    err = capsys.readouterr().err
    assert f"schema version 6, this offline-agent merges {SCHEMA_VERSION}" in err
    assert main(["status", str(shard.parent)]) == 2
    err = capsys.readouterr().err
    assert "holds 1 pickled env snapshots" in err and "no longer reads" in err
    assert "Traceback" not in err
    assert not marker.exists() and not (tmp_path / "out").exists()
    pickle.loads(payload)  # the payload is live: loading it is what no code path does
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
        shard_with_one_tree(shard, {"state": None})
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
    shard_with_one_tree(tmp_path / "shard" / "store.duckdb", snapshot)
    out = tmp_path / "merged"
    assert main(["merge", str(out), str(tmp_path / "shard")]) == 0
    config = tmp_path / "c.yaml"
    config.write_text(
        f"model: {{id: {tiny_model_dir}, device: cpu}}\n"
        "env: {name: tests.fakes:FakeEnv, kwargs: {max_steps: 2}, train_tasks: 1, "
        "test_tasks: 1}\n"
        "search: {simulations: 2, k: 2, max_depth: 2, trees_per_batch: 1}\n")
    assert main(["run", str(config), "--run-dir", str(out), "--until", "search"]) == 0
    assert "1 tree resumed" in capsys.readouterr().out
    with Store(out / "store.duckdb", read_only=True) as s:
        (tree,) = s.trees()
        assert (tree.status, tree.simulations_done) == ("done", 2)
        assert s.load_tree(0)[0].snapshot == snapshot  # stored as it came: data
    assert not marker.exists()


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
