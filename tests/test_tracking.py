"""run.report_to: a tiny run logs every stage's stats and every optimizer step to trackio's local
store, W&B offline and TensorBoard, read back with each tracker's own reader; a resumed run
appends to the same tracker run; a missing tracker stops the run before its first stage."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.config import RunConfig
from pipelines.errors import RunError
from pipelines.runner import renamed, run
from pipelines.stages import STAGES
from pipelines.tracking import scalars
from storage import Store
from tests.test_extras import hide
from tests.test_train_stage import config, make_run

ROOT = Path(__file__).parents[1]
RUN = ("import json, sys\nfrom pipelines.config import RunConfig\n"
       "from pipelines.runner import run\nfrom pipelines.stages import STAGES\n"
       "run(RunConfig.from_dict(json.loads(sys.argv[1])), sys.argv[2], "
       "[s for s in STAGES if s.name in sys.argv[3].split(',')])\n")
# trackio's own reader, in a process whose TRACKIO_DIR is the test's (trackio reads it on import)
READ_TRACKIO = ("import json, sys\nfrom trackio.sqlite_storage import SQLiteStorage as S\n"
                "project = sys.argv[1]\n(name,) = S.get_runs(project)\n"
                "print(json.dumps({'name': name, 'logs': S.get_logs(project, name), "
                "'config': S.get_run_config(project, name)}, default=str))\n")


def offline_env(tmp_path: Path) -> dict:
    """No network and nothing outside tmp_path: trackio local, W&B offline."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "TRACKIO_DIR": str(tmp_path / "trackio"),
            "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
            "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
            "WANDB_CACHE_DIR": str(tmp_path / "wandb-cache"),
            "WANDB_DATA_DIR": str(tmp_path / "wandb-data")}


def python(env: dict, script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def wandb_records(path: Path):
    """The protobuf records of a .wandb file (W&B's LevelDB-style log: 32 KiB blocks, each
    record chunk a 7-byte header: crc32, length, type; types 1 full, 2 first, 3 middle,
    4 last), after the file's own 7-byte header."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def wandb_history(run_dir: Path) -> tuple[set[str], list[dict], dict]:
    """(the run ids, every logged row, the config) of a run directory's offline W&B runs."""
    ids, rows, config = set(), [], {}
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
            elif kind == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                             for i in record.history.item})
    return ids, rows, config


def series(rows: list[dict], key: str, axis: str) -> dict[int, float]:
    return {row[axis]: row[key] for row in rows if key in row}


def test_a_resumed_run_appends_to_the_same_tracker_runs_which_read_back_every_series(
        tiny_model_dir, tmp_path):
    run_dir, env = tmp_path / "r", offline_env(tmp_path)
    make_run(run_dir)
    settings = {**config(tiny_model_dir, max_steps=2, batch_size=2, policies=["dpo_step"]),
                "run": {"name": "tiny", "report_to": ["trackio", "wandb", "tensorboard"]},
                "env": {"train_tasks": 2, "test_tasks": 1}}
    python(env, RUN, json.dumps(settings), str(run_dir), "tasks")
    out = python(env, RUN, json.dumps(settings), str(run_dir), "tasks,train")  # resumed
    assert "stage tasks: already done" in out and "* Resumed existing run" in out
    ids = json.loads((run_dir / "tracking.json").read_text())
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        losses = {r.step: r.data["loss"] for r in store.metrics("train", "dpo_step")}
        assert ids["wandb"]["id"] == store.run_id and ids["trackio"]["project"] == "tiny"
    assert sorted(losses) == [1, 2]
    resolved = RunConfig.from_dict(settings).to_dict()

    tracked = json.loads(python(env, READ_TRACKIO, "tiny").splitlines()[-1])
    assert tracked["name"] == ids["trackio"]["name"]  # one run, both invocations in it
    logs = tracked["logs"]
    assert series(logs, "train/dpo_step/loss", "step") == pytest.approx(losses)
    assert series(logs, "tasks/stats/train", "step") == {1: 2}  # the first invocation's
    assert series(logs, "train/stats/dpo_step/loss", "step") == {1: round(losses[2], 4)}
    assert {k: tracked["config"][k] for k in resolved} == resolved

    wandb_ids, rows, wandb_config = wandb_history(run_dir)
    assert wandb_ids == {ids["wandb"]["id"]}  # two offline files, one W&B run
    assert series(rows, "train/dpo_step/loss", "train/dpo_step/step") == pytest.approx(losses)
    assert series(rows, "tasks/stats/test", "round") == {1: 1}
    assert {"margin", "accuracy", "tokens_per_s"} <= {k.split("/")[-1] for r in rows for k in r}
    assert wandb_config["run"]["report_to"] == ["trackio", "wandb", "tensorboard"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("train/dpo_step/loss")} == pytest.approx(
        losses)
    assert [e.value for e in events.Scalars("tasks/stats/train")] == [2]


def test_a_missing_tracker_stops_the_run_before_its_first_stage(monkeypatch, tmp_path):
    hide(monkeypatch, "wandb")
    cfg = RunConfig.load(None, ["run.report_to=[wandb]"])
    with pytest.raises(RunError, match=r"run.report_to: wandb needs wandb, which is not "
                                       r"installed: pip install 'offline-agent\[wandb\]'"):
        run(cfg, tmp_path / "r", STAGES)
    assert not (tmp_path / "r").exists()


def test_a_tracker_that_cannot_start_is_one_line_and_no_stage_runs(tmp_path):
    cfg = RunConfig.load(None, ["run.report_to=[tensorboard]"])
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "tensorboard").write_text("a file where the event folder goes")
    with pytest.raises(RunError, match=r"^run.report_to: tensorboard did not start: "):
        run(cfg, tmp_path / "r", STAGES)
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        assert store.stages() == []


def test_stats_become_numbers_under_nested_names():
    stats = {"nodes_per_s": 20.8, "trees": 4, "critic": "frozen", "resumed": True,
             "critic_concordance": {"overall": {"concordance": None, "n": 3}},
             "margin_histogram": {"[0.1, 0.25)": 2},
             "base": {"success_rate": 0.5, "ci95": [0.1, 0.9], "mean_reward_ci95": None}}
    assert scalars(stats, "s/") == {
        "s/nodes_per_s": 20.8, "s/trees": 4, "s/critic_concordance/overall/n": 3,
        "s/margin_histogram/[0.1, 0.25)": 2, "s/base/success_rate": 0.5,
        "s/base/ci95/low": 0.1, "s/base/ci95/high": 0.9}


@pytest.mark.parametrize("old, new", [("none", []), ("tensorboard", ["tensorboard"])])
def test_train_report_to_is_read_as_run_report_to(old, new):
    """Configs and run directories written before run.report_to still load and resume."""
    assert RunConfig.load(None, [f"train.report_to={old}"]).run.report_to == new
    stored = {"train": {"report_to": old, "lr": 1e-4}, "run": {}}
    assert renamed(stored) == {"train": {"lr": 1e-4}, "run": {}}


def test_report_to_names_known_trackers_once():
    for bad in ("run.report_to=[mlflow]", "run.report_to=[wandb,wandb]", "run.report_to=wandb"):
        with pytest.raises(ValueError, match="run.report_to"):
            RunConfig.load(None, [bad])
