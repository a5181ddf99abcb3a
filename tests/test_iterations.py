"""run.iterations for real: the tiny random model searched, mined, trained in two rounds on
MiniShop, a crash in round 2 resumed, round 1's rows untouched by round 2.

The model decodes under the tool grammar (model.constrain: tools), so its random actions are
valid calls whose trees hold step pairs; the greedy baseline stage is left out for time.
Its rewards are all 0, so a pair's margin is the frozen critic's score gap alone, which round
1's DPO steps shrink to ~0.005 on some CPUs: mine.theta is set far below that."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.config import RunConfig
from pipelines.runner import run
from pipelines.stages import STAGES, pipeline
from storage import TREES_PER_ROUND, Store

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

pytest.importorskip("xgrammar", reason="the tiny model's valid actions need xgrammar")

CONFIG = """\
run: {{name: it, seed: 0, iterations: {iterations}}}
model: {{id: {model}, device: cpu, max_batch: 8, constrain: tools}}
env: {{name: minishop, kwargs: {{max_steps: 3}}, train_tasks: 2, test_tasks: 1}}
search: {{simulations: 3, k: 3, max_depth: 2, trees_per_batch: 2}}
mine: {{theta: 0.0001, min_visits: 0, hindsight: false}}
train: {{policies: [dpo_step], max_steps: 2, batch_size: 2, warmup_steps: 0, lr: 0.05,
         save_every: 100}}
"""


def config(tmp_path: Path, model: str, iterations: int) -> RunConfig:
    path = tmp_path / f"cfg{iterations}.yaml"
    path.write_text(CONFIG.format(model=model, iterations=iterations))
    return RunConfig.load(path)


def stages(iterations: int):
    return [s for s in pipeline(iterations) if s.name != "baseline"]


def round_one_rows(store: Store) -> dict:
    """Everything round 1 stored."""
    trees = store.trees("search")
    return {"trees": trees, "nodes": [n for t in trees for n in store.load_tree(t.tree_id)],
            "rollouts": store.trajectories(stage="search"),
            "pairs": store.pairs(stage="mine"), "examples": store.examples(stage="mine"),
            "metrics": store.metrics("train"),
            "final": store.checkpoint("train", "", "dpo_step/final"),
            "eval": store.eval_episodes(stage="eval")}


@pytest.fixture(scope="module")
def two_rounds(tmp_path_factory, tiny_model_dir):
    """Round 1 alone; then run.iterations raised to 2 with search@2 crashing at its model
    load; then resumed to the end; then run once more."""
    tmp_path = tmp_path_factory.mktemp("iterations")
    run_dir = tmp_path / "run"
    one, two = config(tmp_path, tiny_model_dir, 1), config(tmp_path, tiny_model_dir, 2)
    run(one, run_dir, stages(1))
    with Store(run_dir / "store.duckdb") as store:
        before = round_one_rows(store)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("offline_agent.policy.load_policy", _crash)
        with pytest.raises(RuntimeError, match="killed at the model load"):
            run(two, run_dir, stages(2))
    with Store(run_dir / "store.duckdb") as store:
        crashed = {"iterate": store.checkpoint("search@2", "", "iterate"),
                   "status": store.stage("search@2").status}
    resumed = run(two, run_dir, stages(2))
    again = run(two, run_dir, stages(2))
    return run_dir, before, crashed, resumed, again


def _crash(**kwargs):
    raise RuntimeError("killed at the model load")


def test_round_two_runs_after_round_one_without_touching_it(two_rounds):
    run_dir, before, crashed, resumed, _ = two_rounds
    assert [s for s, r in resumed.items() if r["status"] == "done"] == [
        "search@2", "critic@2", "mine@2", "train@2", "eval@2", "mcts", "report"]
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        assert round_one_rows(store) == before  # nothing of round 1 rewritten
        trees = {k: store.trees(stage) for k, stage in ((1, "search"), (2, "search@2"))}
        pairs = {k: store.pairs(stage=stage) for k, stage in ((1, "mine"), (2, "mine@2"))}
        rollouts = store.trajectories(stage="search@2")
    assert [t.task_id for t in trees[1]] == [t.task_id for t in trees[2]]
    assert all(t.tree_id < TREES_PER_ROUND for t in trees[1])
    assert all(TREES_PER_ROUND <= t.tree_id < 2 * TREES_PER_ROUND for t in trees[2])
    assert all(t.status == "done" and t.simulations_done == 3 for t in trees[2])
    assert rollouts and {r.tree_id for r in rollouts} <= {t.tree_id for t in trees[2]}
    assert pairs[1] and pairs[2]
    # round 2 mined its own trees only
    assert {p.node_id // (1 << 24) for p in pairs[2]} <= {t.tree_id for t in trees[2]}
    assert not {p.pair_id for p in pairs[1]} & {p.pair_id for p in pairs[2]}


def test_round_two_searches_with_round_one_policy_merged(two_rounds, tiny_model_dir):
    """search@2 records and loads round 1's iterate: the base with dpo_step's final adapter
    merged in, which computes what the base with the adapter applied computes."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, _, crashed, resumed, _ = two_rounds
    iterate = resumed["search@2"]["stats"]["iterate"]
    assert iterate == crashed["iterate"]  # written before the crash, reused on resume
    assert crashed["status"] == "failed"
    assert iterate == {"folder": "checkpoints/search@2/iterate", "policy": "dpo_step",
                       "adapter": "checkpoints/train/dpo_step/final"}
    ids = torch.tensor([[1, 50, 300, 7, 1200, 42]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        plain = base(ids).logits
        policy = PeftModel.from_pretrained(base, run_dir / iterate["adapter"])(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(run_dir / iterate["folder"])(ids).logits
    assert not torch.allclose(plain, policy, atol=1e-3)  # round 1 moved the policy
    torch.testing.assert_close(merged, policy, rtol=1e-4, atol=1e-4)


def test_the_train_stage_writes_the_next_rounds_model_and_search_only_loads_it(two_rounds,
                                                                             tmp_path,
                                                                             monkeypatch):
    """With run.iterations = 2 set before round 1 trains, train writes round 2's model where it
    trained the adapter: the same record and the same weights search@2 wrote in the run above
    (whose train finished before iterations was raised); round 2's stages then load it,
    never merging again."""
    import shutil

    from safetensors.torch import load_file

    from pipelines.artifacts import round_model
    from pipelines.progress import Progress
    from pipelines.runner import StageContext
    from pipelines.stages.train import run_train

    run_dir, _, crashed, *_ = two_rounds
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "checkpoints" / "search@2" / "iterate")
    cfg = RunConfig.load(run_dir / "config.yaml")  # iterations 2
    with Store(copy / "store.duckdb") as store:
        store.clear_stage("search@2")  # as if round 2 had not run: no record of its model
        run_train(StageContext(cfg, copy, store, Progress(copy), "train", "", round=1))
        assert store.checkpoint("search@2", "", "iterate") == crashed["iterate"]
        monkeypatch.setattr("offline_agent.training.model.write_merged",
                            lambda *a, **k: pytest.fail("merged again"))
        model = round_model(cfg, store, copy, 2)
    assert model.id == str(copy / "checkpoints/search@2/iterate") and model.adapter is None
    weights = [load_file(d / "checkpoints/search@2/iterate/model.safetensors")
               for d in (run_dir, copy)]
    assert weights[0].keys() == weights[1].keys()
    assert all(weights[0][k].equal(weights[1][k]) for k in weights[0])


def test_round_two_reference_is_round_one_policy(two_rounds, tiny_model_dir, tokenizer):
    """train@2's DPO reference log-probs are round 1's trained policy's, not the base's."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from offline_agent.training.dpo import REFERENCE
    from offline_agent.training.logprobs import encode_pair, pack, sequence_logps

    run_dir, *_ = two_rounds
    saved = torch.load(run_dir / "checkpoints" / "train@2" / "dpo_step" / REFERENCE,
                       weights_only=True)
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        pairs = {p.pair_id: p.to_row() for p in store.pairs(stage="mine@2")}
        adapter = run_dir / store.checkpoint("train", "", "dpo_step/final")["folder"]
    assert saved["keys"] and set(saved["keys"]) <= set(pairs)
    pair = pairs[saved["keys"][0]]
    seqs = pack(list(encode_pair(tokenizer, pair)))
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        base_logps = sequence_logps(base, seqs).view(-1)
        policy_logps = sequence_logps(PeftModel.from_pretrained(base, adapter), seqs).view(-1)
    assert not torch.allclose(base_logps, policy_logps, atol=1e-3)
    torch.testing.assert_close(saved["logps"][0], policy_logps, rtol=1e-4, atol=1e-4)


def test_every_round_is_evaluated_and_reported_and_a_rerun_is_a_no_op(two_rounds):
    import json

    run_dir, _, _, resumed, again = two_rounds
    assert set(resumed["eval@2"]["stats"]) == {"dpo_step@2"}
    report = json.loads((run_dir / "report" / "report.json").read_text())
    assert [p["policy"] for p in report["policies"]] == ["base", "dpo_step", "dpo_step@2"]
    assert set(report["training"]) == {"dpo_step", "dpo_step@2"}
    assert set(report["critic_concordance"]) == {"search", "search@2"}  # each round's trees
    stages = {r["stage"]: r["status"] for r in report["stages"]}
    assert stages["eval@2"] == "done" and "report" not in stages  # not itself, half-written
    assert {s: r["status"] for s, r in again.items()} == {s: "skipped" for s in resumed}


def test_round_names_and_the_stage_list():
    from pipelines.rounds import round_name

    assert [round_name("search", r) for r in (1, 2, 12)] == ["search", "search@2", "search@12"]
    assert pipeline(1) == STAGES  # one round: the pipeline as it always was
    assert {s.round for s in STAGES} == {1}
    names = [s.name for s in pipeline(3)]
    assert names[names.index("eval"):] == [
        "eval", "search@2", "critic@2", "mine@2", "train@2", "eval@2",
        "search@3", "critic@3", "mine@3", "train@3", "eval@3", "mcts", "report"]
    # each stage carries its round as data, and its stored name is that round's name
    rounds = {s.name: s.round for s in pipeline(3)}
    assert [rounds[n] for n in ("search", "eval", "search@2", "eval@2", "mine@3", "report")] == [
        1, 1, 2, 2, 3, 1]
    assert rounds["mcts"] == 3  # search at inference reads the last round's critic
    assert all(s.name == round_name(s.name.split("@")[0], s.round) for s in pipeline(3)
               if s.name != "mcts")
    assert {s.shard(RunConfig()) for s in pipeline(3) if "@" in s.name} == {""}


def test_train_iterate_must_be_a_trained_policy():
    from pipelines.config import ConfigError

    with pytest.raises(ConfigError, match="train.iterate must be one of"):
        RunConfig.from_dict({"train": {"policies": ["rft"], "iterate": "dpo_step"}})
    assert RunConfig.from_dict({"train": {"iterate": "rft"}}).train.iterate == "rft"


def test_a_round_without_the_iterate_policy_stops_with_its_name(tmp_path):
    from pipelines.artifacts import round_model
    from pipelines.errors import RunError

    cfg = RunConfig.from_dict({"train": {"policies": ["rft", "dpo_step"]}})
    with Store(tmp_path / "store.duckdb") as store:
        store.set_checkpoint("train", "", "rft/final", {"folder": "checkpoints/train/rft/final"})
        with pytest.raises(RunError, match="round 1's 'dpo_step' policy.*has not trained"):
            round_model(cfg, store, tmp_path, 2)
        assert store.checkpoint("search@2", "", "iterate") is None


def test_export_writes_the_chosen_round_and_names_the_rounds_it_has(two_rounds, tmp_path,
                                                                    capsys):
    import pyarrow.parquet as pq

    from pipelines.cli import main

    run_dir = two_rounds[0]
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        steps = {r: sorted(p.node_id for p in store.pairs("step", stage))
                 for r, stage in ((1, "mine"), (2, "mine@2"))}
    assert steps[1] and steps[2] and steps[1] != steps[2]
    for r in (1, 2):
        assert main(["export", str(run_dir), "--out", str(tmp_path / f"r{r}"), "--round",
                     str(r)]) == 0
        assert f"rows: pairs {len(steps[r])}" in capsys.readouterr().out
        pairs = pq.read_table(tmp_path / f"r{r}" / "data" / "pairs").to_pylist()
        assert sorted(p["node_id"] for p in pairs) == steps[r]
    assert "`mine@2`" in (tmp_path / "r2" / "README.md").read_text()
    assert "`mine@2`" not in (tmp_path / "r1" / "README.md").read_text()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "r3"), "--round", "3"]) == 2
    err = capsys.readouterr().err
    assert "--round 3: the run has no round 3 (stage 'mine@3')" in err
    assert "rounds with a mine stage: 1, 2" in err and not (tmp_path / "r3").exists()


def test_tree_draws_the_chosen_round_latest_by_default(two_rounds, tmp_path, capsys):
    from pipelines.cli import main

    run_dir = two_rounds[0]
    with Store(run_dir / "store.duckdb", read_only=True) as store:
        task = store.trees("search")[0].task_id
        ids = {r: {str(n.node_id) for t in store.trees(stage) if t.task_id == task
                   for n in store.load_tree(t.tree_id)}
               for r, stage in ((1, "search"), (2, "search@2"))}
    assert ids[1] and ids[2] and not ids[1] & ids[2]
    for r in (1, 2):
        out = tmp_path / f"{r}.graphml"
        argv = ["tree", str(run_dir), "--task", task, "--format", "graphml", "--out", str(out)]
        assert main(argv + ["--round", str(r)]) == 0
        assert set(re.findall(r'<node id="(\d+)"', out.read_text())) == ids[r]
    capsys.readouterr()
    assert main(["tree", str(run_dir), "--task", task]) == 0  # the latest round, as before
    assert f"@2.html ({len(ids[2])} nodes, round 2)" in capsys.readouterr().out
    assert "round 2, 3 simulations" in (run_dir / "trees" / f"{task}@2.html").read_text()
    assert main(["tree", str(run_dir), "--task", task, "--round", "1"]) == 0
    assert (run_dir / "trees" / f"{task}.html").is_file()
    assert main(["tree", str(run_dir), "--task", task, "--round", "3"]) == 2
    assert (f"--round 3: no search tree for task {task!r} in round 3 (stage 'search@3'); "
            "rounds with one: 1, 2") in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["tree", str(run_dir), "--task", task, "--round", "0"])
    assert exit_.value.code == 2 and "'0' is not a round number" in capsys.readouterr().err


def test_the_runner_hands_each_stage_its_round(tmp_path):
    from pipelines.runner import Stage
    from tests.fakes import fake_cfg

    seen = []

    def record(ctx):
        seen.append((ctx.stage, ctx.round))
        with ctx.store.transaction():
            ctx.mark_done({})
        return {}

    run(fake_cfg(), tmp_path, [Stage("a", (), record), Stage("a@3", (), record, round=3)])
    assert seen == [("a", 1), ("a@3", 3)]
