"""Stage runner: skip finished stages, refuse or force on changed config, resume after
failure, until/only, and the real `tasks` stage on a tiny fake env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from offline_agent.types import Task
from pipelines.config import RunConfig
from pipelines.errors import RunError
from pipelines.runner import Stage, run
from pipelines.stages import STAGES
from storage import Store
from tests.fakes import fake_cfg

TASKS_ONLY = STAGES[:1]  # the model-free stage; the others are tested in test_cli/test_search_stage


def counting_stages(calls: list[str], fail: set[str] = frozenset()) -> list[Stage]:
    """tasks (real) + two stages that record their calls and can be told to fail."""

    def make(name: str):
        def fn(ctx):
            calls.append(name)
            if name in fail:
                raise RuntimeError(f"{name} broke")
            with ctx.store.transaction():
                ctx.store.set_checkpoint(name, ctx.shard, "ran", True)
                ctx.mark_done({"calls": calls.count(name)})
            return {"calls": calls.count(name)}

        return fn

    return [STAGES[0], Stage("b", ("run", "search"), make("b")),
            Stage("c", ("search",), make("c"), shard=lambda cfg: cfg.search.shard)]


def test_tasks_stage_stores_tasks_and_skips_on_rerun(tmp_path, capsys):
    cfg = fake_cfg("run.seed=7")
    out = run(cfg, tmp_path, TASKS_ONLY)
    assert out["tasks"]["status"] == "done"
    assert out["tasks"]["stats"] == {"env": "fake", "train": 3, "test": 2}
    again = run(cfg, tmp_path, TASKS_ONLY)
    assert again["tasks"]["status"] == "skipped"
    assert "stage tasks: already done" in capsys.readouterr().out
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert [t.id for t in s.tasks("train")] == [f"t-train-7-{i}" for i in range(3)]
        assert [t.data for t in s.tasks("test")] == [{"i": 0}, {"i": 1}]
        (row,) = s.stages()
        assert row.status == "done" and row.config_hash == cfg.hash(["run", "env"])
        assert row.finished_at >= row.started_at and row.seconds >= 0
        assert s.runs()[0]["config"] == cfg.to_dict()
    assert RunConfig.from_dict(yaml.safe_load((tmp_path / "config.yaml").read_text())) == cfg
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["status"] == "finished" and progress["pid"] > 0


def test_validation_tasks_follow_the_train_tasks_and_keep_the_others_numbers(tmp_path):
    """env.val_tasks: the env's train tasks after the first train_tasks, stored as split
    "val" after train and test, so train and test keep the ids and numbers of a run without."""
    out = run(fake_cfg("env.val_tasks=2"), tmp_path / "v", TASKS_ONLY)
    assert out["tasks"]["stats"] == {"env": "fake", "train": 3, "test": 2, "val": 2}
    run(fake_cfg(), tmp_path / "plain", TASKS_ONLY)
    with Store(tmp_path / "v" / "store.duckdb", read_only=True) as s, \
            Store(tmp_path / "plain" / "store.duckdb", read_only=True) as plain:
        assert [(t.id, t.split) for t in s.tasks("val")] == [("t-train-0-3", "val"),
                                                             ("t-train-0-4", "val")]
        assert s.tasks("train") == plain.tasks("train") and s.tasks("test") == plain.tasks("test")
        index = s.task_index()
        assert {k: index[k] for k in plain.task_index()} == plain.task_index()


def test_a_task_id_in_two_splits_is_refused_naming_them():
    from pipelines.stages.tasks import split_tasks
    from tests.fakes import FakeEnv

    class Overlapping(FakeEnv):
        def tasks(self, split, n):  # test task i has train task i's id
            return [Task(f"t{i}", self.name, "x", split) for i in range(n)]

    with pytest.raises(ValueError, match=r"task id 't0' more than once \(train and test"):
        split_tasks(Overlapping(), 2, 2, 0)
    with pytest.raises(ValueError, match=r"'t0' more than once \(test and val tasks"):
        split_tasks(Overlapping(), 0, 2, 2)

    class Reshuffled(FakeEnv):
        def tasks(self, split, n):  # the order depends on n
            return [Task(f"{split}{(i + 1) % n}", self.name, "x", split) for i in range(n)]

    with pytest.raises(ValueError, match=r"tasks\('train', 3\) does not start with"):
        split_tasks(Reshuffled(), 2, 1, 1)
    assert len(split_tasks(Reshuffled(), 2, 1, 0)["train"]) == 2  # no validation: no check


def test_changed_config_is_refused_then_forced(tmp_path, capsys):
    run(fake_cfg(), tmp_path, TASKS_ONLY)
    changed = fake_cfg("env.train_tasks=4", "env.kwargs.prefix=u")
    with pytest.raises(RunError) as e:
        run(changed, tmp_path, TASKS_ONLY)
    assert "env.train_tasks: 3 -> 4" in str(e.value) and "--force" in str(e.value)
    assert "env.kwargs.prefix: '<unset>' -> 'u'" in str(e.value)
    # unrelated sections and unhashed keys do not matter
    run(fake_cfg("search.k=9", "run.name=renamed"), tmp_path, TASKS_ONLY)
    out = run(changed, tmp_path, TASKS_ONLY, force=True)
    assert out["tasks"]["stats"]["train"] == 4
    assert "config changed, --force: cleared" in capsys.readouterr().out
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert [t.id for t in s.tasks()] == ["u-train-0-0", "u-train-0-1", "u-train-0-2",
                                             "u-train-0-3", "u-test-0-0", "u-test-0-1"]


def test_failure_is_recorded_and_resumed(tmp_path, capsys):
    calls: list[str] = []
    cfg = fake_cfg()
    with pytest.raises(RuntimeError, match="b broke"):
        run(cfg, tmp_path, counting_stages(calls, fail={"b"}))
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert s.stage("b").status == "failed"
        assert s.stage("b").stats == {"error": "RuntimeError: b broke"}
    assert json.loads((tmp_path / "progress.json").read_text())["status"] == "failed"
    out = run(cfg, tmp_path, counting_stages(calls))
    assert calls == ["b", "b", "c"]
    assert [v["status"] for v in out.values()] == ["skipped", "done", "done"]
    assert "stage b: resuming after a failed attempt" in capsys.readouterr().out


def killed_after_a_second(ctx):
    """A stage whose process dies (as under kill -9) a second into its attempt, having
    written its progress: the store never sees the attempt end."""
    time.sleep(1.0)
    ctx.progress.update(trees_done=1)
    os._exit(9)


def test_a_resumed_stage_counts_its_earlier_attempts_seconds(tmp_path, capsys):
    """A failed attempt's seconds come from its stage row, a killed one's from the progress
    its process last wrote; both add to the attempt that finishes, and a fresh run (--force)
    counts only its own."""
    calls: list[str] = []
    cfg = fake_cfg()
    with pytest.raises(RuntimeError, match="b broke"):
        run(cfg, tmp_path, counting_stages(calls, fail={"b"}))
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        failed = s.stage("b").seconds
    script = (f"from tests.test_runner import *; run(fake_cfg(), {str(tmp_path)!r}, "
              "[STAGES[0], Stage('b', ('run', 'search'), killed_after_a_second)])")
    killed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=Path(__file__).parents[1])  # where `tests` imports from
    assert killed.returncode == 9, killed.stderr
    capsys.readouterr()
    run(cfg, tmp_path, counting_stages(calls))
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        row = s.stage("b")
    assert f"(+{row.earlier_seconds:.1f}s in earlier attempts)" in capsys.readouterr().out
    assert failed + 1.0 <= row.earlier_seconds < failed + 30  # the killed attempt slept 1 s
    assert row.seconds == row.earlier_seconds + (row.finished_at - row.started_at).total_seconds()
    run(fake_cfg("run.seed=5"), tmp_path, counting_stages(calls), force=True)  # b anew
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert s.stage("b").earlier_seconds == 0.0 and s.stage("b").seconds < 1.0


def test_until_only_and_shards(tmp_path):
    calls: list[str] = []
    cfg = fake_cfg()
    assert list(run(cfg, tmp_path, counting_stages(calls), until="b")) == ["tasks", "b"]
    assert calls == ["b"]
    run(cfg, tmp_path, counting_stages(calls), only="c")
    run(cfg, tmp_path, counting_stages(calls), only="c")  # done: skipped
    assert calls == ["b", "c"]
    run(fake_cfg("search.shard=1/2"), tmp_path, counting_stages(calls), only="c")
    assert calls == ["b", "c", "c"]  # another shard is other work
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert {r.shard for r in s.stages("c")} == {"0/1", "1/2"}
    with pytest.raises(RunError, match="unknown stage 'd'; stages: tasks, b, c"):
        run(cfg, tmp_path, counting_stages(calls), until="d")
    with pytest.raises(RunError, match="--until or --only"):
        run(cfg, tmp_path, counting_stages(calls), until="b", only="c")


def test_only_needs_earlier_stages(tmp_path):
    with pytest.raises(RunError, match="stage 'tasks' has not finished"):
        run(fake_cfg(), tmp_path, counting_stages([]), only="b")


def test_force_clears_every_stage_whose_sections_changed(tmp_path):
    calls: list[str] = []
    run(fake_cfg(), tmp_path, counting_stages(calls))
    with pytest.raises(RunError) as e:
        run(fake_cfg("search.k=2"), tmp_path, counting_stages(calls), until="tasks")
    assert "stage 'b'" in str(e.value) and "stage 'c'" in str(e.value)  # outside the plan too
    run(fake_cfg("search.k=2"), tmp_path, counting_stages(calls), force=True)
    assert calls == ["b", "c", "b", "c"]
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert s.stage("tasks").stats["train"] == 3  # untouched
        assert s.checkpoint("b", "", "ran") is True


def test_stage_must_mark_itself_done(tmp_path):
    stage = Stage("lazy", (), lambda ctx: {"n": 1})
    with pytest.raises(RuntimeError, match="without calling ctx.mark_done"):
        run(fake_cfg(), tmp_path, [stage])


def test_outputs_and_done_mark_commit_together(tmp_path):
    """A crash between writing outputs and finishing leaves neither."""

    def crashes(ctx):
        with ctx.store.transaction():
            ctx.store.insert_tasks([Task("x", "fake", "x")], stage=ctx.stage)
            raise KeyboardInterrupt  # e.g. Ctrl-C before ctx.mark_done

    with pytest.raises(KeyboardInterrupt):
        run(fake_cfg(), tmp_path, [Stage("tasks", (), crashes)])
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert s.tasks() == [] and s.stage("tasks").status == "interrupted"
    assert json.loads((tmp_path / "progress.json").read_text())["status"] == "interrupted"


def test_a_key_added_since_a_run_at_its_default_is_no_change(tmp_path, capsys):
    """Upgrading the code adds config keys; a run made before one existed was made as its
    default makes it, so it is not refused (and not recomputed); a real change still is."""
    import duckdb

    cfg = fake_cfg()
    run(cfg, tmp_path, TASKS_ONLY)
    with duckdb.connect(str(tmp_path / "store.duckdb")) as con:  # as an older version wrote it
        (stored,) = con.execute("SELECT config FROM stages").fetchone()
        stored = json.loads(stored)
        assert stored["run"].pop("seed") == 0
        con.execute("UPDATE stages SET config = ?, config_hash = 'older'", [json.dumps(stored)])
    assert run(cfg, tmp_path, TASKS_ONLY)["tasks"]["status"] == "skipped"
    with pytest.raises(RunError) as e:
        run(fake_cfg("run.seed=3"), tmp_path, TASKS_ONLY)
    assert "run.seed: 0 -> 3" in str(e.value)


def recording(stages: list[Stage], calls: list[str]) -> list[Stage]:
    """The pipeline's own stages (names, sections, views) with `tasks` real and every other
    function replaced by one that records its call."""
    from dataclasses import replace

    def fn(ctx):
        calls.append(ctx.stage)
        ctx.mark_done({})
        return {}

    return [s if s.name == "tasks" else replace(s, fn=fn) for s in stages]


def test_a_stage_that_was_skipped_just_runs_under_a_changed_config(tmp_path):
    """Turning search at inference on after a finished run: the mcts stage was skipped (it
    holds nothing), so it runs without --force, and nothing greedy is redone; a stage that
    holds results still refuses a changed config."""
    from dataclasses import replace

    from pipelines.stages import pipeline

    calls: list[str] = []

    def mcts(ctx):
        calls.append(ctx.stage)
        stats = {} if ctx.cfg.eval.mcts else {"skipped": "eval.mcts is false"}
        ctx.mark_done(stats)
        return stats

    stages = [replace(s, fn=mcts) if s.name == "mcts" else s
              for s in recording(pipeline(1)[:-1], calls)]
    run(fake_cfg(), tmp_path, stages)
    calls.clear()
    run(fake_cfg("eval.mcts=true", "eval.mcts_tasks=1"), tmp_path, stages)
    assert calls == ["mcts"]
    calls.clear()
    with pytest.raises(RunError, match="stage 'mcts' \\(done\\)"):
        run(fake_cfg("eval.mcts=true", "eval.mcts_tasks=2"), tmp_path, stages)
    assert calls == []


def test_more_test_tasks_keep_the_search_and_training(tmp_path):
    """Only eval and mcts read the test tasks: raising env.test_tasks (with --force, as the
    tasks stage changed) redoes tasks, eval and mcts, not search or train."""
    from pipelines.stages import pipeline

    calls: list[str] = []
    stages = recording(pipeline(1)[:-1], calls)
    run(fake_cfg(), tmp_path, stages)
    with pytest.raises(RunError) as e:
        run(fake_cfg("env.test_tasks=3"), tmp_path, stages)
    message = str(e.value)
    assert "stage 'tasks'" in message and "stage 'eval'" in message
    assert "stage 'search'" not in message and "stage 'train'" not in message
    calls.clear()
    run(fake_cfg("env.test_tasks=3"), tmp_path, stages, force=True)
    assert calls == ["eval", "mcts"]
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert len(s.tasks("test")) == 3 and len(s.tasks("train")) == 3


def test_learned_critic_keeps_round_one_search(tmp_path):
    """Round 1 searches with the frozen critic under search.critic learned (none is fitted
    yet), so switching to learned keeps search@1; the critic stage and later ones change."""
    from pipelines.stages import pipeline

    calls: list[str] = []
    stages = recording(pipeline(2)[:-1], calls)
    run(fake_cfg("run.iterations=2"), tmp_path, stages)
    with pytest.raises(RunError) as e:
        run(fake_cfg("run.iterations=2", "search.critic=learned"), tmp_path, stages)
    message = str(e.value)
    assert "stage 'search'" not in message and "stage 'baseline'" not in message
    assert "stage 'critic'" in message and "stage 'search@2'" in message
    assert "search.critic: 'frozen' -> 'learned'" in message
    calls.clear()
    run(fake_cfg("run.iterations=2", "search.critic=learned"), tmp_path, stages, force=True)
    assert "search" not in calls and "critic" in calls and "search@2" in calls
    calls.clear()
    run(fake_cfg("run.iterations=2", "search.critic=none"), tmp_path, stages, force=True)
    assert "search" in calls  # no critic at all does change round 1's search


def test_force_clears_the_report_and_its_files_with_what_it_clears(tmp_path, capsys):
    """The report lists no sections, so no config change reaches it: --force must clear it
    (and RUN_DIR/report) whenever it clears an earlier stage, or `status` shows it done over
    adapters that no longer exist."""
    from pipelines.stages import pipeline

    calls: list[str] = []

    def report(ctx):
        (ctx.run_dir / "report").mkdir()
        (ctx.run_dir / "report" / "index.html").write_text("rows of the old adapters")
        ctx.mark_done({})
        return {}

    stages = [replace(s, fn=report) if s.name == "report" else s
              for s in recording(pipeline(1), calls)]
    run(fake_cfg(), tmp_path, stages)
    run(fake_cfg("train.lr=0.001"), tmp_path, stages, until="eval", force=True)
    out = capsys.readouterr().out
    assert "stage report: reads what --force cleared (train, grpo, eval, mcts)" in out
    with Store(tmp_path / "store.duckdb", read_only=True) as s:
        assert s.stage("report") is None and s.stage("train").status == "done"
    assert not (tmp_path / "report").exists()
    calls.clear()
    run(fake_cfg("train.lr=0.001"), tmp_path, stages)  # mcts and the report are left to do
    assert calls == ["mcts"] and (tmp_path / "report" / "index.html").exists()


def test_a_wrong_env_is_one_error_before_anything_is_written(tmp_path):
    """A wrong env.name, a missing class or a constructor keyword the env does not take is a
    ConfigError naming it, with no run directory made; so the fixed name just runs."""
    from pipelines.config import ConfigError

    cases = [("env.name=nosuch.mod:Env", "No module named 'nosuch'"),
             ("env.name=tests.fakes:NoSuchEnv", "has no attribute 'NoSuchEnv'"),
             ("env.name=tests.fakes:fake_cfg", "fake_cfg is not a usable TRL environment"),
             ("env.kwargs={max_stepz: 3}", "unexpected keyword argument 'max_stepz'")]
    for override, message in cases:
        with pytest.raises(ConfigError, match=message):
            run(fake_cfg(override), tmp_path / "r", TASKS_ONLY)
        assert not (tmp_path / "r").exists()
    assert run(fake_cfg(), tmp_path / "r", TASKS_ONLY)["tasks"]["status"] == "done"


def test_a_run_dir_that_is_a_file_is_refused_in_words(tmp_path):
    (tmp_path / "r").write_text("notes")
    with pytest.raises(RunError, match="is a file, not a run directory"):
        run(fake_cfg(), tmp_path / "r", TASKS_ONLY)
