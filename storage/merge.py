"""Merge of shard stores into one, and the checks that read a shard as data only.

A shard is another machine's store: it is attached read-only and must be plain offline-agent
tables of exactly this schema version (no views, no computed columns), so merging it runs no
SQL of its own. Rows already present unchanged are skipped (merging a shard twice is
harmless); a key present with different content raises MergeConflict, as do shards that ran
a stage with different configs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import duckdb

from storage.schema import SCHEMA_VERSION
from storage.store import Store, StoreError, _open_error, _where


class MergeConflict(StoreError):
    """Two shards hold different rows under one key."""


def merge_shards(store: Store, shard_paths: Sequence[str | Path]) -> dict[str, int]:
    """Copy the rows of shard stores into `store`, in one transaction; rows added per table."""
    aliases = []
    try:
        for i, path in enumerate(shard_paths):
            path = Path(path)
            if not path.exists():
                raise FileNotFoundError(f"no store at {path}")
            alias = f"shard{i}"
            try:
                quoted = str(path).replace("'", "''")
                store._sql(f"ATTACH '{quoted}' AS {alias} (READ_ONLY)")
            except duckdb.Error as e:
                raise _open_error(e, path) from None
            aliases.append((alias, path))
            check_shard(store, alias, path)
        added = {t: 0 for t in store._columns if t != "meta"}
        with store.transaction():
            for alias, path in aliases:
                for table in added:
                    added[table] += _merge_table(store, alias, path, table)
            mixed = store._sql(
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
            store._sql(f"DETACH {alias}")


def check_shard(store: Store, alias: str, path: Path) -> None:
    """Refuse an attached shard that is not plain data of this store's schema."""
    clause, params = _where(key="schema_version")
    try:
        (version,) = store._sql(f"SELECT value FROM {alias}.meta {clause}", params)[0]
        version = int(version)
    except (duckdb.Error, IndexError, ValueError):
        raise StoreError(f"{path} is not an offline-agent store") from None
    if version != SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, this offline-agent merges "
            f"{SCHEMA_VERSION}. On the machine that made it, open it as a run once "
            f"(`offline-agent run {path.parent / 'config.yaml'} --run-dir {path.parent} "
            "--until search`), which migrates it; merge reads shards of its own schema only"
        )
    found: dict[str, dict[str, str]] = {}
    clause, params = _where(table_catalog=alias, table_schema="main")
    for table, kind, column, dtype, generated in store._sql(
        "SELECT table_name, t.table_type, c.column_name, c.data_type, c.is_generated "
        "FROM information_schema.tables t JOIN information_schema.columns c "
        f"USING (table_catalog, table_schema, table_name) {clause}", params
    ):
        ok = kind == "BASE TABLE" and generated == "NEVER"
        found.setdefault(table, {})[column] = dtype if ok else f"{kind} {generated}"
    for table, columns in store._columns.items():
        if found.get(table) != columns:
            raise StoreError(f"{path}: table {table!r} is not as this offline-agent writes "
                             "it (missing, a view, or other columns); merge takes only "
                             "plain offline-agent tables")


def _merge_table(store: Store, alias: str, path: Path, table: str) -> int:
    cols, keys = store._columns[table], store._keys[table]
    compared = [c for c, t in cols.items() if c not in keys and t != "TIMESTAMP"]
    on = " AND ".join(f"s.{k} = m.{k}" for k in keys)
    differs = " OR ".join(f"s.{c} IS DISTINCT FROM m.{c}" for c in compared) or "false"
    clashes = store._sql(
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
    (n,) = store._sql(
        f"INSERT OR IGNORE INTO {table} ({names}) SELECT {names} FROM {alias}.{table}"
    )[0]
    return n
