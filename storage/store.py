"""Store: one DuckDB file per run, and the only code in the project that writes SQL.

Writes are batched: rows arrive as lists of dicts, become one Arrow table, and land with a
single INSERT (or UPDATE ... FROM) inside a transaction; row-by-row autocommit is 20-40x
slower (benchmarks/storage.py). Every write method is atomic on its own; wrap several in
`with store.transaction():` to make them durable together, e.g. a stage's last outputs
and `mark_stage_done` (the "done" mark) in one commit.

DuckDB lets one process open a file at a time, even read-only; a second gets
StoreInUse("run is in use by PID ..."). A file that is not an offline-agent store (not DuckDB,
or another program's DuckDB database) is refused unchanged with a StoreError.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from offline_agent.types import Task
from storage.schema import MIGRATIONS, SCHEMA_VERSION


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


class MergeConflict(StoreError):
    """Two shards hold different rows under one key."""


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


def _capped(name: str, source: str, group: str, cap: str) -> str:
    """Two CTEs keeping at most `cap` rows of `source` per `group`: the first of every
    margin bin, then the second, ... (seeded `key` order inside a bin)."""
    return (f"{name}_ranked AS (SELECT *, row_number() OVER (PARTITION BY {group}, bin "
            f"ORDER BY key) AS rank FROM {source}), "
            f"{name} AS (SELECT * EXCLUDE (rank) FROM {name}_ranked QUALIFY row_number() "
            f"OVER (PARTITION BY {group} ORDER BY rank, bin, key) <= {cap})")


def _where(**equal: Any) -> tuple[str, list]:
    """`WHERE a = ? AND b = ?` over the given columns whose value is not None, and its params."""
    used = [(c, v) for c, v in equal.items() if v is not None]
    sql = " AND ".join(f"{c} = ?" for c, _ in used)
    return (f"WHERE {sql}" if used else "WHERE true"), [v for _, v in used]


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
        return self._sql("SELECT value FROM meta WHERE key = 'run_id'")[0][0]

    def _schema_version(self) -> int:
        """0 for an empty database; a StoreError for a database another program wrote."""
        tables = sorted(t for (t,) in self._sql(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_catalog = current_database()"
        ))
        if not tables:
            return 0
        try:
            rows = self._sql("SELECT value FROM meta WHERE key = 'schema_version'")
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
            self._sql(
                "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)]
            )
            self._sql(
                "INSERT OR IGNORE INTO meta VALUES ('run_id', ?)", [uuid.uuid4().hex[:12]]
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

    # ---- row plumbing ----------------------------------------------------------------------
    def _sql(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        """Execute and fetch everything (duckdb 2 refuses new work while a result is open)."""
        return self.con.execute(sql, params).fetchall()

    def _select(self, table: str, sql: str, params: Sequence[Any] = ()) -> list[dict]:
        cur = self.con.execute(sql, params)  # fetchall below completes it
        names = [d[0] for d in cur.description]
        json_cols = {n for n in names if self._columns[table].get(n) == "JSON"}
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        for row in rows:
            for name in json_cols:
                if row[name] is not None:
                    row[name] = json.loads(row[name])
        return rows

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
    def stages(self, stage: str | None = None) -> list[dict]:
        """Stage rows (all shards), oldest first; only `stage`'s when given."""
        where, params = ("WHERE stage = ?", [stage]) if stage else ("", [])
        return self._select("stages", f"SELECT * FROM stages {where} ORDER BY started_at", params)

    def stage(self, stage: str, shard: str = "") -> dict | None:
        rows = self._select(
            "stages", "SELECT * FROM stages WHERE stage = ? AND shard = ?", [stage, shard]
        )
        return rows[0] if rows else None

    def start_stage(self, stage: str, shard: str, config_hash: str, config: dict) -> None:
        self._sql(
            "INSERT INTO stages (stage, shard, status, config_hash, config) "
            "VALUES (?, ?, 'running', ?, ?) ON CONFLICT (stage, shard) DO UPDATE SET "
            "status = 'running', config_hash = excluded.config_hash, config = excluded.config, "
            f"stats = NULL, started_at = {_NOW}, finished_at = NULL",
            [stage, shard, config_hash, json.dumps(config)],
        )

    def mark_stage_done(self, stage: str, shard: str, stats: dict) -> None:
        """Mark a stage done; call it inside the transaction that commits its last outputs."""
        self._end_stage(stage, shard, "done", stats)

    def fail_stage(self, stage: str, shard: str, error: str) -> None:
        self._end_stage(stage, shard, "failed", {"error": error})

    def _end_stage(self, stage: str, shard: str, status: str, stats: dict) -> None:
        (n,) = self._sql(
            f"UPDATE stages SET status = ?, stats = ?, finished_at = {_NOW} "
            "WHERE stage = ? AND shard = ?",
            [status, json.dumps(stats), stage, shard],
        )[0]
        if n != 1:
            raise RuntimeError(f"stage {stage!r} (shard {shard!r}) was never started")

    def clear_stage(self, stage: str) -> dict[str, int]:
        """Delete everything `stage` produced (all shards) and its stage rows; returns counts."""
        deleted = {}
        with self.transaction():
            (deleted["nodes"],) = self._sql(
                "DELETE FROM nodes WHERE tree_id IN (SELECT tree_id FROM trees WHERE stage = ?)",
                [stage],
            )[0]
            for table, cols in self._columns.items():
                if "stage" in cols:
                    (deleted[table],) = self._sql(
                        f"DELETE FROM {table} WHERE stage = ?", [stage]
                    )[0]
        return deleted

    def set_checkpoint(self, stage: str, shard: str, key: str, value: Any) -> None:
        self._sql(
            "INSERT INTO checkpoints (stage, shard, key, value) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (stage, shard, key) DO UPDATE SET value = excluded.value, "
            f"updated_at = {_NOW}",
            [stage, shard, key, json.dumps(value)],
        )

    def checkpoint(self, stage: str, shard: str, key: str, default: Any = None) -> Any:
        rows = self._select(
            "checkpoints",
            "SELECT value FROM checkpoints WHERE stage = ? AND shard = ? AND key = ?",
            [stage, shard, key],
        )
        return rows[0]["value"] if rows else default

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
        where, params = ("WHERE split = ?", [split]) if split else ("", [])
        rows = self._select("tasks", f"SELECT * FROM tasks {where} ORDER BY idx", params)
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
    def upsert_trees(self, rows: Sequence[dict], stage: str) -> None:
        """Create or update trees (tree_id, task_id, status, simulations_done, best_reward)."""
        if not rows:
            return
        fixed = {"tree_id", "task_id", "stage", "created_at", "updated_at"}
        updates = sorted(set().union(*rows) - fixed)
        sets = ", ".join([f"{c} = excluded.{c}" for c in updates] + [f"updated_at = {_NOW}"])
        self._insert("trees", rows, f"ON CONFLICT (tree_id) DO UPDATE SET {sets}", stage=stage)

    def trees(self, stage: str | None = None) -> list[dict]:
        """Trees in id order; only those `stage` searched when given (e.g. one round's)."""
        where, params = ("WHERE stage = ?", [stage]) if stage else ("", [])
        return self._select("trees", f"SELECT * FROM trees {where} ORDER BY tree_id", params)

    def insert_nodes(self, rows: Sequence[dict]) -> None:
        """Bulk insert; ids come from make_node_id, so a duplicate is a bug and raises."""
        self._insert("nodes", rows)

    def update_nodes(self, rows: Sequence[dict]) -> None:
        """Bulk update of existing nodes: node_id plus the columns to set (visits, value_sum)."""
        if not rows:
            return
        with self._registered("nodes", rows) as cols, self.transaction():
            sets = ", ".join(f"{c} = u.{c}" for c in cols if c != "node_id")
            (n,) = self._sql(
                f"UPDATE nodes SET {sets} FROM _batch_nodes u WHERE nodes.node_id = u.node_id"
            )[0]
            if n != len(rows):
                raise ValueError(f"update_nodes: {len(rows) - n} of {len(rows)} node ids unknown")

    def load_tree(self, tree_id: int) -> list[dict]:
        """All nodes of a tree in id order (parents before children), snapshots included."""
        return self._select(
            "nodes", "SELECT * FROM nodes WHERE tree_id = ? ORDER BY node_id", [tree_id]
        )

    def pickled_snapshots(self) -> list[dict]:
        """node_id and pickled_snapshot of nodes whose env snapshot is still a pickle (stores
        made before schema v5). Unpickle only the user's own run's; see schema.V5."""
        return self._select(
            "nodes", "SELECT node_id, pickled_snapshot FROM nodes "
            "WHERE pickled_snapshot IS NOT NULL ORDER BY node_id"
        )

    # ---- trajectories and pairs ------------------------------------------------------------
    def insert_trajectories(self, rows: Sequence[dict], stage: str) -> None:
        self._insert("trajectories", rows, stage=stage)

    def trajectories(self, source: str | None = None, stage: str | None = None) -> list[dict]:
        """Episodes in id order, of one source and one stage when given."""
        where, params = _where(source=source, stage=stage)
        return self._select(
            "trajectories", f"SELECT * FROM trajectories {where} ORDER BY traj_id", params
        )

    def trajectory_tasks(self, source: str) -> set[str]:
        """Ids of tasks with at least one trajectory from `source` (what a resume can skip)."""
        rows = self._sql("SELECT DISTINCT task_id FROM trajectories WHERE source = ?", [source])
        return {r[0] for r in rows}

    def solved_tasks(self, source: str, stage: str | None = None) -> set[str]:
        """Ids of tasks with at least one successful trajectory from `source` (and `stage`)."""
        where, params = _where(source=source, stage=stage)
        rows = self._sql(f"SELECT DISTINCT task_id FROM trajectories {where} AND success",
                         params)
        return {r[0] for r in rows}

    def insert_pairs(self, rows: Sequence[dict], stage: str) -> None:
        self._insert("pairs", rows, stage=stage)

    def step_pairs(self, alpha: float, theta: float, min_visits: int, invalid_rejected: bool,
                   per_node: int, per_task: int, total: int, edges: Sequence[float],
                   seed: int, stage: str | None = None) -> tuple[list[dict], dict[str, int]]:
        """Step-level pairs of every stored tree (those `stage` searched, when given), mined
        and balanced in one SQL pass.

        The rules are offline_agent.mining.pairs.step_pairs (the oracle, in Python): sibling
        Q = alpha*Q_mcts + (1-alpha)*critic, pairs with Q_w - Q_l >= theta, then caps per node,
        per task and in all (0: none) taken round-robin over margin bins in a seeded md5 order.
        Returns the kept pairs (task, node, chosen, rejected order) and counts per stage.
        """
        bin_sql = " + ".join(f"(margin >= {float(e)!r})::INTEGER" for e in edges) or "0"
        p = {"alpha": alpha, "theta": theta, "min_visits": min_visits, "seed": str(seed),
             "invalid": invalid_rejected, "per_node": per_node, "per_task": per_task,
             "total": total or (1 << 62), "stage": stage}
        self._sql(f"""CREATE OR REPLACE TEMP TABLE _step_pairs AS
            WITH kids AS (
                SELECT n.node_id, n.parent_id, n.invalid, tk.task_id, tk.env,
                    n.terminal OR n.visits >= $min_visits AS counted,
                    CASE WHEN n.terminal THEN coalesce(n.reward, 0.0)
                         WHEN n.visits > 0 THEN n.value_sum / n.visits
                         ELSE coalesce(n.ending, 0.0) END AS q_mcts,
                    coalesce(n.critic_score,
                             1.0 / count(*) OVER (PARTITION BY n.parent_id)) AS q_critic
                FROM nodes n JOIN trees t USING (tree_id) JOIN tasks tk USING (task_id)
                WHERE n.parent_id IS NOT NULL AND ($stage IS NULL OR t.stage = $stage)),
            valued AS (
                SELECT *, $alpha * q_mcts + (1 - $alpha) * q_critic AS q FROM kids
                WHERE counted AND ($invalid OR NOT invalid)),
            cand AS (
                SELECT c.task_id, c.env, c.parent_id AS node_id, c.node_id AS chosen_id,
                    r.node_id AS rejected_id, c.q AS chosen_q, r.q AS rejected_q,
                    c.q - r.q AS margin,
                    md5(concat($seed, ':', c.node_id, ':', r.node_id)) AS key
                FROM valued c JOIN valued r
                    ON c.parent_id = r.parent_id AND c.node_id <> r.node_id
                WHERE NOT c.invalid AND c.q - r.q >= $theta),
            binned AS (
                SELECT *, {bin_sql} AS bin FROM cand),
            {_capped("by_node", "binned", "node_id", "$per_node")},
            {_capped("by_task", "by_node", "task_id", "$per_task")},
            all_ranked AS (
                SELECT *, row_number() OVER (PARTITION BY env, bin ORDER BY key) AS rank
                FROM by_task)
            SELECT *,
                row_number() OVER (ORDER BY rank, env, bin, key) <= $total AS kept,
                (SELECT count(*) FROM binned) AS n_candidates,
                (SELECT count(*) FROM by_node) AS n_after_node_cap
            FROM all_ranked""", p)
        rows = self._sql("SELECT task_id, env, node_id, chosen_id, rejected_id, chosen_q, "
                         "rejected_q, margin, bin FROM _step_pairs WHERE kept "
                         "ORDER BY task_id, node_id, chosen_id, rejected_id")
        names = ("task_id", "env", "node_id", "chosen_id", "rejected_id", "chosen_q",
                 "rejected_q", "margin", "bin")
        counts = self._sql("SELECT any_value(n_candidates), any_value(n_after_node_cap), "
                           "count(*), count(*) FILTER (kept) FROM _step_pairs")[0]
        self._sql("DROP TABLE _step_pairs")
        stats = dict(zip(("candidates", "after_node_cap", "after_task_cap", "kept"),
                         [c or 0 for c in counts]))
        return [dict(zip(names, r)) for r in rows], stats

    def step_pair_rows(self) -> list[dict]:
        """The node rows step mining reads, with their task and env (for the Python oracle)."""
        return self._select("nodes", """SELECT n.node_id, n.parent_id, n.visits, n.value_sum,
            n.critic_score, n.reward, n.ending, n.terminal, n.invalid, tk.task_id, tk.env
            FROM nodes n JOIN trees t USING (tree_id) JOIN tasks tk USING (task_id)
            ORDER BY n.node_id""")

    def tree_edges(self, tree_ids: Sequence[int]) -> list[dict]:
        """Nodes of the given trees without their snapshots: what message building needs."""
        if not tree_ids:
            return []
        return self._select("nodes", """SELECT node_id, tree_id, parent_id, depth, action,
            tool_call, observation, reward, terminal, invalid, info, token_ids FROM nodes
            WHERE tree_id IN (SELECT unnest($ids)) ORDER BY node_id""",
                            {"ids": [int(t) for t in tree_ids]})

    def pairs(self, kind: str | None = None, stage: str | None = None) -> list[dict]:
        """Mined pairs (kind "step" | "trajectory"; of one mine stage), all when None, id order."""
        where, params = _where(kind=kind, stage=stage)
        return self._select("pairs", f"SELECT * FROM pairs {where} ORDER BY pair_id", params)

    def insert_examples(self, rows: Sequence[dict], stage: str) -> None:
        self._insert("examples", rows, stage=stage)

    def examples(self, kinds: Sequence[str] = ("rft", "hindsight"),
                 stage: str | None = None) -> list[dict]:
        """SFT examples of the given kinds (rft: successes; hindsight: relabeled) written by
        `stage` (any when None), id order."""
        return self._select("examples", "SELECT * FROM examples WHERE kind IN "
                            "(SELECT unnest($kinds)) AND ($stage IS NULL OR stage = $stage) "
                            "ORDER BY example_id", {"kinds": list(kinds), "stage": stage})

    def counts(self) -> dict[str, int]:
        """Rows per table (meta excluded)."""
        return {
            t: self._sql(f"SELECT count(*) FROM {t}")[0][0]
            for t in self._columns
            if t != "meta"
        }

    # ---- training metrics ------------------------------------------------------------------
    def insert_metrics(self, rows: Sequence[dict], stage: str) -> None:
        """Per-step metrics (series, step, data); a step written again (a resumed run redoing
        steps past its checkpoint) replaces the old row."""
        self._insert("metrics", rows, "ON CONFLICT (stage, series, step) DO UPDATE SET "
                     "data = excluded.data", stage=stage)

    def metrics(self, stage: str, series: str | None = None) -> list[dict]:
        """Metric rows of `stage` (one series when given), by series then step."""
        where, params = ("AND series = ?", [stage, series]) if series else ("", [stage])
        return self._select("metrics", f"SELECT * FROM metrics WHERE stage = ? {where} "
                            "ORDER BY series, step", params)

    # ---- scale-out -------------------------------------------------------------------------
    def merge_from(self, shard_paths: Sequence[str | Path]) -> dict[str, int]:
        """Copy the rows of shard stores into this one, in one transaction; rows per table.

        Rows already present unchanged are skipped (merging a shard twice is harmless); a
        key present with different content raises MergeConflict, as do shards that ran a
        stage with different configs. A shard is read as data only: it must have exactly
        this schema (plain tables, no views or computed columns) and no pickled snapshots.
        """
        aliases = []
        try:
            for i, path in enumerate(shard_paths):
                path = Path(path)
                if not path.exists():
                    raise FileNotFoundError(f"no store at {path}")
                alias = f"shard{i}"
                try:
                    quoted = str(path).replace("'", "''")
                    self._sql(f"ATTACH '{quoted}' AS {alias} (READ_ONLY)")
                except duckdb.Error as e:
                    raise _open_error(e, path) from None
                aliases.append((alias, path))
                self._check_shard(alias, path)
            added = {t: 0 for t in self._columns if t != "meta"}
            with self.transaction():
                for alias, path in aliases:
                    for table in added:
                        added[table] += self._merge_table(alias, path, table)
                mixed = self._sql(
                    "SELECT stage FROM stages GROUP BY stage HAVING count(DISTINCT config_hash) > 1"
                )
                if mixed:
                    raise MergeConflict(
                        f"shards ran stage(s) {', '.join(repr(s) for (s,) in mixed)} with "
                        "different configs (their config hashes differ); merge shards of one "
                        "run config only"
                    )
            return added
        finally:
            for alias, _ in aliases:
                self._sql(f"DETACH {alias}")

    def _check_shard(self, alias: str, path: Path) -> None:
        """Refuse a shard that is not plain data of this schema, or still holds pickles."""
        try:
            (version,) = self._sql(
                f"SELECT value FROM {alias}.meta WHERE key = 'schema_version'"
            )[0]
            version = int(version)
        except (duckdb.Error, IndexError, ValueError):
            raise StoreError(f"{path} is not an offline-agent store") from None
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{path} has schema version {version}, this offline-agent merges "
                f"{SCHEMA_VERSION}. On the machine that made it, open it as a run once "
                f"(`offline-agent run {path.parent / 'config.yaml'} --run-dir {path.parent} "
                "--until search`), which migrates it and turns any pickled env snapshots into "
                "JSON data; merge never loads pickles: they can run code"
            )
        found: dict[str, dict[str, str]] = {}
        for table, kind, column, dtype, generated in self._sql(
            "SELECT t.table_name, t.table_type, c.column_name, c.data_type, c.is_generated "
            "FROM information_schema.tables t JOIN information_schema.columns c "
            "USING (table_catalog, table_schema, table_name) "
            "WHERE t.table_catalog = ? AND t.table_schema = 'main'", [alias]
        ):
            ok = kind == "BASE TABLE" and generated == "NEVER"
            found.setdefault(table, {})[column] = dtype if ok else f"{kind} {generated}"
        for table, columns in self._columns.items():
            if found.get(table) != columns:
                raise StoreError(f"{path}: table {table!r} is not as this offline-agent writes "
                                 "it (missing, a view, or other columns); merge takes only "
                                 "plain offline-agent tables")
        (pickled,) = self._sql(
            f"SELECT count(*) FROM {alias}.nodes WHERE pickled_snapshot IS NOT NULL"
        )[0]
        if pickled:
            raise StoreError(
                f"{path} holds {pickled} pickled env snapshots (written before schema v5), "
                "and merge never loads pickles: they can run code. On the machine that made "
                f"it, open it as a run once (`offline-agent run {path.parent / 'config.yaml'} "
                f"--run-dir {path.parent} --until search`) to turn them into JSON data"
            )

    def _merge_table(self, alias: str, path: Path, table: str) -> int:
        cols, keys = self._columns[table], self._keys[table]
        compared = [c for c, t in cols.items() if c not in keys and t != "TIMESTAMP"]
        on = " AND ".join(f"s.{k} = m.{k}" for k in keys)
        differs = " OR ".join(f"s.{c} IS DISTINCT FROM m.{c}" for c in compared) or "false"
        clashes = self._sql(
            f"SELECT {', '.join('s.' + k for k in keys)} FROM {alias}.{table} s "
            f"JOIN {table} m ON {on} WHERE {differs} LIMIT 1"
        )
        if clashes:
            key = ", ".join(f"{k}={v!r}" for k, v in zip(keys, clashes[0]))
            raise MergeConflict(
                f"{path}: {table} row ({key}) differs from a row with the same key in an "
                "earlier shard; shards must cover disjoint tasks (distinct search.shard i/n)"
            )
        names = ", ".join(cols)
        (n,) = self._sql(
            f"INSERT OR IGNORE INTO {table} ({names}) SELECT {names} FROM {alias}.{table}"
        )[0]
        return n

    # ---- evaluation ------------------------------------------------------------------------
    def insert_eval_episodes(self, rows: Sequence[dict], stage: str) -> None:
        """Episodes keyed by (policy, mode, task_id): a second row for one key raises."""
        self._insert("eval_episodes", rows, stage=stage)

    def eval_episodes(self, policy: str | None = None, mode: str | None = None) -> list[dict]:
        """Evaluation episodes ordered by policy, mode and task (all when filters are None)."""
        where = [(c, v) for c, v in (("policy", policy), ("mode", mode)) if v is not None]
        sql = " AND ".join(f"{c} = ?" for c, _ in where)
        return self._select(
            "eval_episodes",
            f"SELECT * FROM eval_episodes {'WHERE ' + sql if where else ''} "
            "ORDER BY policy, mode, task_id",
            [v for _, v in where],
        )

    def eval_tasks(self, policy: str, mode: str) -> set[str]:
        """Ids of tasks `policy` has finished in `mode` (what a resumed evaluation skips)."""
        rows = self._sql("SELECT task_id FROM eval_episodes WHERE policy = ? AND mode = ?",
                         [policy, mode])
        return {r[0] for r in rows}

    def final_checkpoints(self, stage: str) -> dict[str, Any]:
        """{name: value} of `stage`'s checkpoints keyed '<name>/final' (a trained policy's
        finished adapter), oldest first: the order the stage finished them."""
        rows = self._select(
            "checkpoints",
            "SELECT key, value FROM checkpoints WHERE stage = ? AND key LIKE '%/final' "
            "ORDER BY updated_at, key",
            [stage],
        )
        return {r["key"].removesuffix("/final"): r["value"] for r in rows}

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
