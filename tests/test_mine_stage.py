"""The mine and export stages on a scripted MiniShop run (real env text, real DuckDB file),
and the exported folder read by `datasets` and trained on by TRL unchanged."""

from __future__ import annotations

import json

import pytest

from offline_agent.envs.base import load_env
from offline_agent.envs.minishop.goals import Goal
from pipelines.config import RunConfig
from pipelines.runner import Stage, run
from pipelines.stages import STAGES
from storage import TrajectoryRow, TreeRow
from tests.rows import node_row

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

TASKS = 2
STAGE = {s.name: s for s in STAGES}


def oracle_actions(env, task) -> list[str]:
    goal = Goal.from_data(task.data)
    env.reset(task)
    query = " ".join((*goal.attributes, goal.type))
    actions = [f"search[{query}]"]
    obs = env.act(actions[0])[1].observation
    while goal.target not in obs:
        actions.append("click[next]")
        obs = env.act("click[next]")[1].observation
    return actions + [f"click[{goal.target}]"] + [f"click[{v}]" for v in goal.options.values()] \
        + ["buy"]


def wrong_actions(env, task) -> list[str]:
    obs = env.reset(task)
    obs = env.act(f"search[{task.data['type']}]")[1].observation
    pid = next(line.split()[0] for line in obs.splitlines()
               if line.startswith("P") and line.split()[0] != task.data["target"])
    return [f"search[{task.data['type']}]", f"click[{pid}]", "buy"]


def generated_ids(action: str) -> list[int] | None:
    """Stand-in for the ids the policy generated for an action (None: the env listed it)."""
    return None if action.startswith("click[") else [ord(c) for c in action]


def play(make_env, task, actions):
    env = make_env()
    env.reset(task)
    steps = []
    for a in actions:
        call, r = env.act(a)
        steps.append({"action": a, "observation": r.observation, "tool_call": call and vars(call),
                      "reward": r.reward, "done": r.done, "invalid": r.invalid, "info": r.info,
                      "token_ids": generated_ids(a)})
        if r.done:
            break
    return steps


def scripted_search(ctx) -> dict:
    """Stands in for search: per task a small tree (root -> good search (2 visits, both
    won), type-only search (1 visit, partial), an invalid reply; good search -> the next
    oracle click, a wrong click) and three episodes: oracle success, wrong buy, step limit."""
    cfg, store = ctx.cfg, ctx.store

    def make_env():
        return load_env(cfg.env.name, seed=cfg.run.seed, **cfg.env.kwargs)

    for t, task in enumerate(store.tasks("train")):
        good, wrong = oracle_actions(make_env(), task), wrong_actions(make_env(), task)
        root_obs = make_env().reset(task)
        step = {a: play(make_env, task, [good[0], a] if a != good[0] else [a])[-1]
                for a in (good[0], good[1], wrong[0], wrong[1], "I would like to buy")}
        spec = [(None, "", 0, 0.0, None), (0, good[0], 2, 2.0, 0.6), (0, wrong[0], 1, 0.3, 0.3),
                (0, "I would like to buy", 1, 0.0, 0.1), (1, good[1], 1, 1.0, 0.5),
                (1, wrong[1], 1, 0.0, 0.5)]
        rows = []
        for local, (parent, action, visits, value, critic) in enumerate(spec):
            s = step.get(action)
            rows.append(node_row(
                t, local, parent, depth=0 if parent is None else 1 + (parent > 0),
                action=action, token_ids=generated_ids(action) if parent is not None else None,
                tool_call=s and s["tool_call"], observation=s["observation"] if s else root_obs,
                visits=visits, value_sum=value, critic_score=critic,
                invalid=bool(s and s["invalid"]), terminal=False))
        store.upsert_trees([TreeRow(t, task.id, "done")], ctx.stage)
        store.insert_nodes(rows)
        episodes = [good, wrong, ["search[nothing]"] * cfg.env.kwargs["max_steps"]]
        trajs = []
        for sim, actions in enumerate(episodes):
            steps = play(make_env, task, actions)
            reward = steps[-1]["reward"] if steps[-1]["done"] else 0.0
            trajs.append(TrajectoryRow(traj_id=t * 100 + sim, task_id=task.id, tree_id=t,
                                       source="mcts_rollout", simulation=sim, steps=steps,
                                       reward=reward, success=reward >= 1.0))
        store.insert_trajectories(trajs, ctx.stage)
    with store.transaction():
        ctx.mark_done({})
    return {}


def make_mined_run(run_dir):
    """tasks, scripted search, mine and export into `run_dir`; the session fixture
    `mined_run` (tests/conftest.py) makes it once for this module and test_export."""
    cfg = RunConfig.load(None, ["env.name=minishop", f"env.train_tasks={TASKS}",
                                "env.test_tasks=1", "env.kwargs={max_steps: 10}"])
    stages = [STAGE["tasks"], Stage("search", ("run", "env", "model", "search"),
                                    scripted_search), STAGE["mine"], STAGE["export"]]
    results = run(cfg, run_dir, stages)
    return run_dir, cfg, results


def test_mine_stage_pairs_examples_and_stats(mined_run):
    from storage import Store

    run_dir, cfg, results = mined_run
    stats = results["mine"]["stats"]
    # per tree: root (.8 good, .3 type-only, .05 invalid) gives 3 pairs, good search's
    # children (.75, .25) one
    assert stats["step_pairs"] == 4 * TASKS and stats["step_candidates"] == 4 * TASKS
    assert stats["trajectory_pairs"] == 2 * TASKS and stats["rft_examples"] == TASKS
    assert stats["hindsight_examples"] == TASKS
    assert stats["relabels"] == {"not_ended": TASKS, "verified": TASKS}
    assert sum(stats["margin_histogram"].values()) == 4 * TASKS
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        steps, trajs = store.pairs("step"), store.pairs("trajectory")
        tasks = {t.id: t for t in store.tasks()}
        examples = store.examples()
    env = load_env("minishop", max_steps=10)
    for p in steps:
        prompt = p.prompt
        assert prompt[0] == {"role": "system", "content": env.system_prompt()}
        assert prompt[-1]["role"] in ("user", "tool")
        assert tasks[p.task_id].instruction in prompt[1 + len(env.demonstration())]["content"]
        assert [m["role"] for m in p.chosen] == ["assistant"] == [m["role"] for m in
                                                                 p.rejected]
        assert p.chosen != p.rejected and p.margin >= cfg.mine.theta
    deeper = [p for p in steps if p.prompt[-1]["role"] == "tool"]
    assert len(deeper) == TASKS  # the pair after the good search: its action is in the prompt
    assert all(p.prompt[-2]["content"].startswith("search[") for p in deeper)
    assert all(p.chosen[0]["tool_calls"][0]["function"]["name"] == "search" or
               p.chosen[0]["tool_calls"][0]["function"]["name"] == "click" for p in steps)
    for p in trajs:
        assert p.chosen[-1]["role"] == "tool" and p.chosen_q == 1.0
        assert {m["role"] for m in p.chosen} == {"assistant", "tool"}
        assert p.rejected_q < 1.0
    for e in examples:  # the prompt (system, demonstration, task) is never trained on
        first = e.info["prompt_messages"]
        assert first == 2 + len(env.demonstration())
        assert e.messages[first - 1]["role"] == "user"
        assert e.messages[first]["role"] == "assistant"
    hindsight = [e for e in examples if e.kind == "hindsight"]
    assert all(e.task_id != e.info["source_task_id"] for e in hindsight)
    assert all(e.messages[-2]["content"] == "buy" for e in hindsight)
    # every action the training data holds keeps the ids generated for it, none for listed ones
    demo = 2 + len(env.demonstration())
    turns = [m for p in steps + trajs for m in p.chosen + p.rejected]
    turns += [m for e in examples for m in e.messages[demo:]]
    turns = [m for m in turns if m["role"] == "assistant"]
    assert {m["content"][:6] for m in turns} == {"search", "click[", "buy", "I woul"}
    for m in turns:
        assert m.get("token_ids") == generated_ids(m["content"])


def test_rerun_is_a_noop_and_changed_mine_config_needs_force(mined_run, capsys):
    from pipelines.errors import RunError

    run_dir, cfg, _ = mined_run
    stages = [STAGE["tasks"], Stage("search", ("run", "env", "model", "search"),
                                    scripted_search), STAGE["mine"]]
    again = run(cfg, run_dir, stages)
    assert again["mine"]["status"] == "skipped"
    changed = RunConfig.from_dict({**cfg.to_dict(), "mine": {**cfg.to_dict()["mine"],
                                                             "theta": 0.45}})
    with pytest.raises(RunError, match="mine.theta"):
        run(changed, run_dir, stages)


def test_export_loads_with_datasets(mined_run, tmp_path):
    """(Each load caches in tmp_path: `datasets` keys a local folder's cache by its name and
    card, not its files, so another folder named `export` would answer from the cache.)"""
    from datasets import load_dataset

    run_dir, _, results = mined_run
    folder = run_dir / "export"
    counts = {c: results["export"]["stats"][c] for c in
              ("pairs", "trajectory_pairs", "rft", "hindsight")}
    assert counts == {"pairs": 4 * TASKS, "trajectory_pairs": 2 * TASKS, "rft": 2 * TASKS,
                      "hindsight": TASKS}
    for config, n in counts.items():
        ds = load_dataset(str(folder), config, split="train", cache_dir=str(tmp_path))
        assert len(ds) == n
        if "pairs" in config:
            assert {"prompt", "chosen", "rejected", "tools", "run_id", "margin"} <= set(
                ds.column_names)
            row = ds[0]
            assert row["chosen"][0]["role"] == "assistant"
            assert set(row["chosen"][0]) == {"role", "content", "tool_calls"}  # text only
            call = row["chosen"][0]["tool_calls"][0]["function"]
            assert isinstance(json.loads(call["arguments"]), dict)
        else:
            assert "messages" in ds.column_names
        tools = json.loads(ds[0]["tools"])
        assert {t["function"]["name"] for t in tools} == {"search", "click", "buy"}
    card = (folder / "README.md").read_text()
    assert "config_name: trajectory_pairs" in card and "| `pairs` | 8 |" in card


TRL_SCRIPT = """
import sys
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

export, model, out = sys.argv[1:]
tok = AutoTokenizer.from_pretrained(model)
common = dict(max_steps=1, per_device_train_batch_size=1, report_to=[], save_strategy="no",
              use_cpu=True, logging_steps=1)
dpo = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(model),
                 args=DPOConfig(output_dir=out + "/dpo", **common),
                 train_dataset=load_dataset(export, "pairs", split="train", cache_dir=out),
                 processing_class=tok)
sft = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model),
                 args=SFTConfig(output_dir=out + "/sft", **common),
                 train_dataset=load_dataset(export, "rft", split="train", cache_dir=out),
                 processing_class=tok)
print("steps", dpo.train().global_step, sft.train().global_step)
"""


def test_trl_trains_on_the_export_unchanged(mined_run, tiny_model_dir, tmp_path):
    """DPOTrainer on `pairs`, SFTTrainer on `rft`, one step of one row each (the steps cost
    seconds: long rows, a 49k vocabulary), in a child process: TRL's
    trainers leave process-wide state behind that changes later trainings' numerics
    (seen as a non-zero first DPO margin in tests/test_training_fit.py)."""
    import subprocess
    import sys

    run_dir, _, _ = mined_run
    proc = subprocess.run([sys.executable, "-c", TRL_SCRIPT, str(run_dir / "export"),
                           tiny_model_dir, str(tmp_path)], capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps 1 1" in proc.stdout


@pytest.mark.parametrize("mine, says", [
    ({"min_visits": 1000}, "has two children that count, a child counts when it ends the "
                           "episode or has mine.min_visits=1000 visits: raise search.simulations"),
    ({"theta": 0.9}, "the largest value gap between two sibling actions is 0.75, below "
                     "mine.theta=0.9"),
    ({"theta": 5}, "mine.theta=5.0 is above 1"),
])
def test_no_step_pairs_says_why_and_what_to_change(mined_run, tmp_path, capsys, mine, says):
    """A round that mines no step pairs names the condition no node met, with the setting to
    change, in its stats (what `status` shows) and on stdout."""
    import shutil

    run_dir = shutil.copytree(mined_run[0], tmp_path / "r")
    cfg = mined_run[1]
    changed = RunConfig.from_dict({**cfg.to_dict(), "mine": {**cfg.to_dict()["mine"], **mine}})
    stages = [STAGE["tasks"], Stage("search", ("run", "env", "model", "search"),
                                    scripted_search), STAGE["mine"]]
    stats = run(changed, run_dir, stages, force=True)["mine"]["stats"]
    assert stats["step_pairs"] == 0 and says in stats["no_step_pairs"]
    assert f"mine: no step pairs: {stats['no_step_pairs']}" in capsys.readouterr().out


def test_no_step_pairs_why_covers_each_missing_condition():
    from offline_agent.mining.advice import no_step_pairs_why
    from offline_agent.mining.config import MineConfig

    cfg = MineConfig()
    assert "expanded no node" in no_step_pairs_why(
        {"expanded": 0, "compared": 0, "best_gap": None}, cfg)
    assert "every child is an invalid action" in no_step_pairs_why(
        {"expanded": 3, "compared": 2, "best_gap": None}, cfg)
