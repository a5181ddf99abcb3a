"""CLI: run/status/merge, user mistakes as one-line errors with exit code 2."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from pipelines.cli import _progress_text, main
from pipelines.progress import Progress
from storage import NodeVisits, Store, make_node_id

CONFIG = """\
run: {{name: fake}}
model: {{id: {model}, device: cpu}}
env:
  name: tests.fakes:FakeEnv
  kwargs: {{max_steps: 2}}
  train_tasks: 4
  test_tasks: 2
search: {{simulations: 2, k: 2, max_depth: 2, trees_per_batch: 4}}
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory, tiny_model_dir) -> str:
    """The whole pipeline, for real, on a tiny random model and a fake env."""
    path = tmp_path_factory.mktemp("cli-config") / "fake.yaml"
    path.write_text(CONFIG.format(model=tiny_model_dir))
    return str(path)


@pytest.fixture(scope="module")
def finished(tmp_path_factory, config) -> tuple[Path, str]:
    """One whole run, made once for this module (tests read it or copy it); its stdout."""
    run_dir = tmp_path_factory.mktemp("cli-finished") / "r"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", config, "--run-dir", str(run_dir)]) == 0
    return run_dir, out.getvalue()


@pytest.fixture
def run_dir(tmp_path, finished) -> Path:
    """A private copy of the finished run, for a test that runs or locks it."""
    return Path(shutil.copytree(finished[0], tmp_path / "r"))


def test_run_twice_second_does_nothing(finished, run_dir, config, capsys):
    first = finished[1]
    assert "stage tasks: done" in first and first.rstrip().endswith(f"run directory: {finished[0]}")
    assert main(["run", config, "--run-dir", str(run_dir)]) == 0
    second = capsys.readouterr().out
    assert "stage tasks: already done" in second and "running" not in second
    assert (run_dir / "config.yaml").exists() and (run_dir / "store.duckdb").exists()


def test_default_run_dir(tmp_path, config, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", config, "--until", "tasks"]) == 0
    (made,) = (tmp_path / "runs").iterdir()
    assert made.name.startswith("fake-")
    assert f"run directory: {Path('runs') / made.name}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--set", "search.simulatons=3"], "unknown config key 'search.simulatons'"),
        (["--set", "env.train_tasks=lots"], "config key 'env.train_tasks' must be int"),
        (["--until", "nope"], "unknown stage 'nope'"),
    ],
)
def test_user_mistakes_exit_2_without_traceback(tmp_path, config, capsys, extra, message):
    assert main(["run", config, "--run-dir", str(tmp_path / "r"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("offline-agent: error:") and message in err
    assert "Traceback" not in err


def test_changed_config_needs_force(tmp_path, run_dir, config, capsys):
    run_dir = str(run_dir)
    assert main(["run", config, "--run-dir", run_dir, "--set", "env.train_tasks=5"]) == 2
    assert "env.train_tasks: 4 -> 5" in capsys.readouterr().err
    assert main(["run", config, "--run-dir", run_dir, "--set", "env.train_tasks=5",
                 "--force", "--until", "tasks"]) == 0
    with Store(Path(run_dir) / "store.duckdb", read_only=True) as s:
        assert len(s.tasks("train")) == 5 and s.stage("search") is None  # cleared by --force
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # argparse: exclusive options
        main(["run", config, "--until", "tasks", "--only", "tasks"])
    assert e.value.code == 2


def test_status_reads_store(tmp_path, finished, capsys):
    assert main(["status", str(finished[0])]) == 0
    out = capsys.readouterr().out
    assert "tasks" in out and "done" in out and "rows: tasks 6, trees 4" in out
    assert "trajectories 12" in out  # 4 greedy episodes + 4 trees x 2 simulations
    with Store(finished[0] / "store.duckdb", read_only=True) as store:
        measured = store.stage("search", "0/1").stats["critic_concordance"]["overall"]["n"]
    # one line per stage: no stats dict, no concordance block where no pair was measured
    assert "'critic_concordance'" not in out and "{'" not in out
    assert ("critic concordance " in out) == bool(measured)
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_status_into_a_closed_pipe_ends_quietly(finished):
    """`offline-agent status RUN | head -1`: the reader left early; no traceback, 141 as the
    shell reports SIGPIPE."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    with os.fdopen(write, "wb") as stdout:
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", "status",
                               str(finished[0])], stdout=stdout, stderr=subprocess.PIPE,
                              text=True, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_status_falls_back_to_progress_while_running(run_dir, capsys):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from pipelines.progress import Progress
            from storage import Store
            store = Store({str(run_dir / "store.duckdb")!r})
            p = Progress({str(run_dir)!r})
            p.start("search", "0/1")
            p.update(trees_done=3, simulations=24)
            print("ready", flush=True)
            sys.stdin.read()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "ready"
        capsys.readouterr()
        assert main(["status", str(run_dir)]) == 0
        out = capsys.readouterr().out
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert f"locked by PID {holder.pid}" in out and "progress.json" in out
    assert "stage search [shard 0/1]: running for 0m  trees_done=3 simulations=24" in out


@pytest.mark.parametrize("started, status, says", [
    (timedelta(minutes=75), "running", "stage grpo: running for 1h 15m  step=5"),
    (timedelta(minutes=9), "running", "stage grpo: running for 9m  step=5"),
    (timedelta(minutes=75), "done", "stage grpo: done  step=5"),
    ("yesterday", "running", "stage grpo: running  step=5"),  # unreadable: no time said
    (None, "running", "stage grpo: running  step=5"),  # written before started_at existed
])
def test_progress_says_how_long_the_running_stage_has_taken(tmp_path, started, status, says):
    p = Progress(tmp_path)
    p.start("grpo", "")
    p.update(step=5)
    p.status(status)
    state = json.loads((tmp_path / "progress.json").read_text())
    state["started_at"] = ((datetime.now().astimezone() - started).isoformat()
                           if isinstance(started, timedelta) else started)
    (tmp_path / "progress.json").write_text(json.dumps(state))
    assert says in _progress_text(tmp_path)


def test_status_of_a_locked_store_shows_the_stages_done_as_the_unlocked_one_does(run_dir,
                                                                                  capsys):
    """A run holding the store still lets `status` show every stage finished so far (from
    progress.json), line for line as `status` shows them once the store is free."""
    assert main(["status", str(run_dir)]) == 0
    free = capsys.readouterr().out.splitlines()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            from storage import Store
            store = Store({str(run_dir / "store.duckdb")!r})
            print("ready", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        assert main(["status", str(run_dir)]) == 0
        locked = capsys.readouterr().out.splitlines()
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    done = [line for line in free if line.split()[1:2] == ["done"]]
    assert len(done) >= 5 and any("train" in line for line in done)
    assert sorted(line for line in locked if line.split()[1:2] == ["done"]) == sorted(done)


def shard_run(tmp_path, config, i: int) -> Path:
    run_dir = tmp_path / f"shard{i}"
    assert main(["run", config, "--run-dir", str(run_dir), "--set", f"search.shard={i}/2"]) == 0
    return run_dir


def tree_rows(run_dir: Path) -> tuple[dict, dict]:
    with Store(run_dir / "store.duckdb", read_only=True) as s:
        nodes = {n.node_id: (n.action, n.visits, n.value_sum)
                 for t in s.trees() for n in s.load_tree(t.tree_id)}
        return s.counts(), nodes


def test_merge_of_shards_equals_unsharded_run(tmp_path, config, finished, capsys):
    a, b = shard_run(tmp_path, config, 0), shard_run(tmp_path, config, 1)
    # stages that need every shard's trees wait for the merge
    assert "stage mine: needs every shard's results; skipped" in capsys.readouterr().out
    with Store(a / "store.duckdb", read_only=True) as s:
        assert s.stage("mine") is None and s.stage("search", "0/2").status == "done"
    out = tmp_path / "merged"
    assert main(["merge", str(out), str(a), str(b)]) == 0
    assert "trees 4" in capsys.readouterr().out
    whole = finished[0]
    merged_counts, merged_nodes = tree_rows(out)
    whole_counts, whole_nodes = tree_rows(whole)
    for table in ("tasks", "trees", "nodes", "trajectories"):
        assert merged_counts[table] == whole_counts[table], table
    assert merged_nodes == whole_nodes  # per-prompt seeds: sharding changes no sample
    # the merged run continues without redoing any search
    capsys.readouterr()
    assert main(["run", config, "--run-dir", str(out)]) == 0
    assert tree_rows(out)[0]["trajectories"] == whole_counts["trajectories"]

    assert main(["merge", str(out), str(a)]) == 2  # never overwrite
    assert "exists" in capsys.readouterr().err
    c = tmp_path / "c"
    shutil.copytree(b, c)
    with Store(c / "store.duckdb") as s:
        (root,) = [n for n in s.load_tree(1) if n.node_id == make_node_id(1, 0)]
        s.update_visits([NodeVisits(root.node_id, 99, root.value_sum, root.realized_sum)])
    assert main(["merge", str(tmp_path / "m2"), str(a), str(b), str(c)]) == 2
    err = capsys.readouterr().err
    assert "nodes row" in err and "Traceback" not in err
    assert not (tmp_path / "m2" / "store.duckdb").exists()


def test_console_script_help():
    exe = Path(sys.executable).with_name("offline-agent")
    out = subprocess.run([str(exe), "run", "--help"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0
    assert "--until STAGE" in out.stdout and "search.simulations = " in out.stdout


def test_tree_view_html_and_graphml(tmp_path, run_dir, capsys):
    import networkx as nx

    with Store(run_dir / "store.duckdb", read_only=True) as s:
        task_id = s.trees()[0].task_id
        n_nodes = len(s.load_tree(0))
    assert main(["tree", str(run_dir), "--task", task_id]) == 0
    page = (run_dir / "trees" / f"{task_id}.html").read_text()
    assert page.count("<circle") == n_nodes and "const DATA" in page and "http" not in page
    out = tmp_path / "t.graphml"
    assert main(["tree", str(run_dir), "--task", task_id, "--format", "graphml", "--out", str(out)]) == 0
    g = nx.read_graphml(out)
    assert g.number_of_nodes() == n_nodes and g.number_of_edges() == n_nodes - 1
    root = next(n for n in g if g.in_degree(n) == 0)
    assert g.nodes[root]["visits"] == 2  # the config's simulations
    assert all(-1.0 <= g.nodes[n]["ending"] <= 1.0 for n in g)  # -1: no ending one step on
    assert main(["tree", str(run_dir), "--task", "nope"]) == 2
    assert "no search tree for task 'nope'" in capsys.readouterr().err
