"""offline-agent: run the pipeline; inspect a run (status, tree, report); merge shard runs;
export the mined data; check an env.

User mistakes (bad config key, changed config, run in use, a file that is not a store, an env
whose state cannot be snapshot) end with one line on stderr and exit code 2, having changed
nothing they were not asked to; a traceback means a bug or a failing stage.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from datetime import datetime
from pathlib import Path

from offline_agent.envs.base import EnvStateError
from offline_agent.optional_deps import MissingExtra, require
from pipelines.artifacts import CONCORDANCE, FROZEN
from pipelines.config import ConfigError, RunConfig, help_lines, make_env
from pipelines.errors import RunError
from pipelines.export import ExportError
from pipelines.progress import ProgressError, read_progress
from pipelines.report_table import concordance_text, held_out_lines
from storage import Store, StoreError, StoreInUse, TreeRow, merge_shards


class UsageError(Exception):
    """An argument the command cannot use (e.g. --out naming a directory)."""


USER_ERRORS = (ConfigError, RunError, StoreError, EnvStateError, UsageError, FileNotFoundError,
               FileExistsError, ExportError, MissingExtra)


def main(argv: list[str] | None = None) -> int:
    if "" not in sys.path:  # env.name mymod:MyEnv from the current folder, as `python -m`
        sys.path.append("")  # finds it; last, so a file there never hides an installed package
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except USER_ERRORS as e:
        print(f"offline-agent: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `offline-agent status RUN | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141  # as a shell reports a command killed by SIGPIPE


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="offline-agent",
        description="Offline Agent Q: MCTS search, preference mining and training for small "
        "tool-using LLM agents. Every stage resumes from the run's DuckDB store.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_run_command, _status_command, _merge_command, _export_command, _tree_command,
                _report_command, _check_env_command):
        add(sub)
    return p


def _run_command(sub) -> None:
    from pipelines.stages import STAGES

    stage_names = ", ".join(s.name for s in STAGES)
    r = sub.add_parser(
        "run",
        help="run the pipeline (resumes; finished stages are skipped)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"Run the stages in order: {stage_names}. With run.iterations = N, "
        "rounds 2..N (search@k, critic@k, mine@k, train@k, eval@k) run before report. "
        "Re-running the same command resumes; finished stages are skipped.",
        epilog="config keys (defaults < CONFIG < --set):\n" + "\n".join(help_lines()),
    )
    r.add_argument("config", type=Path, nargs="?", metavar="CONFIG",
                   help="YAML config, e.g. configs/default.yaml (default: none, every key at "
                   "its default below; --set changes one)")
    r.add_argument("--run-dir", type=Path, help="run directory (default: runs/<run.name>-<time>)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, value parsed as YAML (repeatable): --set search.k=8")
    which = r.add_mutually_exclusive_group()
    which.add_argument("--until", metavar="STAGE", help="stop after this stage")
    which.add_argument("--only", metavar="STAGE", help="run just this stage (earlier ones done)")
    r.add_argument("--force", action="store_true",
                   help="discard stored results whose config changed, and recompute them")
    r.set_defaults(func=cmd_run)


def _status_command(sub) -> None:
    s = sub.add_parser("status", help="show a run's stages and row counts (also while it runs)",
                       description="One line per stage: its status, time and headline "
                       "figures; stages the run has still to do show as `not run`.")
    s.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    s.add_argument("--verbose", "-v", action="store_true",
                   help="print each stage's whole stats dict instead of its headline")
    s.set_defaults(func=cmd_status)


def _merge_command(sub) -> None:
    m = sub.add_parser(
        "merge",
        help="merge shard runs (search.shard=i/n) into one run directory",
        description="Copy the stores of shard runs into OUT/store.duckdb, in one transaction. "
        "Rows equal in several shards (the tasks) are kept once; a key holding different rows, "
        "or shards run with different configs, is an error. Then continue with "
        "`offline-agent run CONFIG --run-dir OUT`: finished trees are not searched again.",
    )
    m.add_argument("out", type=Path, metavar="OUT", help="new run directory for the merged store")
    m.add_argument("shards", type=Path, nargs="+", metavar="SHARD_DIR",
                   help="run directories of the shards")
    m.set_defaults(func=cmd_merge)


def _export_command(sub) -> None:
    e = sub.add_parser(
        "export",
        help="write a run's mined data as a Hugging Face dataset folder, or push it to the Hub",
        description="Configs pairs (step level), trajectory_pairs, rft and hindsight in TRL's "
        "conversational format, laid out as datasets.push_to_hub writes them (parquet under "
        "data/, README.md card). --hub writes RUN_DIR/export and uploads it as one commit; the "
        "token comes from HF_TOKEN or `hf auth login` and is never printed.",
    )
    e.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    where = e.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, metavar="DIR", help="write the dataset folder here")
    where.add_argument("--hub", metavar="REPO_ID", help="push to this Hub dataset repo")
    e.add_argument("--private", action="store_true", help="create the Hub repo as private")
    e.add_argument("--revision", metavar="BRANCH", help="push to this branch (created if new)")
    e.add_argument("--round", type=round_number, default=1, metavar="N",
                   help="export round N's mined data (stage mine@N of run.iterations; "
                   "default: round 1's, stage mine)")
    e.set_defaults(func=cmd_export)


def _tree_command(sub) -> None:
    t = sub.add_parser("tree", help="draw one task's search tree as an HTML page or GraphML",
                       description="HTML: a self-contained page (visits, Q and critic score per "
                       "node; click a node for its action and observation). GraphML: opens in "
                       "Gephi or yEd.")
    t.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    t.add_argument("--task", required=True, metavar="ID", help="task id, e.g. minishop-train-00003")
    t.add_argument("--round", type=round_number, metavar="N",
                   help="the tree round N searched (stage search@N of run.iterations; default: "
                   "the latest round with a tree of the task)")
    t.add_argument("--format", choices=("html", "graphml"), default="html")
    t.add_argument("--out", type=Path, help="output file (default: RUN_DIR/trees/ID.FORMAT, or "
                   "ID@N.FORMAT for round N >= 2, the id made safe as a file name)")
    t.set_defaults(func=cmd_tree)


def _report_command(sub) -> None:
    rep = sub.add_parser("report", help="write RUN_DIR/report/ (report.json, index.html) again",
                         description="Recompute the report from a finished or stopped run's "
                         "store (opened read-only) and print the comparison table.")
    rep.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    rep.set_defaults(func=cmd_report)


def _check_env_command(sub) -> None:
    c = sub.add_parser("check-env", help="check that an env keeps the Env contract",
                       description="Checks a built-in or plugin env before a long run: tool "
                       "schemas, deterministic and disjoint tasks, snapshot/restore, fuzzed "
                       "model text, hindsight replay, the demonstration. Exit code 1 if a "
                       "check fails (docs/environments.md).")
    c.add_argument("env", metavar="ENV", help="package.module:Class, or minishop | math | python")
    c.add_argument("--kwargs", default="{}", metavar="JSON",
                   help='constructor arguments as a JSON object, e.g. \'{"max_steps": 8}\'')
    c.add_argument("--dataset", metavar="PATH",
                   help="a TRL environment's tasks (env.dataset): JSONL, CSV, parquet or a "
                   "saved dataset folder")
    c.add_argument("--reward-fn", metavar="package.module:function",
                   help="a TRL environment's reward function (env.reward_fn)")
    c.set_defaults(func=cmd_check_env)


def round_number(text: str) -> int:
    """A --round value: 1, 2, ..."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a round number (1, 2, ...)")
    return int(text)


def cmd_run(args: argparse.Namespace) -> int:
    from offline_agent.training import distributed
    from pipelines.runner import run
    from pipelines.stages import pipeline

    if distributed.world_size() > 1:  # accelerate launch / torchrun: docs/training.md
        if (args.only or "").partition("@")[0] != "train":
            raise UsageError(f"launched as {distributed.world_size()} processes: only a train "
                             "stage runs on several; add --only train (or --only train@K)")
        if distributed.is_follower():  # trains what the main process sends; never the store
            from offline_agent.training.fit import follow

            follow()
            return 0
    cfg = RunConfig.load(args.config, args.overrides)
    run_dir = args.run_dir or Path("runs") / f"{cfg.run.name}-{datetime.now():%Y%m%d-%H%M%S}"
    try:
        run(cfg, run_dir, pipeline(cfg.run.iterations), until=args.until, only=args.only,
            force=args.force)
        distributed.release()  # not after a failure: the launcher then stops the others
    except KeyboardInterrupt:
        print(f"\ninterrupted; rerun the same command to resume.\nrun directory: {run_dir}",
              file=sys.stderr)
        return 130
    print(f"run directory: {run_dir}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    path = run_store(args.run_dir)
    try:
        store = Store(path, read_only=True)
    except StoreInUse as e:
        print(f"{path} is locked by PID {e.pid} (a run is in progress), so this is its "
              "progress.json:")
        print(_progress_text(args.run_dir))
        return 0
    with store:
        print(f"run directory: {args.run_dir}  (run id {store.run_id})")
        print("stages:")
        rows = store.stages()
        for name in _stage_order(args.run_dir, rows):
            for row in [r for r in rows if r.stage == name] or [None]:
                _print_stage(name, row, args.verbose)
        counts = store.counts()
        print("rows: " + ", ".join(f"{t} {counts[t]}" for t in
                                   ("tasks", "trees", "nodes", "trajectories", "pairs",
                                    "examples")))
    return 0


def _stage_order(run_dir: Path, rows: list) -> list[str]:
    """The run's stages in pipeline order (its config.yaml's), then any other stored one."""
    from pipelines.stages import in_pipeline_order

    stored = [r.stage for r in rows]
    try:
        return in_pipeline_order(RunConfig.load(run_dir / "config.yaml").run.iterations, stored)
    except ConfigError:  # a config this version cannot read: the stored stages alone
        return list(dict.fromkeys(stored))


def _print_stage(name: str, row, verbose: bool) -> None:
    """One stage's line (and, --verbose, its whole stats), or `not run`."""
    from pipelines.headlines import headline, notes

    if row is None:
        print(f"  {name:<22} not run")
        return
    # we hold the lock, so no process is running it: it was killed
    status = "interrupted" if row.status == "running" else row.status
    if not verbose:
        print(_stage_line(name, row.shard, status, row.seconds, headline(name, row.stats)))
        for line in notes(name, row.stats):
            print(f"  {'':<22} {line}")
        return
    stats = dict(row.stats or {})
    agreement = stats.pop(CONCORDANCE, None)
    frozen = stats.pop(FROZEN, None)  # the critic stage's: frozen on its held-out trees
    held_out: list[str] = []  # a train stage's policies': a line each
    if name.split("@")[0] == "train":
        stats, held_out = held_out_lines(stats)
    print(_stage_line(name, row.shard, status, row.seconds, str(stats or "")))
    for line in held_out:
        print(f"  {'':<22} {line}")
    if agreement is not None and agreement["overall"]["n"]:
        print(f"  {'':<22} {concordance_text(agreement)}")
    if frozen is not None and frozen["overall"]["n"]:
        print(f"  {'':<22} frozen {concordance_text(frozen)} (same held-out trees)")


def run_store(run_dir: Path) -> Path:
    """RUN_DIR's store.duckdb; a run directory that is missing, a file or not a run's is
    worded alike by every command that reads one."""
    if not run_dir.exists():
        raise UsageError(f"run directory {run_dir} does not exist")
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is a file, not a run directory")
    path = run_dir / "store.duckdb"
    if not path.exists():
        raise UsageError(f"{run_dir} is not a run directory: it holds no store.duckdb "
                         "(`offline-agent run` makes one)")
    return path


def _progress_text(run_dir: Path) -> str:
    try:
        p = read_progress(run_dir)
    except ProgressError as e:
        return f"  (no progress to show: {e})"
    if p is None:
        return "  (no progress.json yet)"
    updated = datetime.fromisoformat(p["updated_at"])
    ago = (datetime.now().astimezone() - updated).total_seconds()
    shard = f" [shard {p['shard']}]" if p.get("shard") else ""
    counters = " ".join(f"{k}={v}" for k, v in p.get("counters", {}).items())
    done = "".join(_stage_line(d["stage"], d["shard"], "done", d["seconds"], d["headline"]) + "\n"
                   for d in p["done"])
    return (f"{done}  stage {p['stage']}{shard}: {p['status']}{_running_for(p)}  {counters}\n"
            f"  written by PID {p['pid']}, {ago:.0f}s ago")


def _running_for(progress: dict) -> str:
    """` for 1h 05m` while a stage runs: how long its current attempt has taken (none for a
    progress.json written before it kept `started_at`, or one whose stage has ended)."""
    try:
        started = datetime.fromisoformat(progress.get("started_at") or "")
    except (TypeError, ValueError):
        return ""
    if progress["status"] != "running" or started.tzinfo is None:
        return ""
    minutes = int((datetime.now().astimezone() - started).total_seconds() // 60)
    return f" for {minutes // 60}h {minutes % 60:02d}m" if minutes >= 60 else f" for {minutes}m"


def _stage_line(name: str, shard: str, status: str, seconds: float | None, text: str) -> str:
    """A stage's line in `status`: name, status, time taken, headline."""
    took = f"{seconds:.1f}s" if seconds is not None else ""
    return f"  {name + (f' [{shard}]' if shard else ''):<22} {status:<11} {took:>8}  {text}"


def cmd_merge(args: argparse.Namespace) -> int:
    target = args.out / "store.duckdb"
    if target.exists():
        raise FileExistsError(f"{target} exists; merge into a new directory")
    shards = [d / "store.duckdb" for d in args.shards]
    for path in shards:
        if not path.exists():
            raise FileNotFoundError(f"no store at {path}")
    made = _new_dirs(args.out)
    args.out.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        with Store(target) as store:
            added = merge_shards(store, shards)
    except BaseException:  # leave nothing behind: no half-made store, no empty directory
        if made:
            shutil.rmtree(made[-1], ignore_errors=True)
        else:
            for leftover in (target, target.with_name(target.name + ".wal")):
                leftover.unlink(missing_ok=True)
        raise
    print("merged rows: " + ", ".join(f"{t} {n}" for t, n in added.items()))
    print(f"run directory: {args.out}  (continue with: offline-agent run CONFIG "
          f"--run-dir {args.out})")
    return 0


def _new_dirs(path: Path) -> list[Path]:
    """The directories that making `path` creates, innermost first."""
    made = []
    while not path.exists():
        made.append(path)
        path = path.parent
    return made


def cmd_export(args: argparse.Namespace) -> int:
    from pipelines.export import export, left_out, push
    from pipelines.headlines import export_rows

    if args.out and args.out.exists() and any(args.out.iterdir()):
        raise FileExistsError(f"{args.out} exists and is not empty; export into a new folder")
    from pipelines.rounds import round_name, stored_rounds

    path = run_store(args.run_dir)
    cfg = RunConfig.load(args.run_dir / "config.yaml")
    env = make_env(cfg)
    out = args.out or args.run_dir / "export"
    with Store(path, read_only=True) as store:
        rounds = stored_rounds(store.stages, "mine")
        if args.round > 1 and args.round not in rounds:  # round 1: export() says what is missing
            raise UsageError(f"--round {args.round}: the run has no round {args.round} (stage "
                             f"{round_name('mine', args.round)!r}); rounds with a mine stage: "
                             f"{', '.join(map(str, rounds)) or 'none yet'}")
        mine = round_name("mine", args.round)
        counts = export(store, out, env.tools, cfg.to_dict(), mine)
        warnings = left_out(store, counts, mine)
    print(f"dataset: {out}  rows: {export_rows(counts, cfg.mine.rft_hindsight)}")
    for line in warnings:
        print(line, file=sys.stderr)
    if args.hub:
        url = push(out, args.hub, args.private, args.revision)
        print(f"pushed to {args.hub}: {url}")
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    require("networkx")
    from pipelines.treeview import render_html, tree_path, write_graphml

    if args.out and args.out.is_dir():
        raise UsageError(f"--out {args.out} is a directory; give a file, e.g. "
                         f"{args.out / tree_path(Path(), args.task, args.format).name}")
    with Store(run_store(args.run_dir), read_only=True) as store:
        r, tree = _task_tree(store, args.task, args.round)
        nodes = store.load_tree(tree.tree_id)
        instruction = next((t.instruction for t in store.tasks() if t.id == args.task), "")
    out = args.out or tree_path(args.run_dir, args.task, args.format, r)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.format == "graphml":
        write_graphml(nodes, out)
    else:
        in_round = f"round {r}, " if r > 1 else ""
        title = (f"{args.task}: {instruction} ({in_round}{tree.simulations_done} simulations, "
                 f"best reward {tree.best_reward})")
        out.write_text(render_html(nodes, title))
    print(f"wrote {out} ({len(nodes)} nodes{f', round {r}' if r > 1 else ''})")
    return 0


def _task_tree(store: Store, task: str, r: int | None) -> tuple[int, TreeRow]:
    """(round, tree row) of `task`'s tree in round r, or in the latest round holding one."""
    from pipelines.rounds import round_name, stored_rounds

    rounds = stored_rounds(store.trees, "search")
    trees = {n: t for n in rounds for t in store.trees(round_name("search", n))
             if t.task_id == task}
    if not trees:
        known = ", ".join(list(dict.fromkeys(t.task_id for t in store.trees()))[:5])
        known = known or "none yet"
        raise StoreError(f"no search tree for task {task!r} (trees: {known}, ...)")
    if r is None:
        r = max(trees)
    if r not in trees:
        raise UsageError(f"--round {r}: no search tree for task {task!r} in round {r} (stage "
                         f"{round_name('search', r)!r}); rounds with one: "
                         f"{', '.join(map(str, sorted(trees)))}")
    return r, trees[r]


def cmd_report(args: argparse.Namespace) -> int:
    from pipelines.report import build_report, eval_config, outcomes, write_report
    from pipelines.report_table import comparison_table, diagnostics_text

    with Store(run_store(args.run_dir), read_only=True) as store:
        report, episodes = build_report(store, eval_config(store)), outcomes(store)
    if not report["policies"]:  # nothing to compare: no page that looks like a result
        raise UsageError(f"{args.run_dir} has no evaluation episodes yet, so no report: run "
                         "its eval stage first (offline-agent run CONFIG --run-dir "
                         f"{args.run_dir})")
    path = write_report(args.run_dir, report, episodes)
    print(comparison_table(report))
    print(diagnostics_text(report["diagnostics"]))
    print(f"report: {path}")
    return 0


def cmd_check_env(args: argparse.Namespace) -> int:
    import json

    from offline_agent.envs.testing.check import check_env, format_table, summary
    from offline_agent.envs.trl import build_env

    def make_env():
        return build_env(args.env, args.dataset, args.reward_fn, **kwargs)

    try:
        kwargs = json.loads(args.kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError("--kwargs must be a JSON object")
        make_env()
    except (ValueError, TypeError) as e:  # bad JSON, unknown env, wrong constructor arguments
        print(f"offline-agent: error: {e}", file=sys.stderr)
        return 2
    results = check_env(make_env)
    print(format_table(results))
    print(f"{args.env}: {summary(results)}")
    return 1 if any(r.ok is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
