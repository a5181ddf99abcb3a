"""The learned critic (offline_agent/value/): targets and weights of a hand-built tree, the
value loss falling on a tiny model (seeded), LearnedCritic.score's shape and order, mining's
eq. 10 with learned values (SQL = Python), the `critic` stage (records, skips, resumes), and
the config (bad values refused, `logprob` read as `frozen`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from offline_agent.mining.config import MineConfig
from offline_agent.mining.pairs import step_pairs, step_params
from offline_agent.search.requests import Critique
from offline_agent.types import Step, Task
from offline_agent.value.config import CriticConfig
from offline_agent.value.targets import Target, families, split_tasks, target, weighted_mse
from pipelines.config import ConfigError, RunConfig
from storage import Store, make_node_id, select_step_pairs, step_pair_inputs
from tests.rows import node_row as node
from tests.test_mining import random_trees, store_with


def hand_tree() -> list:
    """Root with a (visited twice, its policy's playouts' returns sum 1.5, the best endings'
    1.9), b (never visited), c (terminal, reward 1, never visited), d (terminal without a
    reward, visited once); under a: e (visited)."""
    return [node(0, 0, visits=3, value_sum=2.4, realized_sum=2.0, action=""),
            node(0, 1, 0, visits=2, value_sum=1.9, realized_sum=1.5, action="a"),
            node(0, 2, 0, action="b"),
            node(0, 3, 0, terminal=True, reward=1.0, action="c"),
            node(0, 4, 0, visits=1, value_sum=0.2, realized_sum=0.2, terminal=True, action="d"),
            node(0, 5, 1, depth=2, visits=1, value_sum=0.9, realized_sum=0.5, action="e")]


def test_targets_and_weights_on_a_hand_built_tree():
    rows = hand_tree()
    nid = lambda i: make_node_id(0, i)  # noqa: E731
    assert target(rows[0]) == Target(nid(0), 2.0 / 3, 3.0)  # a root has Q too, but no parent
    fams = families(rows)
    assert [f.parent_id for f in fams] == [nid(0), nid(1)]
    assert fams[0].children == [
        Target(nid(1), 0.75, 2.0),  # the realized mean (not Q_mcts .95), weighted by visits
        Target(nid(3), 1.0, 1.0),  # terminal: its reward, weight at least 1
        Target(nid(4), 0.0, 1.0)]  # terminal with no reward: 0 (its mean return .2 is not used)
    assert fams[1].children == [Target(nid(5), 0.5, 1.0)]  # b, unvisited: no target
    assert weighted_mse([0.75, 0.0, 0.0], fams[0].children) == pytest.approx(1.0 / 4)


def test_endings_join_their_state_s_family_unless_a_terminal_child_took_them():
    rows = hand_tree()
    nid = lambda i: make_node_id(0, i)  # noqa: E731
    endings = {nid(0): [("c ", 0.3), ("z", 0.6)],  # "c" is the root's terminal child already
               nid(2): [("z", 0.0)],  # b was never expanded: a family of its ending alone
               nid(1): [("a", 1.0)]}  # "a" is a child of the root, not of node 1
    fams = families(rows, endings)
    assert [f.parent_id for f in fams] == [nid(0), nid(1), nid(2)]
    assert fams[0].children == [*families(rows)[0].children, Target(None, 0.6, 1.0, "z")]
    assert fams[1].children == [Target(nid(5), 0.5, 1.0), Target(None, 1.0, 1.0, "a")]
    assert fams[2].children == [Target(None, 0.0, 1.0, "z")]
    assert families(rows, {}) == families(rows)


def test_stored_endings_are_the_env_s_rewards_of_ending_at_each_stored_state():
    from offline_agent.envs.base import load_env
    from offline_agent.value.endings import stored_endings

    env = load_env("minishop", max_steps=8)
    task = env.tasks("train", 1)[0]
    env.reset(task)
    snaps = [env.snapshot()]  # the search page: nothing ends the episode there
    env.act(f"search[{task.instruction}]")
    snaps.append(env.snapshot())
    env.act(next(a for a in env.available_actions() if a.startswith("click[P")))
    snaps.append(env.snapshot())
    product = env.state.item
    assert product  # the second action opened a product page
    rows = [node(0, i, None if i == 0 else i - 1, snapshot=s) for i, s in enumerate(snaps)]
    rows += [node(0, 3, 2, terminal=True, snapshot=snaps[2]),  # terminal: no ending after it
             node(0, 4, 2)]  # no snapshot stored: not read
    got = stored_endings(env, rows)
    env.restore(snaps[2])
    _, bought = env.act("buy")
    assert bought.done and got == {make_node_id(0, 2): [("buy", bought.reward)]}


def test_tasks_are_held_out_whole_seeded_and_never_all():
    ids = [f"t{i}" for i in range(8)]
    train, val = split_tasks(ids, 0.25, seed=0)
    assert len(val) == 2 and sorted(train + val) == ids
    assert split_tasks(ids, 0.25, seed=0) == (train, val)
    assert split_tasks(ids, 0.25, seed=1) != (train, val)
    assert split_tasks(["a", "b"], 0.9, 0)[0]  # one task always trains
    assert split_tasks(ids, 0.0, 0) == (ids, [])


# ---- the value model on the tiny random Llama -----------------------------------------------
def tiny_trees(tokenizer) -> list:
    """Two tasks' trees whose returns depend on the action's text: `good` 1, `bad` 0."""
    from offline_agent.value.fit import encode_tree

    items = []
    for t in range(4):
        rows = [node(t, 0, visits=4, value_sum=2.0, realized_sum=2.0, observation=f"page {t}")]
        for j, word in enumerate(["good", "bad", "good idea", "bad idea"]):
            q = 1.0 if word.startswith("good") else 0.0
            rows.append(node(t, j + 1, 0, visits=1, value_sum=q, realized_sum=q, action=word,
                             observation="ok"))
        task = Task(f"task{t}", "fake", f"do {t}")
        items += encode_tree(tokenizer, "You act.", [], task, rows, None, "conversation")
    return items


def test_endings_are_encoded_as_their_text_in_their_state_s_item(tokenizer):
    from offline_agent.chat import history_messages
    from offline_agent.value.fit import encode_tree
    from offline_agent.value.value_model import encode_actions

    rows = hand_tree()
    task = Task("t", "fake", "do it")
    plain = encode_tree(tokenizer, "You act.", [], task, rows, None, "conversation")
    items = encode_tree(tokenizer, "You act.", [], task, rows, {make_node_id(0, 0): [("z", .6)]},
                        "conversation")
    assert items[0].seqs[:-1] == plain[0].seqs and items[1:] == plain[1:]
    prompt = history_messages("You act.", "do it", rows[0].observation or "", [], [])
    assert items[0].seqs[-1] == encode_actions(tokenizer, prompt, ["z"])[0]


@pytest.mark.parametrize("lora_r", [0, 4])
def test_the_value_loss_falls_on_a_tiny_model(tiny_model_dir, tokenizer, lora_r, monkeypatch):
    from offline_agent.value import fit as fit_module
    from offline_agent.value import value_model
    from offline_agent.value.fit import Item, fit, predict, weighted_mean

    items = tiny_trees(tokenizer)
    cfg = CriticConfig(lora_r=lora_r, lr=1e-2, epochs=30, patience=30, holdout=0.0, seed=0)
    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), cfg)
    targets = [t for i in items for t in i.targets]
    before = weighted_mse([weighted_mean(items)] * len(targets), targets)  # where it starts
    fitted = fit(model, items, cfg)
    values = predict(fitted.model, items, cfg.pack_tokens)
    after = weighted_mse([values[t.node_id] for t in targets], targets)
    assert after < 0.5 * before
    # the fit keeps the frozen base's features (lora_r 0 only), and predict's head on them
    # equals a fresh forward; a state with ending targets only is never run
    assert all(i.base_features is not None for i in items) == (lora_r == 0)
    for item in items:
        item.base_features = None
    ending_only = Item("task0", [[5, 6, 7]], [Target(None, 1.0, 1.0, "z")])
    run = []
    monkeypatch.setattr(fit_module, "values_of", lambda m, seqs, b: run.append(seqs) or
                        value_model.values_of(m, seqs, b))
    fresh = predict(fitted.model, [*items, ending_only], cfg.pack_tokens)
    assert run == [[i.seqs for i in items]]  # one forward, the ending-only state left out
    assert fresh.keys() == values.keys()
    assert [fresh[k] for k in values] == pytest.approx([values[k] for k in values], abs=1e-5)
    again = fit(value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), cfg),
                tiny_trees(tokenizer), cfg)
    assert again.metrics == fitted.metrics  # seeded


def test_learned_critic_scores_in_request_order_as_one_forward_each(tiny_model_dir, tokenizer,
                                                                    tmp_path):
    """Requests of different sizes, packed together: one list per request, one value per
    action in order, equal to scoring each action alone (the trie changes nothing)."""
    import torch

    from offline_agent.value import value_model
    from offline_agent.value.learned_critic import LearnedCritic
    from tests.fakes import FakeEnv

    cfg = CriticConfig(lora_r=2, target_modules=["q_proj"])
    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), cfg)
    torch.manual_seed(1)  # a head that reads something: its zero init values all alike
    torch.nn.init.normal_(model.head.weight, std=1.0)
    value_model.save(model, tmp_path / "v", tiny_model_dir, cfg)
    critic = LearnedCritic.load(tmp_path / "v", FakeEnv(), budget=4096)
    task = Task("t", "fake", "do it")
    step = Step(action="look", observation="a page")
    requests = [Critique(task, "start", [], ["finish", "look", "wait"]),
                Critique(task, "start", [step], ["finish", "buy"]),
                Critique(task, "start", [], ["look"])]
    scores = critic.score(requests)
    assert [len(s) for s in scores] == [3, 2, 1]
    def cold():  # a critic that has valued nothing yet (score keeps what it valued)
        return LearnedCritic(critic.model, critic.tokenizer, FakeEnv(), 4096, critic.state)
    alone = [[cold().score([Critique(r.task, r.first_observation, r.steps, [a])])[0][0]
              for a in r.actions] for r in requests]
    for got, want in zip(scores, alone):
        assert got == pytest.approx(want, abs=1e-4)
    assert len({round(v, 4) for s in scores for v in s}) > 2  # the actions are told apart
    assert scores[0][1] == pytest.approx(scores[2][0], abs=1e-4)  # same state, same action


def test_learned_critic_values_a_state_and_action_once(tiny_model_dir, tokenizer, monkeypatch):
    """A (state, action) asked again, alone or packed with others, is answered from what the
    critic valued before, bit for bit, and only pairs it never valued are forwarded: search
    asks V(page, buy) twice, and a second forward in another trie differed by float noise."""
    import torch

    from offline_agent.value import learned_critic, value_model
    from offline_agent.value.learned_critic import LearnedCritic
    from tests.fakes import FakeEnv

    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), CriticConfig())
    torch.manual_seed(1)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    critic = LearnedCritic(model, tokenizer, FakeEnv(), 4096, "conversation")
    forwarded = []
    real = value_model.values_of
    monkeypatch.setattr(learned_critic.value_model, "values_of", lambda m, states, budget: (
        states and forwarded.append([len(s) for s in states]) or real(m, states, budget)))
    task = Task("t", "fake", "do it")
    step = Step(action="look", observation="a page")
    first = critic.score([Critique(task, "start", [step], ["buy", "look"]),
                          Critique(task, "start", [], ["look", "look"])])
    assert forwarded == [[2, 1]]  # the repeated action of the second state went once
    assert first[1][0] == first[1][1]
    again = critic.score([Critique(task, "start", [], ["wait", "look"]),
                          Critique(task, "start", [step], ["buy"])])
    assert forwarded == [[2, 1], [1]]  # only `wait` is new
    assert again[0][1] == first[1][0] and again[1][0] == first[0][0]  # the same floats
    assert critic.score([Critique(task, "start", [step], ["look", "buy"])]) == \
        [[first[0][1], first[0][0]]]
    assert forwarded == [[2, 1], [1]]


def test_page_state_values_the_goal_and_latest_page_whatever_the_steps_before(
        tiny_model_dir, tokenizer, tmp_path):
    """critic.state page: a state is the goal and the latest observation, so two histories that
    end on the same page get the same values, and the state reading travels in critic.json;
    the conversation reading tells them apart. A folder saved before critic.state reads the
    conversation."""
    import json

    import torch

    from offline_agent.value import value_model
    from offline_agent.value.learned_critic import LearnedCritic
    from offline_agent.value.value_model import state_prompt
    from tests.fakes import FakeEnv

    task = Task("t", "fake", "do it")
    short = [Step(action="look", observation="the page")]
    long = [Step(action="open", observation="another page"), *short[:1]]
    prompt = state_prompt("page", "sys", [], task.instruction, "start", long)
    assert [m.role for m in prompt] == ["system", "user"]
    assert prompt[1].content == "do it\n\nthe page"
    assert state_prompt("page", "sys", [], task.instruction, "start", []) == \
        state_prompt("conversation", "sys", [], task.instruction, "start", [])
    with pytest.raises(ValueError, match="critic state"):
        state_prompt("screen", "sys", [], task.instruction, "start", [])

    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), CriticConfig())
    torch.manual_seed(1)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    scores = {}
    for state in ("page", "conversation"):
        value_model.save(model, tmp_path / state, tiny_model_dir, CriticConfig(state=state))
        critic = LearnedCritic.load(tmp_path / state, FakeEnv())
        assert critic.state == state
        scores[state] = critic.score([Critique(task, "start", short, ["buy"]),
                                      Critique(task, "start", long, ["buy"])])
    assert scores["page"][0] == pytest.approx(scores["page"][1], abs=1e-5)
    assert scores["conversation"][0] != pytest.approx(scores["conversation"][1], abs=1e-3)
    meta = tmp_path / "page" / value_model.META
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items()
                                if k != "state"}))
    assert value_model.state_of(tmp_path / "page") == "conversation"


def test_the_value_model_reads_the_layer_its_share_names_and_loads_as_it_was_fitted(
        tiny_model_dir, tokenizer, tmp_path):
    """critic.layer_share 0.5 of the tiny Llama's 2 layers: V reads the first layer's output
    through the final norm (what the full model computes there), the layer above is gone,
    and a saved folder loads cut the same way; a folder saved before the field keeps all."""
    import json

    import torch

    from offline_agent.value import value_model
    from offline_agent.value.value_model import pack_values

    full = value_model.load_lm(tiny_model_dir, "cpu")
    assert len(full.get_decoder().layers) == 2
    cfg = CriticConfig(layer_share=0.5)
    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), cfg)
    assert len(model.decoder().layers) == 1
    ids = tokenizer("a page and an action").input_ids
    with torch.no_grad():
        hidden = full.get_decoder()(input_ids=torch.tensor([ids]), output_hidden_states=True)
        want = full.get_decoder().norm(hidden.hidden_states[1][0, -1])
        last = hidden.last_hidden_state[0, -1]
        got = model.features(pack_values([ids]))[0]
    assert got == pytest.approx(want.tolist(), abs=1e-4)
    assert got != pytest.approx(last.tolist(), abs=1e-2)  # not the last layer's
    torch.manual_seed(1)
    torch.nn.init.normal_(model.head.weight, std=1.0)
    value_model.save(model, tmp_path / "v", tiny_model_dir, cfg)
    loaded = value_model.load(tmp_path / "v")
    assert len(loaded.decoder().layers) == 1
    packed = pack_values([ids, ids[:-2]])
    with torch.no_grad():
        assert loaded(packed).tolist() == pytest.approx(model(packed).tolist(), abs=1e-5)
    meta = tmp_path / "v" / value_model.META
    meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items()
                                if k != "layers"}))
    assert len(value_model.load(tmp_path / "v").decoder().layers) == 2


# ---- mining with learned values ------------------------------------------------------------
def test_mining_reads_the_learned_values_in_sql_as_in_python(tmp_path):
    import random

    cfg = MineConfig(theta=0.05, alpha=0.3, max_pairs_per_node=100, max_pairs_per_task=1000)
    params = step_params(cfg)
    with store_with(tmp_path / "s.duckdb", random_trees(12, seed=2)) as store:
        nodes, tasks = step_pair_inputs(store)
        rng = random.Random(0)
        learned = {n.node_id: rng.random() for n in nodes if n.parent_id is not None}
        sql, _ = select_step_pairs(store, params, critic=learned)
        plain, _ = select_step_pairs(store, params)
    assert sql == step_pairs(nodes, tasks, params, learned) and len(sql) > 20
    assert plain == step_pairs(nodes, tasks, params) and plain != sql


# ---- the stage -----------------------------------------------------------------------------
CONFIG = """\
run: {{name: critic, seed: 0}}
model: {{id: {model}, device: cpu}}
env: {{name: tests.fakes:MinedCorridor, kwargs: {{max_steps: 2}}, train_tasks: 4, test_tasks: 0}}
search: {{simulations: 6, k: 3, max_depth: 2, trees_per_batch: 4, critic: {critic}}}
critic: {{epochs: 20, patience: 5, holdout: 0.25}}
"""


def run_until(tmp_path, model: str, stage: str, critic: str = "learned") -> int:
    from pipelines.cli import main

    config = tmp_path / "cfg.yaml"
    config.write_text(CONFIG.format(model=model, critic=critic))
    return main(["run", str(config), "--run-dir", str(tmp_path / "r"), "--until", stage])


def test_the_critic_stage_fits_records_feeds_mining_and_resumes(tmp_path, tiny_model_dir,
                                                                monkeypatch, capsys):
    from offline_agent.value import endings as endings_module
    from pipelines.artifacts import CONCORDANCE, CRITIC, FROZEN, learned_values

    endings, read = [], endings_module.stored_endings
    monkeypatch.setattr(endings_module, "stored_endings",
                        lambda env, nodes: endings.append(read(env, nodes)) or endings[-1])
    assert run_until(tmp_path, tiny_model_dir, "mine") == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        final = s.checkpoint("critic", "", CRITIC)
        stats = s.stage("critic").stats
        values = learned_values(s, tmp_path / "r", 1)
        nodes = [n for t in s.trees("search") for n in s.load_tree(t.tree_id)]
        mine_stats = s.stage("mine").stats
    assert stats == final and (tmp_path / "r" / final["folder"] / "critic.json").is_file()
    assert stats["train_tasks"] == 3 and stats["val_tasks"] == 1
    # the listed endings at the stored states (read on their snapshots) joined the targets;
    # here the terminal children at depth 2 already took them all
    assert len(endings) == 4 and all(endings)
    assert stats["train_targets"] + stats["val_targets"] == sum(
        len(f.children) for t, e in zip(sorted({n.tree_id for n in nodes}), endings)
        for f in families([n for n in nodes if n.tree_id == t], e))
    assert stats["concordance_trees"] == 1
    assert set(stats[CONCORDANCE]) == set(stats[FROZEN]) == {"overall", "by_depth", "by_env"}
    visited = {n.node_id for n in nodes if n.parent_id is not None
               and (n.visits or n.terminal)}
    assert visited <= set(values)  # every child with a target has a value for mining
    assert mine_stats["q_critic"] == f"learned ({len(values)} nodes)"
    # beside the frozen critic's, in status and in the report
    from pipelines.cli import main
    from pipelines.report import build_report
    from pipelines.report_table import concordance_text

    capsys.readouterr()
    assert main(["status", str(tmp_path / "r"), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert concordance_text(stats[CONCORDANCE]) in out
    assert f"frozen {concordance_text(stats[FROZEN])} (same held-out trees)" in out
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        report = build_report(s, RunConfig().eval)[CONCORDANCE]
    assert report["critic: learned, held-out trees"] == stats[CONCORDANCE]
    assert report["critic: frozen, same trees"] == stats[FROZEN]
    assert "search" in report

    # done: skipped; left failed with its fit recorded: the record is reused, no refit
    monkeypatch.setattr("offline_agent.value.fit.fit", lambda *a: pytest.fail("refit"))
    assert run_until(tmp_path, tiny_model_dir, "critic") == 0
    with Store(tmp_path / "r" / "store.duckdb") as s:
        s.fail_stage("critic", "", "killed")
    assert run_until(tmp_path, tiny_model_dir, "critic") == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        assert s.stage("critic").status == "done" and s.stage("critic").stats == stats


def test_the_critic_stage_is_a_noop_unless_learned(tmp_path, tiny_model_dir):
    assert run_until(tmp_path, tiny_model_dir, "critic", critic="frozen") == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        assert s.stage("critic").stats == {"skipped": "search.critic is not learned"}
        assert s.checkpoint("critic", "", "critic/final") is None


def test_search_takes_the_critic_search_critic_names(tmp_path, tiny_model_dir):
    """Round 1: the frozen critic (no trees yet) even when learned; round 2: the value model
    critic@1 fitted; none: no critic."""
    from offline_agent.search.frozen_critic import FrozenCritic
    from offline_agent.value import value_model
    from offline_agent.value.learned_critic import LearnedCritic
    from pipelines.artifacts import CRITIC
    from pipelines.stages.search import make_critic

    model = value_model.build(value_model.load_lm(tiny_model_dir, "cpu"), CriticConfig())
    value_model.save(model, tmp_path / "v", tiny_model_dir, CriticConfig())
    with Store(tmp_path / "s.duckdb") as store:
        store.set_checkpoint("critic", "", CRITIC, {"folder": "v"})

        def ctx(critic: str, r: int):
            cfg = RunConfig.load(None, [f"search.critic={critic}", "env.name=tests.fakes:FakeEnv",
                                        "model.device=cpu"])
            return SimpleNamespace(cfg=cfg, store=store, run_dir=tmp_path, round=r)

        policy = SimpleNamespace()
        assert isinstance(make_critic(ctx("learned", 1), policy), FrozenCritic)
        assert isinstance(make_critic(ctx("learned", 2), policy), LearnedCritic)
        assert isinstance(make_critic(ctx("frozen", 2), policy), FrozenCritic)
        assert make_critic(ctx("none", 2), policy) is None


# ---- config --------------------------------------------------------------------------------
@pytest.mark.parametrize("override", ["critic.lora_r=-1", "critic.holdout=1.0",
                                      "critic.epochs=0", "critic.lr=0", "search.critic=value",
                                      "critic.state=screen", "critic.layer_share=0",
                                      "critic.layer_share=1.5"])
def test_config_rejects_bad_critic_values(override):
    with pytest.raises(ConfigError):
        RunConfig.load(None, [override])


def test_logprob_is_read_as_frozen_in_configs_and_stored_runs():
    from pipelines.runner import renamed

    assert RunConfig.load(None, ["search.critic=logprob"]).search.critic == "frozen"
    stored = {"search": {"critic": "logprob", "k": 3}, "run": {}}
    assert renamed(stored) == {"search": {"critic": "frozen", "k": 3}, "run": {}}
    assert stored["search"]["critic"] == "logprob"  # not changed in place
