"""Branching by replay (offline_agent/envs/replay.py): a tree grown by replaying actions equals
the tree grown from deep copies and the tree grown from JSON snapshots; copies keep replay to
stored trees; an env that answers a replay otherwise is a clear error naming task and step."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path

import pytest

from offline_agent.envs.base import ActionError, EnvStateError, StepResult
from offline_agent.envs.replay import NotDeterministic, ReplayEnv
from offline_agent.envs.testing.check import check_round_trip
from offline_agent.envs.trl import build_env
from offline_agent.search.config import SearchConfig
from offline_agent.search.mcts import Tree
from offline_agent.search.persist import node_row, resume_trees
from offline_agent.search.searcher import Searcher
from offline_agent.types import ToolCall
from storage.rows import TreeRow
from tests.fakes import Corridor, ScriptedPolicy

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "trl_envs"
GUESSES = ["crane", "plant", "slate", "plank", "brick"]
ACTIONS = [*(f'<tool_call>{{"name": "guess", "arguments": {{"guess": "{w}"}}}}</tool_call>'
             for w in GUESSES), "guess[pl]", "I give up."]
CFG = SearchConfig(simulations=6, k=3, max_depth=4, trees_per_batch=2)


@pytest.fixture(scope="module")
def wordle_module():
    sys.path.insert(0, str(EXAMPLES))
    import wordle

    yield wordle
    sys.path.remove(str(EXAMPLES))


def make_wordle(copies: bool):
    def make_env():
        env = build_env("wordle:WordleEnv", str(EXAMPLES / "wordle.jsonl"), "wordle:reward_func",
                        max_steps=4)
        env.keep_copies = copies
        return env

    return make_env


def grow(make_env, tokenizer, actions=ACTIONS, n=3) -> list[Tree]:
    tasks = make_env().tasks("train", n)
    trees = [Tree.new(t, make_env()) for t in tasks]
    Searcher(ScriptedPolicy(tokenizer, actions), make_env, CFG, None).run(
        trees, lambda batch: None, progress=False)
    return trees


def signature(tree: Tree, snapshots: bool = True) -> list[tuple]:
    return [(n.parent, n.action, n.observation, n.reward, n.terminal, n.invalid, n.visits,
             round(n.value_sum, 9), json.dumps(n.snapshot, sort_keys=True) if snapshots else "")
            for n in tree.nodes]


def test_a_tree_grown_by_replay_equals_the_tree_grown_from_deep_copies(
        tokenizer, wordle_module, monkeypatch):
    make_wordle(True)()  # the class is checked once per process, with a reset of its own
    resets = []
    reset = wordle_module.WordleEnv.reset
    monkeypatch.setattr(wordle_module.WordleEnv, "reset",
                        lambda self, **kw: resets.append(kw["secret"]) or reset(self, **kw))
    copied = grow(make_wordle(True), tokenizer)
    by_copies = len(resets)
    resets.clear()
    replayed = grow(make_wordle(False), tokenizer)
    assert [signature(t) for t in replayed] == [signature(t) for t in copied]
    assert sum(len(t.nodes) for t in copied) > 3 * 6  # trees that branch, not single paths
    assert {n.reward for t in copied for n in t.nodes} >= {0.0, 1.0}
    # with copies, each tree resets once to start and once where its search begins (another
    # env object); replay resets at every restore
    assert by_copies == 2 * 3 and len(resets) > 10 * by_copies


def test_a_stored_tree_is_replayed_and_checked_on_resume(tokenizer):
    make_env = make_wordle(True)
    (tree,) = grow(make_env, tokenizer, n=1)
    rows = [node_row(7, n) for n in tree.nodes]
    stored = {tree.task.id: TreeRow(7, tree.task.id, "done", tree.simulations_done, 1.0)}
    (back,), fresh, _ = resume_trees([tree.task], stored, {tree.task.id: rows}, make_env())
    assert not fresh and signature(back) == signature(tree)
    deep = max(rows, key=lambda r: len(r.snapshot["actions"]))
    step = len(deep.snapshot["actions"])
    deep.snapshot["actions"][-1][1] = "0" * 16  # the stored observation was another one
    with pytest.raises(NotDeterministic, match=rf"replaying task '{tree.task.id}', step {step} "):
        resume_trees([tree.task], stored, {tree.task.id: rows}, make_env())


class Drifting:
    """A TRL-shaped class whose answers count calls across instances: not deterministic."""

    calls = 0

    def reset(self, **kwargs) -> str | None:
        return None

    def ping(self) -> str:
        """Ping."""
        Drifting.calls += 1
        return f"pong {Drifting.calls}"

    def get_reward(self) -> float:
        return 0.0


def test_an_env_that_answers_a_replay_otherwise_is_named_with_task_and_step(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "Ping.", "split": "train"}\n{"prompt": "Pong.", "split": "test"}\n')
    env = build_env("tests.test_replay:Drifting", str(rows))
    env.reset(env.tasks("train", 1)[0])
    env.act("ping")
    env.act("ping")
    other = build_env("tests.test_replay:Drifting", str(rows))
    with pytest.raises(NotDeterministic) as info:
        other.restore(env.snapshot())
    assert str(info.value).startswith("env 'Drifting' is not deterministic: replaying task "
                                      "'Drifting-0', step 1 ('ping') gave another observation")
    assert isinstance(info.value, EnvStateError)  # the CLI's one-line user error


class Locked:
    """Holds a lock, which cannot be deep-copied: the adapter replays instead."""

    def reset(self, **kwargs) -> str | None:
        self.lock, self.moves = threading.Lock(), []
        return "Go."

    def step_left(self) -> str:
        """Step left."""
        self.moves.append("l")
        return "".join(self.moves)

    def step_right(self) -> str:
        """Step right."""
        self.moves.append("r")
        return "".join(self.moves)

    def get_reward(self) -> float:
        return {"rr": 1.0, "rl": 0.25}.get("".join(self.moves[:2]), 0.0)


def test_a_state_that_cannot_be_copied_is_replayed_and_grows_the_same_tree(
        tmp_path, tokenizer, caplog):
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Walk {i}.", "split": s}) + "\n"
                            for i, s in enumerate(["train", "train", "test"])))

    def make(copies):
        def make_env():
            env = build_env("tests.test_replay:Locked", str(rows), max_steps=3)
            env.keep_copies = copies
            return env
        return make_env

    actions = ["step_left", "step_right", "done."]
    with caplog.at_level(logging.WARNING):
        tried = grow(make(True), tokenizer, actions, n=2)
    assert "cannot be deep-copied" in caplog.text
    assert [signature(t) for t in tried] == [signature(t) for t in grow(make(False), tokenizer,
                                                                         actions, n=2)]


# ---- an Env of ours whose state is not plain data ------------------------------------------
class Moves:
    """Not JSON data: a JSON snapshot of it fails, a replay does not care."""

    def __init__(self):
        self.path = []


class ObjectCorridor(Corridor):
    """Corridor with its moves in an object."""

    def _reset(self, task):
        self.state = Moves()
        return "start"

    def _execute(self, call: ToolCall) -> StepResult:
        direction = call.arguments["direction"]
        if direction not in ("left", "right"):
            raise ActionError("direction must be left or right")
        self.state.path.append(direction[0])
        moves = "".join(self.state.path)
        if len(moves) < 2:
            return StepResult(observation=f"at {moves}")
        return StepResult("end", reward={"rr": 1.0, "rl": 0.25}.get(moves, 0.0), done=True)


class ReplayCorridor(ReplayEnv, ObjectCorridor):
    """The same env, snapshot by replay."""


def test_an_env_of_ours_with_an_object_state_snapshots_by_replay(tokenizer):
    with pytest.raises(EnvStateError, match="does not round-trip as JSON data"):
        env = ObjectCorridor()
        env.reset(env.tasks("train", 1)[0])
        env.snapshot()
    assert "play alike on a fresh env restored from a snapshot" in check_round_trip(ReplayCorridor)
    actions = ["go[left]", "go[right]", "go[up]"]
    native = grow(Corridor, tokenizer, actions, n=2)
    replayed = grow(ReplayCorridor, tokenizer, actions, n=2)
    assert [signature(t, False) for t in replayed] == [signature(t, False) for t in native]
