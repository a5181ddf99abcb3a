"""TRL-shaped environments, adapted as TRL's GRPOTrainer runs them (offline_agent/envs/trl):
the tools are transformers' own specs of the methods, reset() gets the row and its text follows
the instruction, a raising method is an invalid step, a reply without a tool call ends the
episode and the reward is get_reward() or a TRL reward function; tasks come from a dataset in
any format `datasets` reads; a malformed class is named one problem per line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from offline_agent.chat import history_messages
from offline_agent.envs.trl import ShapeError, build_env
from pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "trl_envs"
HERE = "tests.test_trl_env"


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    """The example envs import as TRL users run them: `counter`, `wordle` on the path."""
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def counter(**kwargs):
    return build_env("counter:CounterEnv", str(EXAMPLES / "counter.jsonl"), **kwargs)


def wordle(**kwargs):
    return build_env("wordle:WordleEnv", str(EXAMPLES / "wordle.jsonl"), "wordle:reward_func",
                     **kwargs)


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# ---- classes shaped as TRL users write them, importable as tests.test_trl_env:<name> ----------
class Recorder:
    """Keeps what reset received; one tool that echoes and one that raises."""

    def reset(self, **kwargs) -> str | None:
        self.kwargs = kwargs
        self.said = []
        return " Say something."

    def say(self, text: str) -> str:
        """
        Say something.

        Args:
            text: What to say.
        """
        self.said.append(text)
        return f"you said {text}"

    def fail(self) -> str:
        """Always refuses."""
        raise ValueError("not today")

    def get_reward(self) -> float:
        return float(len(self.said))


SEEN: list[dict] = []  # what the recording reward function received


def recording_reward(prompts, completions, environments, **kwargs) -> list[float]:
    SEEN.append({"prompts": prompts, "completions": completions, "environments": environments,
                 **kwargs})
    return [0.5]


class NoReward(Recorder):
    get_reward = None  # TRL probes functions of the class: this one has no get_reward


class Broken:
    """No reset, a tool whose docstring has no Args: entry for its argument, a text reward."""

    def move(self, direction: str) -> str:
        """Move somewhere."""
        return direction

    def get_reward(self) -> float:
        return "won"


class TextReward(Recorder):
    def get_reward(self) -> float:
        return "won"


def rows_file(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"prompt": [{"role": "user", "content": f"Task {i}."}], "colour": c, "split": s}
        for i, (c, s) in enumerate([("red", "train"), ("blue", "train"), ("green", "test")])]


def recorder(tmp_path, name="Recorder", reward_fn=None, rows=ROWS, **kwargs):
    return build_env(f"{HERE}:{name}", rows_file(tmp_path, rows), reward_fn, **kwargs)


# ---- the adapter ---------------------------------------------------------------------------
def test_tools_are_the_specs_transformers_builds_for_trl():
    from transformers.utils import get_json_schema

    env, instance = counter(), __import__("counter").CounterEnv()
    specs = [get_json_schema(getattr(instance, n)) for n in ("decrement", "increment")]
    assert env.tools == specs and env.name == "CounterEnv"
    assert all(json.dumps(s) in env.system_prompt() for s in specs)
    assert env.tool_syntax() == {"decrement": "tag", "increment": "tag"}


def test_reset_gets_the_whole_row_and_its_text_follows_the_instruction(tmp_path):
    env = recorder(tmp_path)
    task = env.tasks("train", 1)[0]
    first = env.reset(task)
    assert env.state.env.kwargs == ROWS[0]  # every column, prompt included, as TRL passes them
    assert task.instruction == "Task 0." and first == " Say something."
    user = history_messages("sys", task.instruction, first, [])[1]
    assert user.content == "Task 0.\n\n Say something."
    assert env.state.prompt == [{"role": "user", "content": "Task 0. Say something."}]  # TRL's


def test_a_raising_tool_is_an_invalid_step_with_its_message_and_the_episode_goes_on(tmp_path):
    env = recorder(tmp_path)
    env.reset(env.tasks("train", 1)[0])
    c, result = env.act(call("fail"))
    assert c.name == "fail" and result.invalid and not result.done
    assert result.observation == "Invalid action: not today"
    _, result = env.act(call("say", text="hi"))
    assert result.observation == "you said hi" and not result.invalid


def test_a_reply_without_a_tool_call_ends_the_episode_with_get_reward(tmp_path):
    env = recorder(tmp_path)
    env.reset(env.tasks("train", 1)[0])
    env.act(call("say", text="a"))
    env.act('say(text="b")')  # any form the parser reads is a call
    c, result = env.act("I have said enough.")
    assert c is None and result.done and result.reward == 2.0 and not result.invalid
    _, after = env.act(call("say", text="c"))
    assert after.invalid and "over" in after.observation and env.state.env.said == ["a", "b"]


def test_the_step_limit_ends_the_episode_and_scores_it(tmp_path):
    env = recorder(tmp_path, max_steps=2)
    env.reset(env.tasks("train", 1)[0])
    env.act(call("say", text="a"))
    _, result = env.act(call("say", text="b"))
    assert result.done and result.info["truncated"] and result.reward == 2.0


def test_a_reward_function_gets_trls_arguments(tmp_path):
    SEEN.clear()
    env = recorder(tmp_path, "NoReward", f"{HERE}:recording_reward")
    env.reset(env.tasks("train", 1)[0])
    env.act(call("say", text="a"))
    _, result = env.act("done")
    assert result.reward == 0.5
    seen = SEEN[-1]
    assert seen["prompts"] == [[{"role": "user", "content": "Task 0. Say something."}]]
    assert seen["completions"] == [[
        {"role": "assistant", "content": call("say", text="a"), "tool_calls": [
            {"type": "function", "function": {"name": "say", "arguments": {"text": "a"}}}]},
        {"role": "tool", "name": "say", "content": "you said a"},
        {"role": "assistant", "content": "done"}]]
    assert seen["environments"] == [env.state.env] and seen["trainer_state"] is None
    assert seen["colour"] == ["red"] and seen["split"] == ["train"] and "prompt" not in seen


# ---- tasks from a dataset ------------------------------------------------------------------
def test_the_split_column_decides_and_val_rows_follow_the_train_rows():
    env = counter()
    train, test = env.tasks("train", 50), env.tasks("test", 50)
    assert [t.data["target"] for t in train] == [2, 3, 4, 5, 6, 7, 8, 9, 1]  # val last
    assert [t.data["target"] for t in test] == [10, 11]
    assert [t.id for t in env.tasks("train", 3)] == ["CounterEnv-0", "CounterEnv-1", "CounterEnv-2"]


def test_without_a_split_column_a_seeded_split_puts_each_row_in_one_split():
    def split(seed):
        env = wordle(seed=seed)
        return [t.id for t in env.tasks("train", 99)], [t.id for t in env.tasks("test", 99)]

    train, test = split(0)
    assert split(0) == (train, test) and len(train) + len(test) == 16
    assert not set(train) & set(test) and test
    assert split(1) != (train, test)  # run.seed draws another split


def test_every_format_datasets_reads_gives_the_same_tasks(tmp_path):
    import datasets

    rows = [{"prompt": f"Task {i}.", "colour": c} for i, c in enumerate(["red", "blue", "teal"])]
    data = datasets.Dataset.from_list(rows)
    data.to_csv(tmp_path / "rows.csv", index=False)
    data.to_parquet(tmp_path / "rows.parquet")
    data.save_to_disk(tmp_path / "saved")
    paths = [rows_file(tmp_path, rows), tmp_path / "rows.csv", tmp_path / "rows.parquet",
             tmp_path / "saved"]
    got = [[t.to_dict() for s in ("train", "test")
            for t in build_env(f"{HERE}:Recorder", str(p)).tasks(s, 9)] for p in paths]
    assert got[0] and all(g == got[0] for g in got)
    assert sorted(t["instruction"] for t in got[0]) == ["Task 0.", "Task 1.", "Task 2."]


def test_a_bad_dataset_is_one_line_naming_the_row(tmp_path):
    with pytest.raises(ShapeError, match=r"row 1: split 'dev' is not one of"):
        recorder(tmp_path, rows=[ROWS[0], {**ROWS[1], "split": "dev"}])
    with pytest.raises(ShapeError, match="does not exist"):
        build_env(f"{HERE}:Recorder", str(tmp_path / "missing.jsonl"))
    with pytest.raises(ShapeError, match="no env.dataset"):
        build_env(f"{HERE}:Recorder")
    with pytest.raises(ShapeError, match="for TRL environment classes"):
        build_env("math", str(tmp_path / "x.jsonl"))


# ---- check-env -----------------------------------------------------------------------------
def test_check_env_names_each_problem_on_a_line_of_its_own(tmp_path, capsys):
    path = rows_file(tmp_path, ROWS)
    assert main(["check-env", f"{HERE}:Broken", "--dataset", path]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"offline-agent: error: {HERE}:Broken is not a usable TRL environment:"
    assert lines[1].strip().startswith("no reset(**kwargs) method")
    assert lines[2].strip() == ("tool move: Cannot generate JSON schema for move because the "
                                "docstring has no description for the argument 'direction'")
    assert len(lines) == 3
    assert main(["check-env", f"{HERE}:TextReward", "--dataset", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[1].strip() == "TextReward.get_reward() returned 'won' (str), not a float"
    assert main(["check-env", f"{HERE}:NoReward", "--dataset", path]) == 2
    assert "no get_reward() method and no env.reward_fn" in capsys.readouterr().err


def test_a_run_with_a_broken_class_stops_with_the_same_lines(tmp_path, capsys):
    config = tmp_path / "broken.yaml"
    config.write_text(f"env: {{name: '{HERE}:Broken', dataset: '{rows_file(tmp_path, ROWS)}'}}\n")
    assert main(["run", str(config), "--run-dir", str(tmp_path / "r"), "--until", "tasks"]) == 2
    assert "no reset(**kwargs) method" in capsys.readouterr().err


def test_the_guides_example_is_the_example_the_tests_run():
    """docs/environments.md shows examples/trl_envs as they are (test_trl_pipeline runs them)."""
    import re

    text = (ROOT / "docs" / "environments.md").read_text()
    section = text[text.index("## Bring a TRL environment"):text.index("### Branching by replay")]
    code, rows, config = re.findall(r"```(?:python|yaml)?\n(.*?)```", section, re.DOTALL)[:3]
    assert code == (EXAMPLES / "counter.py").read_text()
    assert config == (EXAMPLES / "counter.yaml").read_text()
    assert rows.splitlines() == (EXAMPLES / "counter.jsonl").read_text().splitlines()[:2]
    assert "import" not in code and "offline_agent" not in (EXAMPLES / "wordle.py").read_text()
