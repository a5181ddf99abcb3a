"""A run directory is private to its owner: its store holds tasks, hidden tests and
trajectories that no other user (nor sandboxed code run as another uid) may read."""

from __future__ import annotations

import os

from pipelines.runner import run
from tests.fakes import fake_cfg
from tests.test_runner import TASKS_ONLY


def test_run_dir_is_created_mode_0700(tmp_path):
    old = os.umask(0)  # even with a permissive umask
    try:
        run(fake_cfg(), tmp_path / "runs" / "r1", TASKS_ONLY)
    finally:
        os.umask(old)
    assert (tmp_path / "runs" / "r1").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "runs" / "r1" / "store.duckdb").exists()
