"""A store written by the code before the storage rework (commit 572c828, schema version 6)
opens, resumes and re-mines identically with this code.

tests/fixtures/store-572c828/ holds a run directory 572c828 wrote (its README says how): the
demo's 8 MiniShop tasks through tasks, baseline, search and mine, with its config.yaml and
store.duckdb (gzipped). Its mine.alpha is 1, where the old and the current value of a terminal
child agree, so what this test checks is that the new code reads an old store as the old code
did; the change of definition itself is tested in tests/test_mining.py.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from offline_agent.mining.config import MineConfig
from offline_agent.mining.pairs import step_pairs, step_params
from pipelines.cli import main
from storage import SCHEMA_VERSION, Store, select_step_pairs, step_pair_inputs

FIXTURE = Path(__file__).parent / "fixtures" / "store-572c828"


def unpack(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with gzip.open(FIXTURE / "store.duckdb.gz") as f:
        (run_dir / "store.duckdb").write_bytes(f.read())
    shutil.copy(FIXTURE / "config.yaml", run_dir / "config.yaml")
    return run_dir


def stored(store: Store) -> dict:
    """Everything the run stored but stage bookkeeping, as rows."""
    trees = store.trees()
    return {"tasks": store.tasks(), "trees": trees,
            "nodes": [n for t in trees for n in store.load_tree(t.tree_id)],
            "trajectories": store.trajectories(), "pairs": store.pairs(),
            "examples": store.examples(), "mine": store.stage("mine").stats}


def test_a_store_from_572c828_opens_resumes_and_remines_identically(tmp_path, capsys):
    run_dir = unpack(tmp_path)
    run = ["run", str(run_dir / "config.yaml"), "--run-dir", str(run_dir), "--until", "mine"]
    assert main(run) == 0  # opens (migrates) and resumes: every stage is done already
    out = capsys.readouterr().out
    # but stage critic, added after that store (issue 23): a no-op under search.critic logprob
    assert out.count("already done") == 4 and out.count(": running") == 1, out
    assert "stage critic: running" in out and "skipped: search.critic is not learned" in out, out
    with Store(run_dir / "store.duckdb") as s:
        assert s.schema_version == SCHEMA_VERSION
        before = stored(s)
        assert before["pairs"] and before["examples"] and before["nodes"]
        s.clear_stage("mine")

    assert main(run) == 0  # re-mine with this code
    assert "stage mine: running" in capsys.readouterr().out
    with Store(run_dir / "store.duckdb") as s:
        assert stored(s) == before
        # at the default alpha (critic scores count) the SQL pass and the oracle agree on it
        params = step_params(MineConfig())
        assert select_step_pairs(s, params)[0] == step_pairs(*step_pair_inputs(s), params)
