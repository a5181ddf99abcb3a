"""Experiment trackers (run.report_to): every stage's figures where people already look.

The runner opens one Tracker per `offline-agent run` and closes it at the end. Through it:
- each optimizer step's metrics as a stage stores them (StageContext.log_metrics: train,
  grpo), as `<stage>/<series>/<metric>` over that series' step (train/dpo_step/loss);
- each stage's stats when it is done, as `<stage>/stats/<key>` over the round (search@2's
  as search/stats/... at 2), nested keys joined by "/", numbers only.
One tracker run per run directory, with the resolved config attached. RUN_DIR/tracking.json
names it, so a resumed run appends to the same tracker run; delete the file to start a new
one. trackio, wandb and tensorboard are optional extras, imported only when asked for.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from offline_agent.optional_deps import require

IDS = "tracking.json"


class TrackerError(Exception):
    """A tracker of run.report_to that could not start (e.g. wandb online without a login)."""


class TensorBoard:
    """Event files under RUN_DIR/tensorboard: `tensorboard --logdir RUN_DIR/tensorboard`."""

    @staticmethod
    def new_ids(project: str, run_dir: Path, run_id: str) -> dict:
        return {"logdir": "tensorboard"}

    def __init__(self, ids: dict, config: dict, run_dir: Path):
        require("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / ids["logdir"]))
        self.writer.add_text("config", "```\n" + yaml.safe_dump(config, sort_keys=False) + "```")

    def log(self, values: dict[str, float], prefix: str, axis: str, step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self, failed: bool) -> None:
        self.writer.close()


class Trackio:
    """A run in trackio's local store (TRACKIO_DIR, by default ~/.cache/huggingface/trackio:
    `trackio show --project <run.name>`), or where trackio's own environment sends it."""

    @staticmethod
    def new_ids(project: str, run_dir: Path, run_id: str) -> dict:
        return {"project": project, "name": f"{run_dir.name}-{run_id}"}

    def __init__(self, ids: dict, config: dict, run_dir: Path):
        self.trackio = require("trackio")
        self.run = self.trackio.init(project=ids["project"], name=ids["name"], config=config,
                                     resume="allow", embed=False)

    def log(self, values: dict[str, float], prefix: str, axis: str, step: int) -> None:
        self.run.log(values, step=step)

    def close(self, failed: bool) -> None:
        self.trackio.finish()  # the module's: it also forgets the run (no second finish)


class WandB:
    """A W&B run (id: the store's run id), its local files under RUN_DIR/wandb; with
    WANDB_MODE=offline, `wandb sync RUN_DIR/wandb/offline-run-*` uploads them later."""

    @staticmethod
    def new_ids(project: str, run_dir: Path, run_id: str) -> dict:
        return {"project": project, "id": run_id, "name": run_dir.name}

    def __init__(self, ids: dict, config: dict, run_dir: Path):
        wandb = require("wandb")
        self.run = wandb.init(project=ids["project"], id=ids["id"], name=ids["name"],
                              config=config, resume="allow", dir=str(run_dir))
        self.axes: set[str] = set()

    def log(self, values: dict[str, float], prefix: str, axis: str, step: int) -> None:
        if prefix not in self.axes:  # W&B's own step counts log calls: plot over ours
            self.run.define_metric(f"{prefix}*", step_metric=axis)
            self.axes.add(prefix)
        self.run.log({axis: step, **values})

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


BACKENDS = {"tensorboard": TensorBoard, "trackio": Trackio, "wandb": WandB}


class Tracker:
    """The trackers of run.report_to (none: every call does nothing)."""

    def __init__(self, backends: list | None = None):
        self.backends = backends or []

    def log_step(self, stage: str, series: str, step: int, metrics: dict) -> None:
        """One optimizer step's metrics of `series` (a policy) in `stage`."""
        prefix = f"{stage}/{series}/"
        self._log(scalars(metrics, prefix), prefix, f"{prefix}step", step)

    def log_stats(self, stage: str, round: int, stats: dict) -> None:
        """A stage's stats when it is done, over its round."""
        prefix = f"{stage.partition('@')[0]}/stats/"
        self._log(scalars(stats, prefix), prefix, "round", round)

    def _log(self, values: dict[str, float], prefix: str, axis: str, step: int) -> None:
        for backend in self.backends if values else ():
            backend.log(values, prefix, axis, step)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        for backend in self.backends:
            backend.close(failed=kind is not None)


def scalars(data: dict, prefix: str = "") -> dict[str, float]:
    """The numbers in `data`, nested keys joined by "/" after `prefix`. A pair of numbers is
    an interval (eval's ci95): `<key>/low` and `<key>/high`. Text, None and flags are left out."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, list) and len(value) == 2 and all(map(_number, value)):
            out[f"{name}/low"], out[f"{name}/high"] = value
        elif _number(value):
            out[name] = value
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def open_tracker(report_to: list[str], config: dict, run_dir: Path, run_id: str) -> Tracker:
    """Start (or, named in RUN_DIR/tracking.json, resume) the tracker runs of `report_to`,
    each in project run.name of the resolved `config`, which it attaches."""
    path = run_dir / IDS
    ids = json.loads(path.read_text()) if path.exists() else {}
    backends = []
    for name in report_to:
        ids.setdefault(name, BACKENDS[name].new_ids(config["run"]["name"], run_dir, run_id))
        try:
            backends.append(BACKENDS[name](ids[name], config, run_dir))
        except Exception as e:  # a tracker's own failure (login, server): one line, no run
            for started in backends:
                started.close(failed=True)
            raise TrackerError(f"run.report_to: {name} did not start: "
                               f"{type(e).__name__}: {e}") from None
        print(f"tracking: {name} {json.dumps(ids[name])}", flush=True)
    if backends:
        tmp = path.with_name(f".{IDS}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(ids, indent=1) + "\n")
        os.replace(tmp, path)
    return Tracker(backends)
