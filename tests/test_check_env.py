"""`offline-agent check-env`: passes on the built-in envs and on the guide's example env
(taken from docs/environments.md as written), and names the failed check for envs broken
on purpose, one contract rule each."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

from offline_agent.envs.base import StepResult, load_env
from offline_agent.envs.testing.check import check_env
from offline_agent.types import Task
from pipelines.cli import main

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "environments.md"


@pytest.fixture(scope="module")
def lamps(tmp_path_factory):
    """The guide's example env, written to an importable module `lamps_guide`."""
    text = GUIDE.read_text()
    section = text[text.index("## Bring your own environment"):]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    folder = tmp_path_factory.mktemp("plugin")
    (folder / "lamps_guide.py").write_text(code)
    sys.path.insert(0, str(folder))
    import lamps_guide

    yield lamps_guide
    sys.path.remove(str(folder))


def _table(capsys) -> dict[str, str]:
    return _table_of(capsys.readouterr().out)


def _table_of(out: str) -> dict[str, str]:
    return {name: mark for name, mark in re.findall(r"^(\S.*?)\s{2,}(pass|FAIL|skip)\b", out, re.M)}


@pytest.mark.parametrize("name", ["math", "minishop"])
def test_builtin_envs_pass(name, capsys):
    assert main(["check-env", name]) == 0
    out = capsys.readouterr().out
    table = _table_of(out)
    assert len(table) == 8 and "FAIL" not in table.values()
    assert table["demonstration"] == "pass"
    assert table["hindsight"] == ("pass" if name == "minishop" else "skip")
    # a skipped check is counted as skipped, not passed
    verdict = {"math": "math: 7 passed, 1 skipped: hindsight",
               "minishop": "minishop: all checks passed"}
    assert out.splitlines()[-1] == verdict[name]


def test_python_env_passes_with_the_real_sandbox():
    def make_env():  # a random model's replies run to the budget: 96 tokens close as 320 do
        env = load_env("python")
        env.max_action_tokens = 96
        return env

    results = check_env(make_env, n_fuzz=40)
    assert [r.ok for r in results] == [True, True, True, True, None, True, True, True], results


def test_the_guides_example_env_passes(lamps, capsys):
    assert main(["check-env", "lamps_guide:Lamps", "--kwargs", '{"max_steps": 8}']) == 0
    assert set(_table(capsys).values()) == {"pass"}


def test_bad_env_spec_or_kwargs_is_one_error_line(capsys):
    assert main(["check-env", "no_such_module:Env"]) == 2
    assert main(["check-env", "math", "--kwargs", "[1]"]) == 2
    assert main(["check-env", "math", "--kwargs", '{"colour": 1}']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("offline-agent: error:") for line in err)


# ---- envs broken on purpose: each must fail exactly the check for its rule ------------------


def _broken(lamps):
    Lamps = lamps.Lamps

    class UnseededTasks(Lamps):
        def tasks(self, split, n):
            tasks = super().tasks(split, n)
            random.shuffle(tasks)  # the global RNG: another order every call
            return tasks

    class SharedSplits(Lamps):
        def tasks(self, split, n):
            return [Task(f"{t.id}-{split}", t.env, t.instruction, split, t.data)
                    for t in super().tasks("train", n)]

    class UntypedTool(Lamps):
        tools = [{"type": "function", "function": {
            "name": "toggle", "description": "x",
            "parameters": {"type": "object", "properties": {"lamp": {}}, "required": ["lamp"]}}}]

    class ForgetfulRestore(Lamps):
        def restore(self, blob):
            super().restore(blob)
            self.state = {"on": [], "finished": False}  # drops what the snapshot held

    class CountedOutside(Lamps):
        """Counts toggles outside self.state, read only by a tool no probe action calls: a
        restored env starts its count again (search would branch from wrong observations)."""

        tools = [*Lamps.tools, {"type": "function", "function": {
            "name": "count", "description": "How many toggles so far.",
            "parameters": {"type": "object", "properties": {}, "required": []}}}]

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.toggles = 0

        def _reset(self, task):
            self.toggles = 0
            return super()._reset(task)

        def _execute(self, call):
            if call.name == "count":
                return StepResult(f"{self.toggles} toggles so far")
            result = super()._execute(call)
            self.toggles += call.name == "toggle"
            return result

        def available_actions(self):
            offered = super().available_actions()
            return offered + ["count"] if offered else []

    class HugeObservation(Lamps):
        def _execute(self, call):
            result = super()._execute(call)
            result.observation *= 2000
            return result

    class RaisingAct(Lamps):
        def act(self, text):
            if "[" * 100 in text:
                raise RecursionError("maximum recursion depth exceeded")
            return super().act(text)

    class WrongHindsight(Lamps):
        def achieved_task(self):
            task = super().achieved_task()
            return task and Task(task.id, task.env, task.instruction, task.split,
                                 {"on": [*task.data["on"], "violet"]})

    class FailingDemo(Lamps):
        def demo_episode(self):
            task, actions = super().demo_episode()
            return task, actions[:-1] + ["toggle[red]", "done"]

    class InvalidDemoStep(Lamps):
        def demo_episode(self):  # still reaches reward 1: the invalid step changes nothing
            task, actions = super().demo_episode()
            return task, ["toggle[purple]", *actions]

    class StopEatsBracket(Lamps):
        stop = ["]\n"]  # the policy drops the stop string: "toggle[red" is what arrives

    class HandWrittenDemo(Lamps):
        def demonstration(self):
            from offline_agent.types import Message

            return [Message("user", "hi"), Message("assistant", "done")]

        def demo_episode(self):
            return None

    class RefusedDemo(Lamps):
        call_syntax = {"toggle": "call"}  # the demonstration writes toggle[...]

    class BracketInEnum(Lamps):
        def action_tools(self):  # bracket text ends at the value's own `]`: "red" comes back
            toggle = self.tools[0]["function"]
            lamp = {**toggle["parameters"]["properties"]["lamp"], "enum": ["red]x"]}
            params = {**toggle["parameters"], "properties": {"lamp": lamp}}
            return [{"type": "function", "function": {**toggle, "parameters": params}}]

    return {
        "demonstration in grammar": [RefusedDemo],
        "constrained sampling": [BracketInEnum],
        "tasks": [UnseededTasks, SharedSplits],
        "tool schemas": [UntypedTool],
        "snapshot/restore": [ForgetfulRestore, CountedOutside],
        "fuzzed text": [HugeObservation, RaisingAct],
        "hindsight": [WrongHindsight],
        "demonstration": [FailingDemo, StopEatsBracket, HandWrittenDemo, InvalidDemoStep],
    }


@pytest.mark.parametrize("check", ["tasks", "tool schemas", "snapshot/restore", "fuzzed text",
                                   "hindsight", "demonstration", "demonstration in grammar",
                                   "constrained sampling"])
def test_broken_envs_fail_the_check_they_break(check, lamps, capsys):
    for cls in _broken(lamps)[check]:
        setattr(lamps, cls.__name__, cls)  # importable as lamps_guide:<name>
        assert main(["check-env", f"lamps_guide:{cls.__name__}"]) == 1, cls.__name__
        out = capsys.readouterr().out
        failed = {n for n, mark in re.findall(r"^(\S.*?)\s{2,}(pass|FAIL|skip)\b", out, re.M)
                  if mark == "FAIL"}
        assert check in failed, (cls.__name__, out)
        assert "FAILED: " in out.splitlines()[-1] and check in out.splitlines()[-1]
