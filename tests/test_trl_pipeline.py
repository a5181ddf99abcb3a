"""The two TRL-shaped example envs (examples/trl_envs: written from TRL's own documentation, no
import from this project) through check-env and a whole tiny run: search, mine, export, train,
eval and the report, on the tiny random model. Search's proposals are scripted tool calls (a
random model writes no call), so the trees branch and mining finds pairs; every other model
call is the tiny model's, and the counter's run decodes under the tool-call grammar."""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import pytest

from pipelines.cli import main
from storage import Store
from tests.fakes import scripted_sample

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "trl_envs"


def tag(name: str, **arguments) -> str:
    args = ", ".join(f'"{k}": {v!r}'.replace("'", '"') for k, v in arguments.items())
    return f'<tool_call>{{"name": "{name}", "arguments": {{{args}}}}}</tool_call>'


ENVS = {
    "counter": {
        "check": ["counter:CounterEnv", "--dataset", "examples/trl_envs/counter.jsonl"],
        "constrain": "tools",
        "actions": [tag("increment", step=1), tag("increment", step=2), tag("increment", step=3),
                    tag("decrement", step=1), tag("increment", step=4), "That is all."],
    },
    "wordle": {
        "check": ["wordle:WordleEnv", "--dataset", "examples/trl_envs/wordle.jsonl",
                  "--reward-fn", "wordle:reward_func"],
        "constrain": "none",
        "actions": [tag("guess", guess=w) for w in ("plant", "grape", "ghost", "crisp", "plank")]
        + ["guess[xyz]", "I give up."],
    },
}
TINY = ["env.kwargs={max_steps: 4}", "env.train_tasks=4", "env.test_tasks=2",
        "search.simulations=4", "search.max_depth=4", "search.trees_per_batch=4",
        "train.policies=[dpo_step]", "train.max_steps=2", "train.batch_size=4"]


@pytest.fixture(autouse=True)
def in_the_repository(monkeypatch):
    """The examples' configs and commands name their files from the repository root."""
    monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


@pytest.mark.parametrize("name", ENVS)
def test_check_env_passes_on_the_example(name, capsys):
    assert main(["check-env", *ENVS[name]["check"], "--kwargs", '{"max_steps": 4}']) == 0
    out = capsys.readouterr().out
    marks = dict(re.findall(r"^(\S.*?)\s{2,}(pass|FAIL|skip)\b", out, re.M))
    assert marks["snapshot/restore"] == marks["constrained sampling"] == "pass"
    assert "FAIL" not in marks.values() and marks["hindsight"] == marks["demonstration"] == "skip"


@pytest.mark.parametrize("name", ENVS)
def test_a_tiny_run_searches_mines_exports_trains_and_evaluates(name, tmp_path, tiny_model_dir,
                                                                 monkeypatch):
    from offline_agent.policy.hf import HFPolicy

    spec = ENVS[name]
    monkeypatch.setattr(HFPolicy, "sample", scripted_sample(spec["actions"]))
    model = [f"model.id={tiny_model_dir}", "model.device=cpu", f"model.constrain={spec['constrain']}"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):  # the example's config as written, made tiny
        code = main(["run", f"examples/trl_envs/{name}.yaml", "--run-dir", str(tmp_path / "r"),
                     *[a for o in model + TINY for a in ("--set", o)]])
    assert code == 0, out.getvalue()[-2000:]
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as store:
        stages = {s.stage: s for s in store.stages()}
        search, mine = stages["search"].stats, stages["mine"].stats
        train, evaluation = stages["train"].stats, stages["eval"].stats
        trees = {t.tree_id: t for t in store.trees()}
        nodes = [n for tid in trees for n in store.load_tree(tid)]
    assert search["trees"] == 4 and search["nodes"] > 8
    assert all(set(n.snapshot) == {"task", "num_steps", "reset", "actions"} for n in nodes)
    assert search["tasks_solved_by_search"] > 0  # get_reward() / the reward function scored
    assert mine["step_pairs"] > 0
    assert stages["export"].stats["pairs"] == mine["step_pairs"]
    assert train["dpo_step"]["step"] == 2 and train["dpo_step"]["items"] == mine["step_pairs"]
    assert evaluation["base"]["n_tasks"] == evaluation["dpo_step"]["n_tasks"] == 2
    assert (tmp_path / "r" / "report" / "index.html").exists()
    _export_is_a_dataset(tmp_path / "r" / "export", mine["step_pairs"], tmp_path / "cache")


def _export_is_a_dataset(folder: Path, pairs: int, cache: Path) -> None:
    """The exported pairs read back with `datasets`, the tool calls as the env's tools."""
    import datasets

    data = datasets.load_dataset(str(folder), "pairs", split="train", cache_dir=str(cache))
    assert len(data) == pairs
    assert data[0]["prompt"][0]["role"] == "system" and "<tool_call>" in data[0]["prompt"][0]["content"]
