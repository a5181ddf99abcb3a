"""Stage runner: runs an ordered list of stages against one run directory, resumably.

Each stage's row in the store's `stages` table holds its status (running | done | failed),
the hash of the config sections it depends on, its stats and timings. Re-running skips
done stages; a stage left running or failed by a crash runs again and resumes from what
it stored. Stored results made under a different config are never mixed with new ones:
the runner refuses, or with `force` clears them first.

A stage lists every section its results depend on, upstream ones included (search lists
env and model too), and its `view` drops the keys of those sections it does not read (search
does not read env.test_tasks), so a change invalidates exactly the stages it affects. A stage that lists
none (the report) only reads what earlier stages stored: it runs again whenever an earlier
stage ran in this invocation (e.g. a round added by raising run.iterations).

With run.report_to, one tracker run (pipelines/tracking.py) is open for the whole invocation:
stages log their per-step metrics through StageContext.log_metrics, the runner each stage's
stats once it is done.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from offline_agent.optional_deps import missing
from pipelines.config import RunConfig, diff, digest
from pipelines.progress import Progress
from pipelines.tracking import Tracker, TrackerError, open_tracker
from storage import MetricRow, Store


class RunError(Exception):
    """A request the runner refuses (changed config, unknown stage, missing inputs)."""


def unsharded(cfg: RunConfig) -> str:
    return ""


def whole(hashed: dict) -> dict:
    return hashed


@dataclass(frozen=True)
class Stage:
    name: str
    sections: tuple[str, ...]  # config sections the results depend on (hashed)
    fn: Callable[[StageContext], dict]  # does the work, calls ctx.mark_done(stats), returns stats
    shard: Callable[[RunConfig], str] = unsharded  # 'i/n' for a stage split over machines
    round: int = 1  # the run.iterations round it belongs to (its name says it too: search@2)
    # the part of its sections' config its results depend on, where less than all of it
    view: Callable[[dict], dict] = whole

    def hashed(self, cfg: RunConfig) -> dict:
        return self.view(cfg.hashed(self.sections))

    def hash(self, cfg: RunConfig) -> str:
        return digest(self.hashed(cfg))


@dataclass
class StageContext:
    cfg: RunConfig
    run_dir: Path
    store: Store
    progress: Progress
    stage: str
    shard: str
    round: int  # the stage's run.iterations round: 1, or k for search@k ... eval@k
    tracker: Tracker = field(default_factory=Tracker)  # run.report_to's trackers

    @property
    def checkpoint_dir(self) -> Path:
        """RUN_DIR/checkpoints/<stage>/ for files too big for the store (e.g. adapters)."""
        path = self.run_dir / "checkpoints" / self.stage
        path.mkdir(parents=True, exist_ok=True)
        return path

    def mark_done(self, stats: dict) -> None:
        """Mark the stage done. Call it inside the transaction that commits the last outputs,
        so a crash leaves either both or neither."""
        self.store.mark_stage_done(self.stage, self.shard, stats)

    def log_metrics(self, series: str, step: int, metrics: dict) -> None:
        """Store one optimizer step's metrics of `series` (the report's curves) and send them
        to run.report_to's trackers."""
        self.store.insert_metrics([MetricRow(series, step, metrics)], self.stage)
        self.tracker.log_step(self.stage, series, step, metrics)


def plan(stages: Sequence[Stage], until: str | None, only: str | None) -> list[Stage]:
    names = [s.name for s in stages]
    if until and only:
        raise RunError("use --until or --only, not both")
    for name in (until, only):
        if name and name not in names:
            raise RunError(f"unknown stage {name!r}; stages: {', '.join(names)}")
    if until:
        return list(stages[: names.index(until) + 1])
    if only:
        return [stages[names.index(only)]]
    return list(stages)


def run(
    cfg: RunConfig,
    run_dir: str | Path,
    stages: Sequence[Stage],
    until: str | None = None,
    only: str | None = None,
    force: bool = False,
) -> dict[str, dict]:
    """Run the planned stages in order; returns {stage: {"status", "stats", ...}}."""
    run_dir = Path(run_dir)
    todo = plan(stages, until, only)
    _check_extras(cfg, todo)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # its store holds hidden tests
    with Store(run_dir / "store.duckdb") as store:  # refuses a file that is not a store
        _check_config(cfg, stages, store, run_dir, force)
        if only:
            _check_inputs(stages, only, store)
        tmp = run_dir / f".config.yaml.{os.getpid()}.tmp"
        tmp.write_text(cfg.to_yaml())
        os.replace(tmp, run_dir / "config.yaml")
        store.record_run(cfg.to_dict())
        progress = Progress(run_dir)
        try:
            tracker = open_tracker(cfg.run.report_to, cfg.to_dict(), run_dir, store.run_id)
        except TrackerError as e:
            raise RunError(str(e)) from None
        with tracker:
            results = _run_stages(todo, cfg, run_dir, store, progress, tracker)
        progress.status("finished")
    return results


def _run_stages(todo: Sequence[Stage], cfg: RunConfig, run_dir: Path, store: Store,
                progress: Progress, tracker: Tracker) -> dict[str, dict]:
    results, sharded, ran = {}, False, False
    for s in todo:
        sharded = sharded or s.shard(cfg) not in ("", "0/1")
        if sharded and s.shard(cfg) == "":
            print(f"stage {s.name}: needs every shard's results; skipped in a shard run "
                  "(merge the shards, then run on the merged directory)", flush=True)
            results[s.name] = {"status": "held"}
            continue
        results[s.name] = _run_stage(s, cfg, run_dir, store, progress, tracker,
                                     redo=ran and not s.sections)
        ran = ran or results[s.name]["status"] == "done"
    return results


def _check_extras(cfg: RunConfig, todo: Sequence[Stage]) -> None:
    """Refuse, before any work, a run whose stages need an extra that is not installed (hours
    of search would otherwise end in an ImportError at the report)."""
    need = set()
    for s in todo:
        if s.name == "report":
            need.add("matplotlib")
        if s.name in ("train", f"train@{s.round}") and cfg.train.quantization == "4bit":
            need.add("bitsandbytes")
    need.update(cfg.run.report_to)  # each tracker's module is named as the tracker
    errors = [e for module in sorted(need) if (e := missing(module))]
    if errors:
        raise RunError("; ".join(errors))


def _run_stage(stage: Stage, cfg: RunConfig, run_dir: Path, store: Store, progress: Progress,
               tracker: Tracker, redo: bool = False):
    shard = stage.shard(cfg)
    label = stage.name + (f" [shard {shard}]" if shard else "")
    row = store.stage(stage.name, shard)
    if row and row.status == "done" and not redo:
        print(f"stage {label}: already done (finished {row.finished_at:%Y-%m-%d %H:%M:%S}), "
              f"skipping; stats: {row.stats}", flush=True)
        return {"status": "skipped", "stats": row.stats}
    verb = ("running again: stages before it ran" if redo and row
            else f"resuming after a {row.status} attempt" if row else "running")
    print(f"stage {label}: {verb}", flush=True)
    store.start_stage(stage.name, shard, stage.hash(cfg), stage.hashed(cfg))
    progress.start(stage.name, shard)
    ctx = StageContext(cfg, run_dir, store, progress, stage.name, shard, stage.round, tracker)
    start = time.perf_counter()
    try:
        stats = stage.fn(ctx)
    except BaseException as e:
        store.fail_stage(stage.name, shard, f"{type(e).__name__}: {e}")
        progress.status("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
        raise
    seconds = time.perf_counter() - start
    if store.stage(stage.name, shard).status != "done":
        store.fail_stage(stage.name, shard, "returned without ctx.mark_done(stats)")
        raise RuntimeError(f"stage {stage.name!r} returned without calling ctx.mark_done(stats) "
                           "in the transaction of its last outputs")
    progress.status("done")
    tracker.log_stats(stage.name, stage.round, stats)
    print(f"stage {label}: done in {seconds:.1f}s; stats: {stats}", flush=True)
    return {"status": "done", "stats": stats, "seconds": seconds}


def _changed(stored: dict | None, cfg: RunConfig, stage: Stage) -> bool:
    """Whether a stage's stored config differs from `cfg`'s. A key the stored config lacks
    and `cfg` leaves at its default is no change: it was added to the code after that run,
    whose results were made as that default makes them (so upgrading keeps old runs)."""
    if stored is None:
        return True
    return bool(_changes(stored, cfg, stage))


def _changes(stored: dict, cfg: RunConfig, stage: Stage) -> list[str]:
    """What differs between a stage's stored config and `cfg`'s, as `diff` lines."""
    return diff(stage.view(_fill(stored, RunConfig().hashed(stage.sections))), stage.hashed(cfg))


def _fill(stored: dict, defaults: dict) -> dict:
    """`stored` with the keys it lacks set to `defaults`', and old names read as new ones."""
    out = renamed(stored)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _fill(out[key], value)
    return out


def renamed(stored: dict) -> dict:
    """A stored config with values renamed since read as their new names: search.critic
    `logprob` is `frozen` (issue 23), as SearchConfig reads it; train.report_to, which
    moved to run.report_to (not hashed: where figures go changes no result), is dropped."""
    out = dict(stored)
    search = out.get("search")
    if isinstance(search, dict) and search.get("critic") == "logprob":
        out["search"] = {**search, "critic": "frozen"}
    train = out.get("train")
    if isinstance(train, dict) and "report_to" in train:
        out["train"] = {k: v for k, v in train.items() if k != "report_to"}
    return out


def _check_config(cfg: RunConfig, stages: Sequence[Stage], store: Store, run_dir: Path,
                  force: bool) -> None:
    """Refuse (or, with force, clear) stored stage results made under a different config."""
    stale = []
    for stage in stages:
        current = stage.hash(cfg)
        rows = [r for r in store.stages(stage.name)
                if r.config_hash != current and _changed(r.config, cfg, stage)]
        if rows:
            stale.append((stage, rows[-1]))
    if not stale:
        return
    if not force:
        lines = [f"{run_dir} holds results made under a different config:"]
        for stage, row in stale:
            lines.append(f"  stage {stage.name!r} ({row.status}):")
            changes = _changes(row.config or {}, cfg, stage)
            lines += [f"    {c}" for c in changes] or ["    (stage sections changed)"]
        lines.append("Rerun with --force to discard those results and recompute them, "
                     "or use another --run-dir.")
        raise RunError("\n".join(lines))
    for stage, _ in stale:
        deleted = store.clear_stage(stage.name)
        shutil.rmtree(run_dir / "checkpoints" / stage.name, ignore_errors=True)
        gone = ", ".join(f"{n} {t}" for t, n in deleted.items() if n)
        print(f"stage {stage.name}: config changed, --force: cleared ({gone or 'nothing'})",
              flush=True)


def _check_inputs(stages: Sequence[Stage], only: str, store: Store) -> None:
    """--only X needs every earlier stage done (in some shard)."""
    for stage in stages:
        if stage.name == only:
            return
        if not any(r.status == "done" for r in store.stages(stage.name)):
            raise RunError(f"--only {only}: stage {stage.name!r} has not finished in this run "
                           f"directory; run with --until {only} instead")
