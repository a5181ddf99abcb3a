"""RUN_DIR/progress.json: live status for readers that cannot open the store.

While a run writes, DuckDB's file lock keeps every other process out of store.duckdb, even
read-only. So the runner also writes this small file, replaced atomically (write a temp
file, then os.replace) so a reader never sees half of it. Call `update` per batch, not per
row: each call is one small file write.
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any

FILENAME = "progress.json"


class Progress:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / FILENAME
        self.state: dict[str, Any] = {"stage": None, "shard": "", "status": "starting",
                                      "counters": {}}
        try:  # what the run before this one last wrote: a killed run's stage and its times
            self.found = read_progress(run_dir)
        except ProgressError:
            self.found = None

    def killed_seconds(self, stage: str, shard: str) -> float:
        """How long the attempt at `stage` (and `shard`) that the file this run found shows
        still running had run when its process last wrote: the time spent by an attempt that
        was killed, which the store cannot know (it never saw the attempt end). 0 when that
        file is about anything else."""
        found = self.found or {}
        if (found.get("stage"), found.get("shard", ""), found.get("status")) != (
                stage, shard, "running"):
            return 0.0
        try:
            ran = datetime.fromisoformat(found["updated_at"]) - datetime.fromisoformat(
                found["started_at"])
        except (KeyError, TypeError, ValueError):  # no start, or one of another form
            return 0.0
        return max(ran.total_seconds(), 0.0)

    def start(self, stage: str, shard: str) -> None:
        """A stage begins: counters reset, and its start kept so `status` can say how long
        this attempt has been running."""
        self.state.update(stage=stage, shard=shard, status="running", counters={},
                          started_at=datetime.now().astimezone().isoformat())
        self._write()

    def update(self, **counters: Any) -> None:
        """Merge counters (e.g. trees_done=3, simulations=24) into the current stage's."""
        self.state["counters"].update(counters)
        self._write()

    def stages_done(self, lines: list[dict]) -> None:
        """The stages stored as done ({"stage", "shard", "seconds", "headline"} each), so
        `offline-agent status` shows the run's results so far while the store is locked."""
        self.state["done"] = lines
        self._write()

    def status(self, status: str) -> None:
        """done | failed | finished (the whole run) | interrupted."""
        self.state["status"] = status
        self._write()

    def _write(self) -> None:
        self.state.update(pid=os.getpid(), updated_at=datetime.now().astimezone().isoformat())
        tmp = self.path.with_name(f".{FILENAME}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.state, indent=1, default=str))
        os.replace(tmp, self.path)


class ProgressError(ValueError):
    """A progress.json that cannot be read as one: truncated, half-written or not ours."""


REQUIRED = {"stage": (str, type(None)), "status": str, "pid": int, "updated_at": str,
            "counters": dict}


def read_progress(run_dir: str | Path) -> dict | None:
    """The last progress written to `run_dir`, or None when there is none."""
    path = Path(run_dir) / FILENAME
    if not path.exists():
        return None
    try:
        state = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProgressError(f"{path} is truncated or half-written ({e})") from None
    bad = [k for k, kind in REQUIRED.items()
           if not isinstance(state, dict) or not isinstance(state.get(k), kind)]
    if bad:
        raise ProgressError(f"{path} is incomplete or not an offline-agent progress file "
                            f"(missing or wrong: {', '.join(bad)})")
    try:
        aware = datetime.fromisoformat(state["updated_at"]).tzinfo is not None
    except ValueError:
        aware = False
    if not aware:
        raise ProgressError(f"{path} has an unreadable updated_at: {state['updated_at']!r}")
    if not isinstance(state.setdefault("done", []), list):  # absent: written before it existed
        raise ProgressError(f"{path} has a 'done' that is not a list of stages")
    return state
