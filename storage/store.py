"""Store: one DuckDB file per run: the connection, transactions, migrations, and the reads and
writes of each table. With storage/merge.py (shard merge) and storage/step_pairs.py (the step-pair
query), the only code in the project that writes SQL.

Rows travel as the dataclasses of storage/rows.py. Writes are batched: a list of rows becomes
one Arrow table and lands with a single INSERT (or UPDATE ... FROM) inside a transaction;
row-by-row autocommit is ~40x slower to insert and ~80x to update (benchmarks/store_writes.py,
docs/performance.md). Every write method is atomic on its own; wrap several in
`with store.transaction():` to make them durable together, e.g. a stage's last outputs and
`mark_stage_done` (the "done" mark) in one commit.

DuckDB lets one process open a file at a time, even read-only; a second gets
StoreInUse("run is in use by PID ..."). A file that is not an offline-agent store (not DuckDB,
or another program's DuckDB database) is refused unchanged with a StoreError, and so is a
store that still holds pickled env snapshots (schema.PICKLE_COLUMNS).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import pyarrow as pa

from offline_agent.types import Task
from storage.rows import (
    EvalEpisodeRow,
    ExampleRow,
    MetricRow,
    NodeRow,
    NodeVisits,
    PairRow,
    Row,
    StageRow,
    TrajectoryRow,
    TreeRow,
)
from storage.schema import MIGRATIONS, PICKLE_COLUMNS, SCHEMA_VERSION

R = TypeVar("R", bound=Row)


class StoreError(RuntimeError):
    """A store that cannot be used as asked (schema version, missing stage, bad rows)."""


class StoreInUse(StoreError):
    """Another process holds the DuckDB file lock."""

    def __init__(self, path: Path, pid: int | None):
        self.pid = pid
        who = f"PID {pid}" if pid is not None else "another process"
        super().__init__(
            f"run is in use by {who}: {path} is open in another process and DuckDB allows "
            "one process per file. Wait for it to finish (`offline-agent status` reads its "
            "progress.json meanwhile) or stop it."
        )


def _open_error(error: duckdb.Error, path: Path) -> StoreError:
    """One clear error for a file DuckDB cannot open. Its lock error names the holder:
    'Conflicting lock is held in ... (PID 123)'."""
    text = str(error)
    if "lock" in text:
        match = re.search(r"PID (\d+)", text)
        return StoreInUse(path, int(match.group(1)) if match else None)
    if "not a valid DuckDB database" in text:
        size = path.stat().st_size if path.is_file() else 0
        return StoreError(f"{path} is not an offline-agent store: not a DuckDB database "
                          f"({size} bytes{', empty' if not size else ''}); move it away or "
                          "use another run directory")
    return StoreError(f"cannot open {path} as a DuckDB database: {text.splitlines()[0]}")


_ARROW_TYPES = {
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "DOUBLE": pa.float64(),
    "BOOLEAN": pa.bool_(),
    "VARCHAR": pa.string(),
    "JSON": pa.string(),
    "BLOB": pa.binary(),
    "TIMESTAMP": pa.timestamp("us"),
}
_NOW = "current_localtimestamp()"


def _where(**equal: Any) -> tuple[str, dict[str, Any]]:
    """`WHERE a = $a AND b = $b` over the given columns whose value is not None, and its named
    params (a query adds its own names to them): every equality filter of the store."""
    used = {c: v for c, v in equal.items() if v is not None}
    sql = " AND ".join(f"{c} = ${c}" for c in used)
    return (f"WHERE {sql}" if used else "WHERE true"), used


class Store:
    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        self.read_only = read_only
        if read_only and not self.path.exists():
            raise FileNotFoundError(f"no store at {self.path}")
        try:
            self.con = duckdb.connect(str(self.path), read_only=read_only)
        except duckdb.Error as e:
            raise _open_error(e, self.path) from None
        self._depth = 0  # transaction nesting
        try:
            self._migrate()
            self._columns, self._keys = self._describe()
        except BaseException:  # e.g. another program's file: let go of it at once
            self.con.close()
            raise

    # ---- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        self.con.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One commit for everything inside; nested uses join the outer transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        self.con.begin()
        self._depth = 1
        try:
            yield
        except BaseException:
            self.con.rollback()
            raise
        else:
            self.con.commit()  # a failing commit aborts the transaction itself
        finally:
            self._depth = 0

    @property
    def schema_version(self) -> int:
        return self._schema_version()

    @property
    def run_id(self) -> str:
        """Identity of the run this file belongs to (exported as provenance)."""
        clause, params = _where(key="run_id")
        return self._sql(f"SELECT value FROM meta {clause}", params)[0][0]

    def _schema_version(self) -> int:
        """0 for an empty database; a StoreError for a database another program wrote."""
        tables = sorted(t for (t,) in self._sql(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database()"
        ))
        if not tables:
            return 0
        clause, params = _where(key="schema_version")
        try:
            rows = self._sql(f"SELECT value FROM meta {clause}", params)
        except duckdb.Error:  # no meta table, or one with other columns
            rows = []
        if not rows or not str(rows[0][0]).isdigit():
            shown = ", ".join(tables[:5]) + (", ..." if len(tables) > 5 else "")
            raise StoreError(f"{self.path} is not an offline-agent store: a DuckDB database of "
                             f"another program (tables: {shown}); use another run directory")
        return int(rows[0][0])

    def _migrate(self) -> None:
        version = self._schema_version()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this offline-agent "
                f"understands ({SCHEMA_VERSION}); upgrade offline-agent to read it"
            )
        if version in PICKLE_COLUMNS:
            self._refuse_pickles(version, PICKLE_COLUMNS[version])
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            if version == 0:
                raise StoreError(f"{self.path} is not an offline-agent store: an empty DuckDB "
                                 "database")
            raise StoreError(
                f"{self.path} has schema version {version} and needs migrating to "
                f"{SCHEMA_VERSION}: open it for writing once (rerun `offline-agent run`)"
            )
        with self.transaction():
            for statements in MIGRATIONS[version:]:
                for sql in statements:
                    self._sql(sql)
            self._sql("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)",
                     [str(SCHEMA_VERSION)])
            self._sql("INSERT OR IGNORE INTO meta VALUES ('run_id', ?)", [uuid.uuid4().hex[:12]])

    def _refuse_pickles(self, version: int, column: str) -> None:
        """An older store whose nodes still hold pickled env snapshots is refused unchanged:
        loading a pickle can run code, and this offline-agent never loads one."""
        (n,) = self._sql(f"SELECT count(*) FROM nodes WHERE {column} IS NOT NULL")[0]
        if n:
            raise StoreError(
                f"{self.path} (schema version {version}) holds {n} pickled env snapshots, "
                "which this offline-agent no longer reads (loading a pickle can run code). "
                "Convert them with offline-agent at commit 572c828 or earlier: `offline-agent "
                "run RUN_DIR/config.yaml --run-dir RUN_DIR --until search` once re-stores "
                "them as JSON data; or search again in a new run directory"
            )

    def _describe(self) -> tuple[dict[str, dict[str, str]], dict[str, list[str]]]:
        """Column types and primary keys per table, read from the database itself."""
        columns: dict[str, dict[str, str]] = {}
        for table, column, dtype in self._sql(
            "SELECT table_name, column_name, data_type FROM information_schema.columns "
            "WHERE table_catalog = current_database() AND table_schema = 'main' "
            "ORDER BY table_name, ordinal_position"
        ):
            columns.setdefault(table, {})[column] = dtype
        keys = {
            table: list(cols)
            for table, cols in self._sql(
                "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
                "WHERE database_name = current_database() AND constraint_type = 'PRIMARY KEY'"
            )
        }
        return columns, keys

    # ---- row plumbing: package-private, storage/merge.py and storage/step_pairs.py use it too --
    def _sql(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple]:
        """Execute and fetch everything (duckdb 2 refuses new work while a result is open)."""
        return self.con.execute(sql, params).fetchall()

    def _select(self, table: str, sql: str, params: Sequence[Any] | dict[str, Any] = ()
               ) -> list[dict]:
        """Rows as dicts by column, the JSON columns of `table` parsed."""
        cur = self.con.execute(sql, params)  # fetchall below completes it
        names = [d[0] for d in cur.description]
        json_cols = {n for n in names if self._columns[table].get(n) == "JSON"}
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        for row in rows:
            for name in json_cols:
                if row[name] is not None:
                    row[name] = json.loads(row[name])
        return rows

    def _read(self, cls: type[R], sql: str, params: dict[str, Any] | None = None) -> list[R]:
        return [cls.from_row(r) for r in self._select(cls.TABLE, sql, params or {})]

    def _arrow(self, table: str, rows: Sequence[dict], **constants: Any) -> pa.Table:
        """Rows (dicts keyed by column) -> Arrow table typed like the DuckDB table."""
        types = self._columns[table]
        present = set(constants).union(*(r.keys() for r in rows))
        unknown = present - types.keys()
        if unknown:
            raise ValueError(f"table {table!r} has no column(s) {sorted(unknown)}")
        arrays, names = [], []
        for name, dtype in types.items():
            if name not in present:
                continue  # the column's default applies
            values = (
                [constants[name]] * len(rows) if name in constants else [r.get(name) for r in rows]
            )
            if dtype == "JSON":
                values = [None if v is None else json.dumps(v) for v in values]
            try:
                arrays.append(pa.array(values, type=_ARROW_TYPES[dtype]))
            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                raise ValueError(f"{table}.{name}: {e}") from None
            names.append(name)
        return pa.Table.from_arrays(arrays, names=names)

    @contextmanager
    def _registered(self, table: str, rows: Sequence[dict], **constants: Any) -> Iterator[list]:
        data = self._arrow(table, rows, **constants)
        view = f"_batch_{table}"
        self.con.register(view, data)
        try:
            yield data.column_names
        finally:
            self.con.unregister(view)

    def _insert(self, table: str, rows: Sequence[dict], on_conflict: str = "", **constants):
        if not rows:
            return
        with self._registered(table, rows, **constants) as cols, self.transaction():
            names = ", ".join(cols)
            self._sql(
                f"INSERT INTO {table} ({names}) SELECT {names} FROM _batch_{table} {on_conflict}"
            )

    @staticmethod
    def _dicts(cls: type[Row], rows: Sequence[Row]) -> list[dict]:
        """Row dataclasses -> dicts by column; rows of another type are a clear TypeError."""
        wrong = {type(r).__name__ for r in rows if type(r) is not cls}
        if wrong:
            raise TypeError(f"expected {cls.__name__} rows, got {', '.join(sorted(wrong))}")
        return [r.to_row() for r in rows]

    # ---- runs ------------------------------------------------------------------------------
    def record_run(self, config: dict) -> None:
        """Store the resolved config this run is (re)started with."""
        self._sql(
            "INSERT INTO runs (run_id, config) VALUES (?, ?) ON CONFLICT (run_id) "
            f"DO UPDATE SET config = excluded.config, updated_at = {_NOW}",
            [self.run_id, json.dumps(config)],
        )

    def runs(self) -> list[dict]:
        return self._select("runs", "SELECT * FROM runs ORDER BY created_at")

    # ---- stages and checkpoints ------------------------------------------------------------
    def stages(self, stage: str | None = None) -> list[StageRow]:
        """Stage rows (all shards), oldest first; only `stage`'s when given."""
        clause, params = _where(stage=stage)
        return self._read(StageRow, f"SELECT * FROM stages {clause} ORDER BY started_at", params)

    def stage(self, stage: str, shard: str = "") -> StageRow | None:
        clause, params = _where(stage=stage, shard=shard)
        rows = self._read(StageRow, f"SELECT * FROM stages {clause}", params)
        return rows[0] if rows else None

    def start_stage(self, stage: str, shard: str, config_hash: str, config: dict,
                    earlier_seconds: float = 0.0) -> None:
        """Record an attempt starting now; `earlier_seconds`: those of the attempts it
        resumes (0 for a fresh start), counted in the stage's seconds."""
        self._sql(
            "INSERT INTO stages (stage, shard, status, config_hash, config, earlier_seconds) "
            "VALUES (?, ?, 'running', ?, ?, ?) ON CONFLICT (stage, shard) DO UPDATE SET "
            "status = 'running', config_hash = excluded.config_hash, config = excluded.config, "
            f"stats = NULL, started_at = {_NOW}, finished_at = NULL, "
            "earlier_seconds = excluded.earlier_seconds",
            [stage, shard, config_hash, json.dumps(config), earlier_seconds],
        )

    def mark_stage_done(self, stage: str, shard: str, stats: dict) -> None:
        """Mark a stage done; call it inside the transaction that commits its last outputs."""
        self._end_stage(stage, shard, "done", stats)

    def fail_stage(self, stage: str, shard: str, error: str, status: str = "failed") -> None:
        """End a stage that raised: status failed, or interrupted (Ctrl-C)."""
        self._end_stage(stage, shard, status, {"error": error})

    def _end_stage(self, stage: str, shard: str, status: str, stats: dict) -> None:
        clause, params = _where(stage=stage, shard=shard)
        (n,) = self._sql(
            f"UPDATE stages SET status = $status, stats = $stats, finished_at = {_NOW} {clause}",
            {**params, "status": status, "stats": json.dumps(stats)},
        )[0]
        if n != 1:
            raise RuntimeError(f"stage {stage!r} (shard {shard!r}) was never started")

    def clear_stage(self, stage: str) -> dict[str, int]:
        """Delete everything `stage` produced (all shards) and its stage rows; returns counts."""
        clause, params = _where(stage=stage)
        deleted = {}
        with self.transaction():
            (deleted["nodes"],) = self._sql(
                f"DELETE FROM nodes WHERE tree_id IN (SELECT tree_id FROM trees {clause})", params
            )[0]
            for table, cols in self._columns.items():
                if "stage" in cols:
                    (deleted[table],) = self._sql(f"DELETE FROM {table} {clause}", params)[0]
        return deleted

    def set_checkpoint(self, stage: str, shard: str, key: str, value: Any) -> None:
        self._sql(
            "INSERT INTO checkpoints (stage, shard, key, value) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (stage, shard, key) DO UPDATE SET value = excluded.value, "
            f"updated_at = {_NOW}",
            [stage, shard, key, json.dumps(value)],
        )

    def checkpoint(self, stage: str, shard: str, key: str, default: Any = None) -> Any:
        clause, params = _where(stage=stage, shard=shard, key=key)
        rows = self._select("checkpoints", f"SELECT value FROM checkpoints {clause}", params)
        return rows[0]["value"] if rows else default

    def final_checkpoints(self, stage: str) -> dict[str, Any]:
        """{name: value} of `stage`'s checkpoints keyed '<name>/final' (a trained policy's
        finished adapter), oldest first: the order the stage finished them."""
        clause, params = _where(stage=stage)
        rows = self._select(
            "checkpoints",
            f"SELECT key, value FROM checkpoints {clause} AND key LIKE '%/final' "
            "ORDER BY updated_at, key",
            params,
        )
        return {r["key"].removesuffix("/final"): r["value"] for r in rows}

    # ---- tasks -----------------------------------------------------------------------------
    def insert_tasks(self, tasks: Sequence[Task], stage: str) -> None:
        """Append tasks; `idx` continues the run's numbering (train first, then test)."""
        (start,) = self._sql("SELECT count(*) FROM tasks")[0]
        rows = [
            {
                "task_id": t.id,
                "idx": start + i,
                "env": t.env,
                "split": t.split,
                "instruction": t.instruction,
                "data": t.data,
            }
            for i, t in enumerate(tasks)
        ]
        self._insert("tasks", rows, stage=stage)

    def tasks(self, split: str | None = None) -> list[Task]:
        """Tasks in `idx` order (all splits when None)."""
        clause, params = _where(split=split)
        rows = self._select("tasks", f"SELECT * FROM tasks {clause} ORDER BY idx", params)
        return [
            Task(
                id=r["task_id"],
                env=r["env"],
                instruction=r["instruction"],
                split=r["split"],
                data=r["data"] or {},
            )
            for r in rows
        ]

    def task_index(self) -> dict[str, int]:
        """task_id -> idx: a run-wide, shard-independent number (e.g. for tree ids)."""
        return dict(self._sql("SELECT task_id, idx FROM tasks"))

    # ---- trees and nodes -------------------------------------------------------------------
    def upsert_trees(self, rows: Sequence[TreeRow], stage: str) -> None:
        """Create trees, or update a stored tree's status, simulations_done and best_reward."""
        sets = ", ".join(f"{c} = excluded.{c}" for c in ("status", "simulations_done",
                                                           "best_reward"))
        self._insert("trees", self._dicts(TreeRow, rows),
                     f"ON CONFLICT (tree_id) DO UPDATE SET {sets}, updated_at = {_NOW}",
                     stage=stage)

    def trees(self, stage: str | None = None) -> list[TreeRow]:
        """Trees in id order; only those `stage` searched when given (e.g. one round's)."""
        clause, params = _where(stage=stage)
        return self._read(TreeRow, f"SELECT * FROM trees {clause} ORDER BY tree_id", params)

    def insert_nodes(self, rows: Sequence[NodeRow]) -> None:
        """Bulk insert; ids come from make_node_id, so a duplicate is a bug and raises."""
        self._insert("nodes", self._dicts(NodeRow, rows))

    def update_visits(self, rows: Sequence[NodeVisits]) -> None:
        """Bulk update of stored nodes' visits, value_sum and realized_sum (search's backup)."""
        if not rows:
            return
        with self._registered("nodes", self._dicts(NodeVisits, rows)), self.transaction():
            (n,) = self._sql(
                "UPDATE nodes SET visits = u.visits, value_sum = u.value_sum, "
                "realized_sum = u.realized_sum "
                "FROM _batch_nodes u WHERE nodes.node_id = u.node_id"
            )[0]
            if n != len(rows):
                raise ValueError(f"update_visits: {len(rows) - n} of {len(rows)} node ids "
                                 "unknown")

    def load_tree(self, tree_id: int) -> list[NodeRow]:
        """All nodes of a tree in id order (parents before children), snapshots included."""
        clause, params = _where(tree_id=tree_id)
        return self._read(NodeRow, f"SELECT * FROM nodes {clause} ORDER BY node_id", params)

    def tree_edges(self, tree_ids: Sequence[int]) -> list[NodeRow]:
        """Nodes of the given trees with `snapshot` None (not read): what message building
        needs."""
        if not tree_ids:
            return []
        return self._read(NodeRow, "SELECT * REPLACE (NULL AS snapshot) FROM nodes "
                          "WHERE tree_id IN (SELECT unnest($ids)) ORDER BY node_id",
                          {"ids": [int(t) for t in tree_ids]})

    def tree_statistics(self, stage: str) -> list[tuple[str, list[NodeRow]]]:
        """Each tree `stage` searched, in id order, as (its task's env, its nodes in id order)
        with the texts, ids, info and snapshot None (not read): what counts over trees
        (offline_agent/search/concordance.py) read."""
        rows = self._select(
            "nodes", "SELECT tk.env, n.* REPLACE (NULL AS action, NULL AS tool_call, "
            "NULL AS observation, NULL AS info, NULL AS snapshot, NULL AS token_ids) "
            "FROM nodes n JOIN trees t USING (tree_id) JOIN tasks tk USING (task_id) "
            "WHERE t.stage = $stage ORDER BY n.node_id", {"stage": stage})
        trees: dict[int, tuple[str, list[NodeRow]]] = {}
        for row in rows:
            trees.setdefault(row["tree_id"], (row["env"], []))[1].append(NodeRow.from_row(row))
        return list(trees.values())

    # ---- trajectories, pairs, examples -----------------------------------------------------
    def insert_trajectories(self, rows: Sequence[TrajectoryRow], stage: str) -> None:
        self._insert("trajectories", self._dicts(TrajectoryRow, rows), stage=stage)

    def trajectories(self, source: str | None = None,
                     stage: str | None = None) -> list[TrajectoryRow]:
        """Episodes in id order, of one source and one stage when given."""
        clause, params = _where(source=source, stage=stage)
        return self._read(TrajectoryRow,
                          f"SELECT * FROM trajectories {clause} ORDER BY traj_id", params)

    def trajectory_tasks(self, source: str) -> set[str]:
        """Ids of tasks with at least one trajectory from `source` (what a resume can skip)."""
        clause, params = _where(source=source)
        return {r[0] for r in self._sql(f"SELECT DISTINCT task_id FROM trajectories {clause}",
                                       params)}

    def solved_tasks(self, source: str, stage: str | None = None) -> set[str]:
        """Ids of tasks with at least one successful trajectory from `source` (and `stage`)."""
        clause, params = _where(source=source, stage=stage)
        rows = self._sql(f"SELECT DISTINCT task_id FROM trajectories {clause} AND success",
                        params)
        return {r[0] for r in rows}

    def insert_pairs(self, rows: Sequence[PairRow], stage: str) -> None:
        self._insert("pairs", self._dicts(PairRow, rows), stage=stage)

    def pairs(self, kind: str | None = None, stage: str | None = None) -> list[PairRow]:
        """Mined pairs (kind "step" | "trajectory"; of one mine stage), all when None, id order."""
        clause, params = _where(kind=kind, stage=stage)
        return self._read(PairRow, f"SELECT * FROM pairs {clause} ORDER BY pair_id", params)

    def insert_examples(self, rows: Sequence[ExampleRow], stage: str) -> None:
        self._insert("examples", self._dicts(ExampleRow, rows), stage=stage)

    def examples(self, kinds: Sequence[str] = ("rft", "hindsight"),
                 stage: str | None = None) -> list[ExampleRow]:
        """SFT examples of the given kinds (rft: successes; hindsight: relabeled) written by
        `stage` (any when None), id order."""
        clause, params = _where(stage=stage)
        return self._read(ExampleRow, f"SELECT * FROM examples {clause} AND kind IN "
                          "(SELECT unnest($kinds)) ORDER BY example_id",
                          {**params, "kinds": list(kinds)})

    def counts(self) -> dict[str, int]:
        """Rows per table (meta excluded)."""
        return {
            t: self._sql(f"SELECT count(*) FROM {t}")[0][0]
            for t in self._columns
            if t != "meta"
        }

    _COUNTED = {("pairs", "kind"), ("examples", "kind"), ("trajectories", "source"),
                ("tasks", "split")}

    def count_by(self, table: str, column: str) -> dict[str, int]:
        """Rows of `table` per value of `column` (pairs or examples by kind, trajectories by
        source, tasks by split)."""
        if (table, column) not in self._COUNTED:
            raise ValueError(f"count_by: no count of {table} by {column}; counted: "
                             f"{sorted(self._COUNTED)}")
        return dict(self._sql(f"SELECT {column}, count(*) FROM {table} GROUP BY {column} "
                             f"ORDER BY {column}"))

    # ---- training metrics ------------------------------------------------------------------
    def insert_metrics(self, rows: Sequence[MetricRow], stage: str) -> None:
        """Per-step metrics; a step written again (a resumed run redoing steps past its
        checkpoint) replaces the old row."""
        self._insert("metrics", self._dicts(MetricRow, rows),
                     "ON CONFLICT (stage, series, step) DO UPDATE SET data = excluded.data",
                     stage=stage)

    def metrics(self, stage: str, series: str | None = None) -> list[MetricRow]:
        """Metric rows of `stage` (one series when given), by series then step."""
        clause, params = _where(stage=stage, series=series)
        return self._read(MetricRow, f"SELECT * FROM metrics {clause} ORDER BY series, step",
                          params)

    # ---- evaluation ------------------------------------------------------------------------
    def insert_eval_episodes(self, rows: Sequence[EvalEpisodeRow], stage: str) -> None:
        """Episodes keyed by (policy, mode, task_id): a second row for one key raises."""
        self._insert("eval_episodes", self._dicts(EvalEpisodeRow, rows), stage=stage)

    def eval_episodes(self, policy: str | None = None, mode: str | None = None,
                      stage: str | None = None, split: str | None = None
                      ) -> list[EvalEpisodeRow]:
        """Evaluation episodes ordered by policy, mode and task (all when filters are None;
        of one eval stage when `stage` is given; of the tasks of one split, e.g. "test",
        when `split` is given)."""
        clause, params = _where(policy=policy, mode=mode, stage=stage)
        if split is not None:
            clause += " AND task_id IN (SELECT task_id FROM tasks WHERE split = $split)"
            params["split"] = split
        return self._read(EvalEpisodeRow, f"SELECT * FROM eval_episodes {clause} "
                          "ORDER BY policy, mode, task_id", params)

    def eval_tasks(self, policy: str, mode: str) -> set[str]:
        """Ids of tasks `policy` has finished in `mode` (what a resumed evaluation skips)."""
        clause, params = _where(policy=policy, mode=mode)
        return {r[0] for r in self._sql(f"SELECT task_id FROM eval_episodes {clause}", params)}
