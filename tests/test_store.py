"""Store: schema versioning (and its baseline), row types, bulk writes, transactions, clearing,
locking, shard merge, stores that still hold pickles."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import duckdb
import pytest

from offline_agent.types import Task
from storage import (
    SCHEMA_VERSION,
    EvalEpisodeRow,
    MergeConflict,
    NodeRow,
    NodeVisits,
    StageRow,
    Store,
    StoreError,
    StoreInUse,
    TrajectoryRow,
    TreeRow,
    make_node_id,
    merge_shards,
)
from storage.rows import ROWS
from storage.schema import BASELINE, MIGRATIONS
from tests.rows import node_row


def nodes(tree_id: int, n: int) -> list[NodeRow]:
    return [
        node_row(tree_id, i, None if i == 0 else 0, action=f"action {i}",
                 tool_call=None if i == 0 else {"name": "search", "arguments": {"query": "x"}},
                 observation=f"obs {i}", critic_score=0.5,
                 snapshot={"task": None, "num_steps": i, "state": {"page": [i, "x"]}},
                 created_sim=i)
        for i in range(n)
    ]


def fill(store: Store, tree_ids=(0,), hash_="h1", tasks=("a", "b")) -> None:
    """A small run's worth of rows: tasks + finished stage rows + trees with nodes."""
    store.start_stage("tasks", "", hash_, {"env": {}})
    with store.transaction():
        store.insert_tasks([Task(t, "fake", f"do {t}") for t in tasks], stage="tasks")
        store.mark_stage_done("tasks", "", {"train": len(tasks)})
    for t in tree_ids:
        store.upsert_trees([TreeRow(t, tasks[t], "done", simulations_done=2, best_reward=1.0)],
                           stage="search")
        store.insert_nodes(nodes(t, 3))
        store.insert_trajectories([TrajectoryRow(
            traj_id=make_node_id(t, 0), task_id=tasks[t], tree_id=t, source="mcts_rollout",
            simulation=0, steps=[{"action": "a"}], reward=1.0, success=True)], stage="search")


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


def old_store(path, version: int, node_sql: str = "") -> None:
    """A store as schema version `version` wrote it (its migrations only), one node row."""
    con = duckdb.connect(str(path))
    for statements in MIGRATIONS[:version]:
        for sql in statements:
            con.execute(sql)
    con.execute(f"INSERT INTO meta VALUES ('schema_version', '{version}'), ('run_id', 'r1')")
    if node_sql:
        con.execute(node_sql)
    con.close()


def columns(path) -> dict[str, list[tuple]]:
    """Every table's (column, type, nullable, default) in stored order, and its primary key."""
    con = duckdb.connect(str(path), read_only=True)
    out: dict[str, list[tuple]] = {}
    for table, *column in con.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'main' "
            "ORDER BY table_name, ordinal_position").fetchall():
        out.setdefault(table, []).append(tuple(column))
    for table, key in con.execute("SELECT table_name, constraint_column_names FROM "
                                  "duckdb_constraints() WHERE constraint_type = 'PRIMARY KEY'"
                                  ).fetchall():
        out[table].append(("PRIMARY KEY", *key))
    con.close()
    return out


def test_an_older_store_is_migrated_and_keeps_its_rows(tmp_path):
    path = tmp_path / "s.duckdb"
    old_store(path, 1, "INSERT INTO nodes (node_id, tree_id, depth, action, visits, value_sum, "
                       "prior) VALUES (7, 0, 1, 'buy', 3, 1.5, 0.2)")
    with pytest.raises(StoreError, match="needs migrating"):
        Store(path, read_only=True)
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION and s.run_id == "r1"
        (node,) = s.load_tree(0)
    assert (node.node_id, node.action, node.visits, node.value_sum) == (7, "buy", 3, 1.5)
    assert node.realized_sum == 1.5  # older trees: the backed-up returns stand in
    assert node.ending is None and node.snapshot is None
    names = [c[0] for c in columns(path)["nodes"]]
    assert "prior" not in names and "env_snapshot" not in names
    assert "pickled_snapshot" not in names


def test_the_migrated_schema_is_the_baseline(tmp_path):
    """BASELINE (storage/schema.py) states exactly what the migrations make."""
    Store(tmp_path / "migrated.duckdb").close()
    con = duckdb.connect(str(tmp_path / "baseline.duckdb"))
    for sql in BASELINE.values():
        con.execute(sql)
    con.close()
    migrated = columns(tmp_path / "migrated.duckdb")
    assert migrated == columns(tmp_path / "baseline.duckdb")
    assert list(BASELINE) == list(dict.fromkeys(BASELINE)) and set(BASELINE) == set(migrated)


def test_row_types_are_the_tables_columns(tmp_path):
    """Each row dataclass has its table's columns but `stage` and the timestamps; a field is
    required exactly where its column is NOT NULL without a default, and defaults to the
    column's default otherwise."""
    Store(tmp_path / "s.duckdb").close()
    schema = columns(tmp_path / "s.duckdb")
    for cls in ROWS:
        cols = {c[0]: c for c in schema[cls.TABLE] if c[0] not in ("PRIMARY KEY", "stage")
                and c[1] != "TIMESTAMP"}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        assert set(fields) == set(cols), cls.__name__
        for name, (_, _, nullable, default) in cols.items():
            required = fields[name].default is dataclasses.MISSING
            assert required == (nullable == "NO" and default is None), (cls.__name__, name)
            if not required:  # None: NULL; else the column's default as DuckDB prints it
                value = fields[name].default
                shown = None if value is None else str(value).lower().removesuffix(".0")
                assert shown == default, (cls.__name__, name, value, default)


def test_a_stage_row_has_every_column_of_stages(tmp_path):
    """StageRow, which only the Store builds, has all of the table's columns in their order."""
    Store(tmp_path / "s.duckdb").close()
    names = [c[0] for c in columns(tmp_path / "s.duckdb")["stages"] if c[0] != "PRIMARY KEY"]
    assert [f.name for f in dataclasses.fields(StageRow)] == names
    with Store(tmp_path / "s.duckdb") as s:
        s.start_stage("tasks", "", "h", {"env": {}})
        assert s.stage("tasks").seconds is None
        s.mark_stage_done("tasks", "", {"train": 1})
        (row,) = s.stages()
    assert (row.stage, row.status, row.config, row.stats) == ("tasks", "done", {"env": {}},
                                                             {"train": 1})
    assert row.seconds == (row.finished_at - row.started_at).total_seconds() >= 0


@pytest.mark.parametrize("version", [1, 4, 6])
def test_a_store_that_still_holds_pickles_is_refused_at_open_unchanged(tmp_path, version):
    """No pickle path is left: a store whose nodes hold pickled snapshots (env_snapshot before
    v5, pickled_snapshot in v5-v6) gets one error naming the way out, and is not migrated."""
    path = tmp_path / "s.duckdb"
    column = "env_snapshot" if version < 5 else "pickled_snapshot"
    old_store(path, version, f"INSERT INTO nodes (node_id, tree_id, depth, {column}) "
                             "VALUES (7, 0, 0, '\\x80\\x04.'::BLOB)")
    before = path.read_bytes()
    for read_only in (True, False):
        with pytest.raises(StoreError) as e:
            Store(path, read_only=read_only)
        text = str(e.value)
        assert f"schema version {version}) holds 1 pickled env snapshots" in text
        assert "no longer reads" in text and "commit 572c828" in text
    con = duckdb.connect(str(path), read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        str(version),)
    con.close()
    assert path.read_bytes() == before


def test_a_v6_store_without_pickles_migrates_and_drops_the_column(tmp_path):
    path = tmp_path / "s.duckdb"
    old_store(path, 6, "INSERT INTO nodes (node_id, tree_id, depth, snapshot) "
                       "VALUES (7, 0, 0, '{\"state\": 1}')")
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s.load_tree(0)[0].snapshot == {"state": 1}
    assert "pickled_snapshot" not in [c[0] for c in columns(path)["nodes"]]


def test_read_only_needs_existing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "missing.duckdb", read_only=True)


def test_nodes_round_trip_and_bulk_update(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_nodes(nodes(7, 4))
        s.update_visits([NodeVisits(make_node_id(7, i), i + 1, 0.5 * i, 0.25 * i)
                         for i in range(4)])
        rows = s.load_tree(7)
        assert [r.node_id for r in rows] == [make_node_id(7, i) for i in range(4)]
        assert rows[0].parent_id is None and rows[0].tool_call is None
        assert rows[1].tool_call == {"name": "search", "arguments": {"query": "x"}}
        assert rows[2].snapshot == {"task": None, "num_steps": 2, "state": {"page": [2, "x"]}}
        assert [(r.visits, r.value_sum) for r in rows] == [(1, 0), (2, 0.5), (3, 1), (4, 1.5)]
        assert rows[3].terminal is False and rows[3].reward is None  # column defaults
        assert rows == [dataclasses.replace(r, visits=i + 1, value_sum=0.5 * i,  # round trip
                                            realized_sum=0.25 * i)
                        for i, r in enumerate(nodes(7, 4))]
        assert [r.snapshot for r in s.tree_edges([7])] == [None] * 4  # not read there
        assert [dataclasses.replace(r, snapshot=None) for r in rows] == s.tree_edges([7])
        assert s.load_tree(8) == []


def test_write_mistakes_raise(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_nodes(nodes(0, 2))
        with pytest.raises(duckdb.ConstraintException):  # deterministic ids: a dup is a bug
            s.insert_nodes(nodes(0, 1))
        with pytest.raises(TypeError, match="vists"):  # a misspelt column
            NodeRow(node_id=99, tree_id=0, depth=0, vists=1)
        with pytest.raises(TypeError, match="expected NodeRow rows, got dict"):
            s.insert_nodes([{"node_id": 99, "tree_id": 0, "depth": 0}])
        with pytest.raises(ValueError, match="1 of 2 node ids unknown"):
            s.update_visits([NodeVisits(0, 1, 0.0, 0.0), NodeVisits(12345, 1, 0.0, 0.0)])
        assert len(s.load_tree(0)) == 2 and s.load_tree(0)[0].visits == 0  # rolled back
        with pytest.raises(ValueError):
            make_node_id(0, 1 << 24)


def test_transaction_is_all_or_nothing(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.start_stage("search", "", "h", {})
        with pytest.raises(RuntimeError, match="boom"), s.transaction():
            s.insert_nodes(nodes(0, 3))
            s.mark_stage_done("search", "", {"n": 3})
            raise RuntimeError("boom")
        assert s.load_tree(0) == [] and s.stage("search").status == "running"
        with s.transaction():
            s.insert_nodes(nodes(0, 3))
            s.mark_stage_done("search", "", {"n": 3})
        assert len(s.load_tree(0)) == 3 and s.stage("search").stats == {"n": 3}


def test_trees_upsert_tasks_checkpoints(tmp_path):
    with Store(tmp_path / "s.duckdb") as s:
        s.insert_tasks([Task("t1", "e", "one"), Task("t2", "e", "two")], stage="tasks")
        s.insert_tasks([Task("t3", "e", "three", split="test", data={"x": [1]})], stage="tasks")
        assert [t.id for t in s.tasks("train")] == ["t1", "t2"]
        assert s.tasks("test") == [Task("t3", "e", "three", split="test", data={"x": [1]})]
        assert s.task_index() == {"t1": 0, "t2": 1, "t3": 2}
        s.upsert_trees([TreeRow(0, "t1", "running")], stage="search")
        s.upsert_trees([TreeRow(0, "t1", "done", simulations_done=8, best_reward=1.0)],
                       stage="search")
        (tree,) = s.trees()
        assert tree == TreeRow(0, "t1", "done", simulations_done=8, best_reward=1.0)
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
        assert counts["checkpoints"] == 0 and s.stage("tasks").status == "done"
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
        added = merge_shards(s, [a, b])
        assert added["trees"] == 2 and added["nodes"] == 6 and added["tasks"] == 2
        assert added["stages"] == 1 and added["runs"] == 0
        again = merge_shards(s, [a])  # the same shard twice: nothing new, no error
        assert sum(again.values()) == 0
        assert {t.tree_id for t in s.trees()} == {0, 1}
        assert len(s.load_tree(1)) == 3


def test_merge_refuses_collisions(tmp_path):
    a, b = tmp_path / "a.duckdb", tmp_path / "b.duckdb"
    with Store(a) as s:
        fill(s, tree_ids=(0,))
    with Store(b) as s:
        fill(s, tree_ids=(0,))
        s.update_visits([NodeVisits(make_node_id(0, 1), 3, 0.0, 0.0)])
    with Store(tmp_path / "out.duckdb") as s:
        with pytest.raises(MergeConflict, match=r"nodes row \(node_id=1\)"):
            merge_shards(s, [a, b])
        assert s.counts()["nodes"] == 0  # one transaction: nothing half-merged
    c = tmp_path / "c.duckdb"
    with Store(c) as s:
        fill(s, tree_ids=(1,))
        s.start_stage("search", "1/2", "other-hash", {})
    with Store(a) as s:
        s.start_stage("search", "0/2", "hash", {})
    with Store(tmp_path / "out2.duckdb") as s, pytest.raises(MergeConflict, match="configs"):
        merge_shards(s, [a, c])


def test_eval_episodes_of_one_split(tmp_path):
    """split= keeps the episodes of that split's tasks (the report reads test ones only)."""
    with Store(tmp_path / "s.duckdb") as store:
        store.insert_tasks([Task("a", "e", "x", "test"), Task("b", "e", "x", "val")], "tasks")
        store.insert_eval_episodes([EvalEpisodeRow(policy="p", mode="greedy", task_id=t,
                                                   steps=[], reward=0.0, success=False)
                                    for t in ("a", "b")], "eval")
        assert [r.task_id for r in store.eval_episodes(split="test")] == ["a"]
        assert [r.task_id for r in store.eval_episodes(policy="p", split="val")] == ["b"]
        assert len(store.eval_episodes()) == 2
