"""CLI and store errors are one clear line, never a traceback, and change nothing they were not
asked to: files that are not stores, another program's DuckDB file, a broken progress.json,
`tree` output paths, and a failed merge. Stores are made with the Store API (no model)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from offline_agent.types import Task
from pipelines.cli import main
from pipelines.progress import Progress, ProgressError, read_progress
from storage import Store, TreeRow
from tests.rows import node_row

CONFIG = "env: {name: tests.fakes:FakeEnv, train_tasks: 2, test_tasks: 1}\n"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("offline-agent: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for word in words:
        assert word in err, err
    return err


def run_dir_with_tree(tmp_path: Path, task_id: str = "t-train-0") -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with Store(run_dir / "store.duckdb") as s:
        s.insert_tasks([Task(task_id, "fake", "do it")], stage="tasks")
        s.upsert_trees([TreeRow(0, task_id, "done", simulations_done=1, best_reward=1.0)],
                       stage="search")
        s.insert_nodes([node_row(0, 0, observation="start", visits=1,
                                 snapshot={"state": None})])
    return run_dir


@pytest.mark.parametrize("content", [os.urandom(4096), b""], ids=["random-bytes", "empty"])
def test_a_store_that_is_not_duckdb_is_refused_unchanged(tmp_path, capsys, content):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    store = run_dir / "store.duckdb"
    store.write_bytes(content)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    for argv in (["status", str(run_dir)], ["run", str(config), "--run-dir", str(run_dir)],
                 ["tree", str(run_dir), "--task", "x"]):
        assert main(argv) == 2
        one_line_error(capsys, str(store), "not an offline-agent store", "not a DuckDB database")
    assert store.read_bytes() == content
    assert sorted(p.name for p in run_dir.iterdir()) == ["store.duckdb"]  # no config.yaml


def test_another_programs_duckdb_file_is_refused_unchanged(tmp_path, capsys):
    run_dir = tmp_path / "theirs"
    run_dir.mkdir()
    store = run_dir / "store.duckdb"
    con = duckdb.connect(str(store))
    con.execute("CREATE TABLE people (name VARCHAR)")
    con.execute("INSERT INTO people VALUES ('ada')")
    con.close()
    (run_dir / "config.yaml").write_text("their: config\n")
    before = digest(store)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)

    assert main(["run", str(config), "--run-dir", str(run_dir)]) == 2
    one_line_error(capsys, "not an offline-agent store", "another program", "people")
    assert main(["status", str(run_dir)]) == 2
    err = one_line_error(capsys, "not an offline-agent store")
    assert "migrat" not in err
    assert digest(store) == before
    assert (run_dir / "config.yaml").read_text() == "their: config\n"
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.yaml", "store.duckdb"]


def test_empty_duckdb_database_is_not_a_store_to_read(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    duckdb.connect(str(run_dir / "store.duckdb")).close()
    assert main(["status", str(run_dir)]) == 2
    one_line_error(capsys, "not an offline-agent store", "empty DuckDB database")


@pytest.mark.parametrize("text, says", [
    ('{"stage": "search", "status": "runn', "truncated or half-written"),
    ("", "truncated or half-written"),
    ('{"stage": "search"}', "missing or wrong: status, pid, updated_at, counters"),
    ("[1, 2]", "not an offline-agent progress file"),
    ('{"stage": "s", "status": "r", "pid": 1, "counters": {}, "updated_at": "yesterday"}',
     "unreadable updated_at"),
])
def test_broken_progress_file_is_named(tmp_path, text, says):
    (tmp_path / "progress.json").write_text(text)
    with pytest.raises(ProgressError, match=says):
        read_progress(tmp_path)


@pytest.mark.parametrize("found, seconds", [
    ({"stage": "search", "shard": "0/1", "status": "running"}, 90.0),  # the killed attempt
    ({"stage": "search", "shard": "1/2", "status": "running"}, 0.0),  # another shard's
    ({"stage": "train", "shard": "0/1", "status": "running"}, 0.0),
    ({"stage": "search", "shard": "0/1", "status": "failed"}, 0.0),  # the store has its end
    ({"stage": "search", "shard": "0/1", "status": "running", "started_at": "soon"}, 0.0),
    ({"stage": "search", "shard": "0/1", "status": "running", "started_at": None}, 0.0),
    ({"stage": "search", "shard": "0/1", "status": "running",
      "started_at": "2026-01-01T10:00:00"}, 0.0),  # without a zone: not comparable
])
def test_a_killed_attempts_seconds_come_from_the_progress_file_only_when_it_is_about_it(
        tmp_path, found, seconds):
    """What the run found in progress.json: a killed attempt ran from its start to its last
    write; a file about anything else, or with a start in another form, counts nothing."""
    state = {"started_at": "2026-01-01T10:00:00+00:00", **found,
             "updated_at": "2026-01-01T10:01:30+00:00", "pid": 1, "counters": {}}
    (tmp_path / "progress.json").write_text(json.dumps(state))
    assert Progress(tmp_path).killed_seconds("search", "0/1") == seconds


def test_a_broken_progress_file_counts_no_earlier_seconds(tmp_path):
    (tmp_path / "progress.json").write_text('{"stage": "search", "sta')
    assert Progress(tmp_path).killed_seconds("search", "") == 0.0


def test_status_says_progress_json_is_truncated_while_a_run_holds_the_store(tmp_path, capsys):
    run_dir = run_dir_with_tree(tmp_path)
    Progress(run_dir).start("search", "0/1")
    full = (run_dir / "progress.json").read_text()
    (run_dir / "progress.json").write_text(full[: len(full) // 2])
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from storage import Store
            store = Store({str(run_dir / "store.duckdb")!r})
            print("ready", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert main(["status", str(run_dir)]) == 0
        captured = capsys.readouterr()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert f"locked by PID {holder.pid}" in captured.out
    assert "progress.json is truncated or half-written" in captured.out
    assert "Traceback" not in captured.err


def test_tree_writes_only_inside_run_dir_trees(tmp_path, capsys):
    run_dir = run_dir_with_tree(tmp_path, task_id="../../x")
    before = set(tmp_path.rglob("*"))
    assert main(["tree", str(run_dir), "--task", "../../x"]) == 0
    capsys.readouterr()
    (written,) = set(tmp_path.rglob("*")) - before - {run_dir / "trees"}
    assert written.parent == run_dir / "trees" and written.suffix == ".html"
    assert "circle" in written.read_text()


def test_tree_out_that_is_a_directory_is_refused(tmp_path, capsys):
    run_dir = run_dir_with_tree(tmp_path)
    target = tmp_path / "pictures"
    target.mkdir()
    assert main(["tree", str(run_dir), "--task", "t-train-0", "--out", str(target)]) == 2
    one_line_error(capsys, f"--out {target} is a directory", str(target / "t-train-0.html"))
    assert list(target.iterdir()) == []
    assert not (run_dir / "trees").exists()


@pytest.mark.parametrize("out", ["merged", "new/deeper/merged"])
def test_failed_merge_leaves_no_output_directory(tmp_path, capsys, out):
    good = run_dir_with_tree(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "store.duckdb").write_bytes(os.urandom(2048))
    assert main(["merge", str(tmp_path / out), str(good), str(bad)]) == 2
    one_line_error(capsys, "not an offline-agent store")
    assert not (tmp_path / out.split("/")[0]).exists()


def test_failed_merge_into_an_existing_directory_keeps_it_and_its_files(tmp_path, capsys):
    good = run_dir_with_tree(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    assert main(["merge", str(out), str(good), str(tmp_path / "nowhere")]) == 2
    one_line_error(capsys, "no store at")
    (bad := tmp_path / "bad").mkdir()
    duckdb.connect(str(bad / "store.duckdb")).execute("CREATE TABLE t (x INT)").close()
    assert main(["merge", str(out), str(good), str(bad)]) == 2
    one_line_error(capsys, "not an offline-agent store")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
