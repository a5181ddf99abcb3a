"""Store: schema versioning, bulk writes, transactions, clearing, locking, shard merge."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import duckdb
import pytest

from offline_agent.types import Task
from storage import (
    SCHEMA_VERSION,
    MergeConflict,
    Store,
    StoreError,
    StoreInUse,
    make_node_id,
)
from storage.schema import MIGRATIONS


def nodes(tree_id: int, n: int) -> list[dict]:
    return [
        {
            "node_id": make_node_id(tree_id, i),
            "tree_id": tree_id,
            "parent_id": None if i == 0 else make_node_id(tree_id, 0),
            "depth": 0 if i == 0 else 1,
            "action": f"action {i}",
            "tool_call": None if i == 0 else {"name": "search", "arguments": {"query": "x"}},
            "observation": f"obs {i}",
            "critic_score": 0.5,
            "snapshot": {"task": None, "num_steps": i, "state": {"page": [i, "x"]}},
            "created_sim": i,
        }
        for i in range(n)
    ]


def fill(store: Store, tree_ids=(0,), hash_="h1", tasks=("a", "b")) -> None:
    """A small run's worth of rows: tasks + finished stage rows + trees with nodes."""
    store.start_stage("tasks", "", hash_, {"env": {}})
    with store.transaction():
        store.insert_tasks([Task(t, "fake", f"do {t}") for t in tasks], stage="tasks")
        store.mark_stage_done("tasks", "", {"train": len(tasks)})
    for t in tree_ids:
        store.upsert_trees([{"tree_id": t, "task_id": tasks[t], "status": "done",
                             "simulations_done": 2, "best_reward": 1.0}], stage="search")
        store.insert_nodes(nodes(t, 3))
        store.insert_trajectories([{"traj_id": make_node_id(t, 0), "task_id": tasks[t],
                                    "tree_id": t, "source": "mcts_rollout", "simulation": 0,
                                    "steps": [{"action": "a"}], "reward": 1.0,
                                    "success": True}], stage="search")


def test_fresh_store_has_schema_and_run_id(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        assert s.schema_version == SCHEMA_VERSION
        run_id = s.run_id
        assert set(s.counts()) >= {"runs", "stages", "tasks", "trees", "nodes", "trajectories",
                                   "pairs", "checkpoints"}
    with Store(tmp_path / "s.duckdb", read_only=True) as s:  # reopening migrates nothing
        assert s.run_id == run_id


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "s.duckdb"
    Store(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    con.close()
    with pytest.raises(StoreError, match="schema version 99, newer"):
        Store(path)


def test_an_older_store_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "s.duckdb"
    con = duckdb.connect(str(path))  # a store as schema version 1 wrote it
    for sql in MIGRATIONS[0]:
        con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('run_id', 'r1')")
    con.execute("INSERT INTO nodes (node_id, tree_id, depth, action, visits, value_sum, prior, "
                "env_snapshot) VALUES (7, 0, 1, 'buy', 3, 1.5, 0.2, '\\x80\\x04.'::BLOB)")
    con.close()
    with pytest.raises(StoreError, match="needs migrating"):
        Store(path, read_only=True)
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION and s.run_id == "r1"
        (node,) = s.load_tree(0)
    assert (node["node_id"], node["action"], node["visits"], node["value_sum"]) == (7, "buy", 3, 1.5)
    assert node["ending"] is None and "prior" not in node
    # a pickle is moved aside, never loaded by the store (pipelines/legacy_snapshots.py does,
    # for the user's own run only)
    assert node["pickled_snapshot"] == b"\x80\x04." and node["snapshot"] is None


def test_read_only_needs_existing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_nodes_round_trip_and_bulk_update(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_nodes(nodes(7, 4))
        s.update_nodes([{"node_id": make_node_id(7, i), "visits": i + 1, "value_sum": 0.5 * i}
                        for i in range(4)])
        rows = s.load_tree(7)
        assert [r["node_id"] for r in rows] == [make_node_id(7, i) for i in range(4)]
        assert rows[0]["parent_id"] is None and rows[0]["tool_call"] is None
        assert rows[1]["tool_call"] == {"name": "search", "arguments": {"query": "x"}}
        assert rows[2]["snapshot"] == {"task": None, "num_steps": 2, "state": {"page": [2, "x"]}}
        assert [(r["visits"], r["value_sum"]) for r in rows] == [(1, 0), (2, 0.5), (3, 1), (4, 1.5)]
        assert rows[3]["terminal"] is False and rows[3]["reward"] is None  # column defaults
        assert s.load_tree(8) == []


def test_write_mistakes_raise(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_nodes(nodes(0, 2))
        with pytest.raises(duckdb.ConstraintException):  # deterministic ids: a dup is a bug
            s.insert_nodes(nodes(0, 1))
        with pytest.raises(ValueError, match="no column"):
            s.insert_nodes([{"node_id": 99, "tree_id": 0, "depth": 0, "vists": 1}])
        with pytest.raises(ValueError, match="1 of 2 node ids unknown"):
            s.update_nodes([{"node_id": 0, "visits": 1}, {"node_id": 12345, "visits": 1}])
        assert len(s.load_tree(0)) == 2 and s.load_tree(0)[0]["visits"] == 0  # rolled back
        with pytest.raises(ValueError):
            make_node_id(0, 1 << 24)


def test_transaction_is_all_or_nothing(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.start_stage("search", "", "h", {})
        with pytest.raises(RuntimeError, match="boom"), s.transaction():
            s.insert_nodes(nodes(0, 3))
            s.mark_stage_done("search", "", {"n": 3})
            raise RuntimeError("boom")
        assert s.load_tree(0) == [] and s.stage("search")["status"] == "running"
        with s.transaction():
            s.insert_nodes(nodes(0, 3))
            s.mark_stage_done("search", "", {"n": 3})
        assert len(s.load_tree(0)) == 3 and s.stage("search")["stats"] == {"n": 3}


def test_trees_upsert_tasks_checkpoints(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_tasks([Task("t1", "e", "one"), Task("t2", "e", "two")], stage="tasks")
        s.insert_tasks([Task("t3", "e", "three", split="test", data={"x": [1]})], stage="tasks")
        assert [t.id for t in s.tasks("train")] == ["t1", "t2"]
        assert s.tasks("test") == [Task("t3", "e", "three", split="test", data={"x": [1]})]
        assert s.task_index() == {"t1": 0, "t2": 1, "t3": 2}
        s.upsert_trees([{"tree_id": 0, "task_id": "t1", "status": "running"}], stage="search")
        s.upsert_trees([{"tree_id": 0, "task_id": "t1", "status": "done", "simulations_done": 8,
                         "best_reward": 1.0}], stage="search")
        (tree,) = s.trees()
        assert (tree["status"], tree["simulations_done"], tree["best_reward"]) == ("done", 8, 1.0)
        assert s.checkpoint("search", "0/1", "k", default=5) == 5
        s.set_checkpoint("search", "0/1", "k", {"a": 1})
        s.set_checkpoint("search", "0/1", "k", {"a": 2})
        assert s.checkpoint("search", "0/1", "k") == {"a": 2}


def test_clear_stage_removes_only_its_rows(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        fill(s, tree_ids=(0, 1))
        s.start_stage("search", "0/1", "h", {})
        s.set_checkpoint("search", "0/1", "cursor", 3)
        deleted = s.clear_stage("search")
        assert deleted["nodes"] == 6 and deleted["trees"] == 2 and deleted["trajectories"] == 2
        counts = s.counts()
        assert counts["tasks"] == 2 and counts["nodes"] == counts["trees"] == 0
        assert counts["checkpoints"] == 0 and s.stage("tasks")["status"] == "done"
        assert s.stage("search", "0/1") is None


def test_second_process_gets_pid_error(tmp_path):
    path = tmp_path / "s.duckdb"
    Store(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from storage import Store
            s = Store({str(path)!r})
            print("ready", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        for read_only in (False, True):
            with pytest.raises(StoreInUse, match=f"run is in use by PID {holder.pid}") as e:
                Store(path, read_only=read_only)
            assert e.value.pid == holder.pid
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    Store(path).close()  # free again


def test_merge_shards(tmp_path):
    a, b, out = tmp_path / "a.duckdb", tmp_path / "b.duckdb", tmp_path / "out.duckdb"
    with Store(a) as s:
        fill(s, tree_ids=(0,))
    with Store(b) as s:
        fill(s, tree_ids=(1,))
    with Store(out) as s:
        added = s.merge_from([a, b])
        assert added["trees"] == 2 and added["nodes"] == 6 and added["tasks"] == 2
        assert added["stages"] == 1 and added["runs"] == 0
        again = s.merge_from([a])  # the same shard twice: nothing new, no error
        assert sum(again.values()) == 0
        assert {t["tree_id"] for t in s.trees()} == {0, 1}
        assert len(s.load_tree(1)) == 3


def test_merge_refuses_collisions(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    with Store(a) as s:
        fill(s, tree_ids=(0,))
    with Store(b) as s:
        fill(s, tree_ids=(0,))
        s.update_nodes([{"node_id": make_node_id(0, 1), "visits": 3}])
    with Store(tmp_path / "out.duckdb") as s:
        with pytest.raises(MergeConflict, match=r"nodes row \(node_id=1\)"):
            s.merge_from([a, b])
        assert s.counts()["nodes"] == 0  # one transaction: nothing half-merged
    c = tmp_path / "c.duckdb"
    with Store(c) as s:
        fill(s, tree_ids=(1,))
        s.start_stage("search", "1/2", "other-hash", {})
    with Store(a) as s:
        s.start_stage("search", "0/2", "hash", {})
    with Store(tmp_path / "out2.duckdb") as s, pytest.raises(MergeConflict, match="configs"):
        s.merge_from([a, c])
