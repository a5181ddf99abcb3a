"""A user's first own run, played as a script (issue 43): an env written in a fresh folder,
check-env, a wrong env path then the fixed one, a tiny run, a change of mine.theta that
mines no step pairs (--force), a grpo.init that can no longer be honoured, export and
`load_dataset` of every config, and `status` at each point. Every mistake is one line on
stderr and exit code 2; nothing a user did wrong leaves the run stuck."""

from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.cli import main

pytestmark = pytest.mark.slow  # a whole run, twice in part: collected first (tests/conftest.py)

ENV = '''
"""A small file-system world: create the file the task names, then finish."""

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.types import Task, ToolCall

NAMES = ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt", "f.txt", "g.txt", "h.txt"]


def _tool(name, description, params):
    return {"type": "function", "function": {"name": name, "description": description,
            "parameters": {"type": "object", "required": list(params),
                           "properties": {p: {"type": "string"} for p in params}}}}


class FsWorld(Env):
    name = "fsworld"
    tools = [_tool("touch", "create a file", ["path"]), _tool("ls", "list the files", []),
             _tool("finish", "end the episode", [])]
    max_action_tokens = 16

    def tasks(self, split, n):
        names = NAMES[:4] if split == "train" else NAMES[4:]
        return [Task(f"fs-{split}-{i}", self.name, f"Create {names[i % 4]}, then finish.",
                     split, {"want": names[i % 4]}) for i in range(n)]

    def system_prompt(self):
        return "Tools: touch[path], ls, finish. One action per reply."

    def _reset(self, task):
        self.state = {"files": [], "over": False}
        return "The folder is empty."

    def _execute(self, call: ToolCall) -> StepResult:
        if self.state["over"]:
            raise ActionError("the episode is over")
        if call.name == "touch":
            self.state = {**self.state, "files": sorted({*self.state["files"],
                                                         call.arguments["path"]})}
            return StepResult("Files: " + ", ".join(self.state["files"]))
        if call.name == "ls":
            return StepResult("Files: " + (", ".join(self.state["files"]) or "none"))
        self.state = {**self.state, "over": True}
        solved = self.state["files"] == [self.task.data["want"]]
        return StepResult("Done.", reward=1.0 if solved else 0.0, done=True)

    def available_actions(self):
        return [] if self.state["over"] else [f"touch[{n}]" for n in NAMES[:4]] + ["ls", "finish"]

    def demo_episode(self):
        task = self.tasks("train", 1)[0]
        return task, [f"touch[{task.data['want']}]", "finish"]
'''

CONFIG = """\
run: {{name: first}}
model: {{id: {model}, device: cpu}}
env:
  name: fsworld_first:FsWorld
  kwargs: {{max_steps: 3}}
  train_tasks: 3
  test_tasks: 2
search: {{simulations: 2, k: 2, max_depth: 2, trees_per_batch: 4}}
train: {{policies: [rft, dpo_step], max_steps: 1}}
"""


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def one_error(err: str, says: str) -> None:
    """A user mistake: one line on stderr that says what is wrong, no traceback."""
    (line,) = err.strip().splitlines()
    assert line.startswith("offline-agent: error: ") and says in line, err


def stage_lines(out: str) -> dict[str, str]:
    """`status`'s stage lines: name -> the rest of the line."""
    return {m[0]: m[1] for m in re.findall(r"^  (\S+)(?: \[0/1\])?\s+(.*)$", out, re.M)
            if m[0] != "rows:"}


@pytest.fixture
def folder(tmp_path, monkeypatch, tiny_model_dir) -> Path:
    """The user's folder: their env module and config, the current folder, not on
    sys.path (the CLI must put it there, as `python -m` does)."""
    (tmp_path / "fsworld_first.py").write_text(textwrap.dedent(ENV))
    (tmp_path / "first.yaml").write_text(CONFIG.format(model=tiny_model_dir))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "fsworld_first", raising=False)
    yield tmp_path
    sys.modules.pop("fsworld_first", None)


def test_a_first_run_of_ones_own_env(folder, capsys):
    from datasets import load_dataset

    from pipelines.export import CONFIGS

    # check-env: the skipped hindsight check is counted as skipped, not passed
    code, out, _ = cli(capsys, "check-env", "fsworld_first:FsWorld", "--kwargs",
                       '{"max_steps": 3}')
    assert code == 0, out
    assert out.splitlines()[-1] == "fsworld_first:FsWorld: 7 passed, 1 skipped: hindsight"

    code, _, err = cli(capsys, "status", "runs/first")
    assert code == 2
    one_error(err, "run directory runs/first does not exist")

    # a wrong path, a missing class, a bad keyword: one line each, nothing written
    for override, says in [("env.name=fs_world:FsWorld", "No module named 'fs_world'"),
                           ("env.name=fsworld_first:FSWorld", "has no attribute 'FSWorld'"),
                           ("env.kwargs={max_stepz: 3}", "unexpected keyword argument")]:
        code, _, err = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first", "--set",
                           override)
        assert code == 2
        one_error(err, says)
        assert not Path("runs").exists()

    # the fixed config just runs
    code, out, _ = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first")
    assert code == 0 and "stage report: done" in out
    code, out, _ = cli(capsys, "status", "runs/first")
    lines = stage_lines(out)
    assert list(lines) == ["tasks", "baseline", "search", "critic", "mine", "export", "train",
                           "grpo", "eval", "mcts", "report"]
    assert all(line.startswith("done") and "{" not in line for line in lines.values()), out
    assert lines["tasks"].endswith("fsworld: 3 train, 2 test tasks")
    assert re.search(r"solved \d/3 train tasks \(greedy \d\)", lines["search"])
    assert "critic_concordance" not in out and "'concordance': None" not in out
    code, out, _ = cli(capsys, "status", "runs/first", "--verbose")
    assert "'greedy_n_tasks': 3" in out

    # the user raises mine.theta past any gap: --force re-mines, clears what follows
    code, out, err = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first", "--set",
                         "mine.theta=2", "--until", "export")
    assert code == 2
    assert "mine.theta: 0.1 -> 2.0" in err and "--force" in err
    assert "cleared" not in out  # a refused command changes nothing, skip-only stages included
    assert stage_lines(cli(capsys, "status", "runs/first")[1])["grpo"].startswith("done")
    code, out, err = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first", "--set",
                         "mine.theta=2", "--force", "--until", "export")
    assert code == 0
    assert "stage report: reads what --force cleared" in out
    assert "mine: no step pairs: mine.theta=2.0 is above 1" in out and "lower it" in out
    assert "warning: config 'pairs' left out of the dataset" in err
    assert not Path("runs/first/report").exists()
    out = cli(capsys, "status", "runs/first")[1]
    lines = stage_lines(out)
    assert lines["mine"].startswith("done") and "step pairs 0" in lines["mine"]
    assert re.search(r"^ {25}no step pairs: mine.theta=2.0 is above 1", out, re.M)  # under mine
    assert all(lines[s] == "not run" for s in ("train", "grpo", "eval", "mcts", "report")), lines

    code, _, err = cli(capsys, "report", "runs/first")  # no eval left: no empty report
    assert code == 2
    one_error(err, "has no evaluation episodes yet")

    # grpo from dpo_step, which has nothing to train on: named at train, before training
    code, out, err = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first", "--set",
                         "mine.theta=2", "--set", "grpo.enabled=true")
    assert code == 2
    one_error(err, "grpo.init=dpo_step, but stage train cannot train 'dpo_step', no training "
                   "data: no step pairs were mined; mine.theta=2.0 is above 1")
    assert "stage train: done" not in out
    lines = stage_lines(cli(capsys, "status", "runs/first")[1])
    assert lines["train"].startswith("failed") and "grpo.init=dpo_step" in lines["train"]

    # without grpo, the run finishes: dpo_step skipped, saying why
    code, out, _ = cli(capsys, "run", "first.yaml", "--run-dir", "runs/first", "--set",
                       "mine.theta=2")
    assert code == 0
    assert "train: dpo_step: skipped, no training data: no step pairs were mined; mine." in out
    lines = stage_lines(cli(capsys, "status", "runs/first")[1])
    assert all(line.startswith("done") for line in lines.values()), lines
    assert "dpo_step skipped (no step pairs were mined)" in lines["train"]

    # export: every config the card lists loads; the empty ones are named, not broken
    code, out, err = cli(capsys, "export", "runs/first", "--out", "ds")
    assert code == 0
    counts = {c: int(n) for c, n in re.findall(r"(\w+) (\d+)", out.split("rows: ")[1])}
    assert counts["pairs"] == 0 and counts["hindsight"] == 0 and counts["rft"] > 0
    assert err.count("warning: config") == 2
    for config in CONFIGS:
        if counts[config]:
            data = load_dataset("ds", config, split="train", cache_dir=str(folder / "hf"))
            assert len(data) == counts[config]
        else:
            with pytest.raises(ValueError, match=config):
                load_dataset("ds", config, split="train", cache_dir=str(folder / "hf"))
    capsys.readouterr()  # datasets' progress bars

    # missing, file and foreign run directories: the same words from every command
    Path("notes.txt").write_text("x")
    for command in (["status"], ["report"], ["export", "--out", "ds2"]):
        code, _, err = cli(capsys, *command[:1], "nowhere", *command[1:])
        assert code == 2
        one_error(err, "run directory nowhere does not exist")
        code, _, err = cli(capsys, *command[:1], "notes.txt", *command[1:])
        one_error(err, "notes.txt is a file, not a run directory")
    code, _, err = cli(capsys, "run", "first.yaml", "--run-dir", "notes.txt")
    one_error(err, "notes.txt is a file, not a run directory")

    # no CONFIG: every key at its default, --set for the rest
    code, out, _ = cli(capsys, "run", "--run-dir", "runs/defaults", "--until", "tasks",
                       "--set", "env.name=fsworld_first:FsWorld")
    assert code == 0 and "fsworld: 32 train, 16 test tasks" in out


def test_the_guides_tiny_run_config_loads_as_written():
    """docs/environments.md's first.yaml: every key it names exists and takes its value."""
    import yaml

    from pipelines.config import RunConfig

    guide = (Path(__file__).resolve().parents[1] / "docs" / "environments.md").read_text()
    text = re.search(r"```yaml\n(# first.yaml\n.*?)```", guide, re.DOTALL).group(1)
    cfg = RunConfig.from_dict(yaml.safe_load(text))
    assert cfg.env.name == "lamps:Lamps" and cfg.env.train_tasks == 4
    assert (cfg.search.simulations, cfg.train.epochs, cfg.model.device) == (4, 1, "cpu")
