"""Stage runner: runs an ordered list of stages against one run directory, resumably.

Each stage's row in the store's `stages` table holds its status (running | done | failed |
interrupted), the hash of the config sections it depends on, its stats and timings.
Re-running skips done stages; a stage left running, failed or interrupted runs again and
resumes from what it stored. Stored results made under a different config are never mixed
with new ones: the runner refuses, or with `force` clears them first.

A stage lists every section its results depend on, upstream ones included (search lists
env and model too), and its `view` drops the keys of those sections it does not read (search
does not read env.test_tasks), so a change invalidates exactly the stages it affects. A stage marked
`reruns` (the report, the mcts stage) reads what earlier stages stored: it runs again
whenever an earlier stage ran in this invocation (e.g. a round added by raising run.iterations), and `force`
clears it (its files too, Stage.outputs) with any earlier stage it clears.

The env is built before the run directory is made, so a wrong env.name or env.kwargs ends
as one line with nothing written, and the rerun with the right one just runs.

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
from pipelines.config import RunConfig, diff, digest, make_env
from pipelines.errors import RunError
from pipelines.headlines import headline
from pipelines.progress import Progress
from pipelines.tracking import Tracker, TrackerError, open_tracker
from storage import MetricRow, StageRow, Store


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
    # what it writes in the run directory besides the store and checkpoints/<name>/ (e.g.
    # "report"): removed with its results when --force clears them
    outputs: tuple[str, ...] = ()
    # runs again whenever a stage before it ran in this invocation, as it reads what they
    # stored (the report; the mcts stage, over every round's policies) and skips what it has
    reruns: bool = False

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
    if run_dir.exists() and not run_dir.is_dir():
        raise RunError(f"{run_dir} is a file, not a run directory")
    make_env(cfg)  # a wrong env.name or env.kwargs: one line, before anything is written
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
        progress.stages_done(_done_lines(store))
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
                                     redo=ran and s.reruns)
        ran = ran or results[s.name]["status"] == "done"
    return results


def _done_lines(store: Store) -> list[dict]:
    """Each stage stored as done, as `status` prints it, for progress.json."""
    return [{"stage": r.stage, "shard": r.shard, "seconds": r.seconds,
             "headline": headline(r.stage, r.stats)} for r in store.stages() if r.status == "done"]


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
              f"skipping: {headline(stage.name, row.stats)}", flush=True)
        return {"status": "skipped", "stats": row.stats}
    verb = ("running again: stages before it ran" if redo and row
            else f"resuming after {'an' if row.status[0] in 'aeiou' else 'a'} {row.status} "
            "attempt" if row else "running")
    print(f"stage {label}: {verb}", flush=True)
    earlier = _earlier_seconds(row, progress)
    store.start_stage(stage.name, shard, stage.hash(cfg), stage.hashed(cfg), earlier)
    progress.start(stage.name, shard)
    ctx = StageContext(cfg, run_dir, store, progress, stage.name, shard, stage.round, tracker)
    start = time.perf_counter()
    try:
        stats = stage.fn(ctx)
    except KeyboardInterrupt:
        store.fail_stage(stage.name, shard, "KeyboardInterrupt: the same command resumes",
                         status="interrupted")
        progress.status("interrupted")
        raise
    except BaseException as e:
        store.fail_stage(stage.name, shard, f"{type(e).__name__}: {e}")
        progress.status("failed")
        raise
    seconds = time.perf_counter() - start
    if store.stage(stage.name, shard).status != "done":
        store.fail_stage(stage.name, shard, "returned without ctx.mark_done(stats)")
        raise RuntimeError(f"stage {stage.name!r} returned without calling ctx.mark_done(stats) "
                           "in the transaction of its last outputs")
    progress.status("done")
    progress.stages_done(_done_lines(store))
    tracker.log_stats(stage.name, stage.round, stats)
    before = f" (+{earlier:.1f}s in earlier attempts)" if earlier else ""
    print(f"stage {label}: done in {seconds:.1f}s{before}: {headline(stage.name, stats)}",
          flush=True)
    return {"status": "done", "stats": stats, "seconds": seconds}


def _earlier_seconds(row: StageRow | None, progress: Progress) -> float:
    """The seconds of a stage's attempts before this one: 0 unless it is resumed (its row is
    not done). An attempt that ended (failed, interrupted) says how long it took; one whose
    process was killed ran until its last progress write."""
    if row is None or row.status == "done":
        return 0.0
    if row.seconds is not None:
        return row.seconds
    return row.earlier_seconds + progress.killed_seconds(row.stage, row.shard)


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
    idle = [stage for stage, _ in stale if _did_nothing(store.stages(stage.name))]
    stale = [(stage, row) for stage, row in stale if stage not in idle]
    if stale and not force:  # a refused command changes nothing, idle stages included
        lines = [f"{run_dir} holds results made under a different config:"]
        for stage, row in stale:
            lines.append(f"  stage {stage.name!r} ({row.status}):")
            changes = _changes(row.config or {}, cfg, stage)
            lines += [f"    {c}" for c in changes] or ["    (stage sections changed)"]
        lines.append("Rerun with --force to discard those results and recompute them, "
                     "or use another --run-dir.")
        raise RunError("\n".join(lines))
    for stage in idle:
        _clear(stage, store, run_dir, "skipped under the old config, runs under this one")
    if not stale:
        return
    cleared = [stage for stage, _ in stale]
    for stage in cleared:
        _clear(stage, store, run_dir, "config changed, --force")
    names = ", ".join(s.name for s in cleared)
    for stage in downstream(stages, cleared):
        if store.stages(stage.name) or any((run_dir / p).exists() for p in stage.outputs):
            _clear(stage, store, run_dir, f"reads what --force cleared ({names})")


def downstream(stages: Sequence[Stage], cleared: Sequence[Stage]) -> list[Stage]:
    """The stages --force must clear with `cleared` although their config did not change: a
    stage that lists sections is stale exactly when its view of them changed (it lists its
    upstream ones too), but one that lists none (the report) reads whatever earlier stages
    stored, so it is stale once any of them is cleared."""
    names = [s.name for s in stages]
    first = min(names.index(c.name) for c in cleared)
    return [s for s in stages[first + 1:] if not s.sections]


def _did_nothing(rows) -> bool:
    """Every attempt of a stage finished as skipped (e.g. grpo or mcts turned off): under a
    changed config it just runs, as nothing of it would be lost."""
    return all(r.status == "done" and "skipped" in (r.stats or {}) for r in rows)


def _clear(stage: Stage, store: Store, run_dir: Path, why: str) -> None:
    """Delete a stage's rows, stage record, checkpoints and outputs, so it is not done."""
    deleted = store.clear_stage(stage.name)
    for path in (Path("checkpoints") / stage.name, *stage.outputs):
        shutil.rmtree(run_dir / path, ignore_errors=True)
    gone = ", ".join(f"{n} {t}" for t, n in deleted.items() if n)
    print(f"stage {stage.name}: {why}: cleared ({gone or 'nothing'})", flush=True)


def _check_inputs(stages: Sequence[Stage], only: str, store: Store) -> None:
    """--only X needs every earlier stage done (in some shard)."""
    for stage in stages:
        if stage.name == only:
            return
        if not any(r.status == "done" for r in store.stages(stage.name)):
            raise RunError(f"--only {only}: stage {stage.name!r} has not finished in this run "
                           f"directory; run with --until {only} instead")
