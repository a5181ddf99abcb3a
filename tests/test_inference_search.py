"""Leaf values from the critic, and search at inference without the verifier: no rollout model
call with critic leaves, the env's verifier run once per task (the committed episode), the
most-visited path committed and replayed, envs without `ending_tools` still searched."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from offline_agent.envs.math import CalculatorMath
from offline_agent.envs.minishop import MiniShop
from offline_agent.evaluation import EvalConfig
from offline_agent.policy.base import Completion, serve_in_lockstep
from offline_agent.rollout import run_episodes
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.inference import (
    committed,
    inference_config,
    most_visited_child,
    most_visited_path,
    search_and_commit,
    search_by_step,
)
from offline_agent.search.mcts import (
    UNSCORED,
    Ending,
    Node,
    Tree,
    child_value,
    drive,
    leaf_value,
    search_step,
    select_child,
    simulate,
)
from offline_agent.search.requests import Rank, Sample
from offline_agent.search.searcher import Searcher
from offline_agent.types import Task
from tests.fakes import Corridor, SubmitCorridor, UndeclaredSubmitCorridor

MOVES = ["go[left]", "go[right]", "submit", "jump"]


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little")


class SubmittingPolicy:
    """Greedy: `submit`; sampled: a move chosen by a hash of (prompt, temperature, seed). Counts
    its sample calls and rows."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.rows = 0

    def sample(self, prompts, n, sampling):
        self.rows += len(prompts)
        temps = sampling.temperature
        temps = temps if isinstance(temps, list) else [temps] * len(prompts)
        return [[Completion("submit" if t == 0 else MOVES[_h(p, t, s) % len(MOVES)], [], [])]
                for p, t, s in zip(prompts, temps, sampling.seed)]

    def choice_logprobs(self, prompts, choices):
        return [[-(_h(p, c) % 7) / 3 for c in cs] for p, cs in zip(prompts, choices)]

    def serve(self, requests, sampling, answer):
        serve_in_lockstep(self, requests, sampling, answer)


# ---- leaf values ------------------------------------------------------------------------------
def counting_serve(counts: dict):
    """Requests answered by hand, counted by kind (a rollout's Sample asks for one action)."""
    def serve(request):
        kind = "rollout" if isinstance(request, Sample) and request.n == 1 else type(request).__name__
        counts[kind] = counts.get(kind, 0) + 1
        if isinstance(request, Sample):
            return [(MOVES[(request.seed + j) % 2], None) for j in range(request.n)]
        if isinstance(request, Rank):
            return [[0.0] * len(request.actions)] * 2
        n = len(request.actions)
        return [(i + 1) / (n * (n + 1) / 2) for i in range(n)]  # later actions score higher
    return serve


@pytest.mark.parametrize("leaf", ["rollout", "critic", "mix"])
def test_critic_leaves_make_no_rollout_model_call(leaf):
    cfg = SearchConfig(simulations=6, k=2, max_depth=2, leaf_value=leaf)
    env = Corridor(max_steps=5)
    tree = Tree.new(env.tasks("train", 1)[0], env)
    counts: dict = {}
    for _ in range(cfg.simulations):
        drive(simulate(tree, env, cfg), counting_serve(counts))
    expansions = sum(1 for n in tree.nodes if n.children)
    assert counts["Sample"] == counts["Critique"] == expansions  # one critique per expansion
    assert (counts.get("rollout", 0) == 0) == (leaf == "critic")


def test_leaf_values_by_hand():
    cfg = SearchConfig(step_cost=0.1)
    leaf = Node(id=1, parent=0, depth=1, critic_score=0.6)
    ending = Ending(1.0, [None] * 3, {})  # a rollout of 3 steps that scored 1
    assert leaf_value(leaf, ending, cfg) == pytest.approx(0.7)
    assert leaf_value(leaf, ending, replace(cfg, leaf_value="critic")) == pytest.approx(0.5)
    assert leaf_value(leaf, ending, replace(cfg, leaf_value="mix")) == pytest.approx(0.6)
    end = Node(id=2, parent=0, depth=1, critic_score=0.6, terminal=True, reward=1.0)
    at_end = Ending(1.0, [None], {})
    assert leaf_value(end, at_end, replace(cfg, leaf_value="critic")) == pytest.approx(0.9)
    blind = replace(cfg, leaf_value="critic", verifier=False, finish=False)
    assert leaf_value(end, at_end, blind) == pytest.approx(0.5)  # no reward: the critic's


def test_search_config_checks_leaf_value_and_verifier():
    with pytest.raises(ValueError, match="rollout, critic or mix"):
        SearchConfig(leaf_value="value")
    with pytest.raises(ValueError, match="needs a critic"):
        SearchConfig(leaf_value="critic", critic="none")
    with pytest.raises(ValueError, match="verifier-free"):
        SearchConfig(verifier=False)  # rollouts and finish would read the reward
    with pytest.raises(ValueError, match="needs search.critic learned"):
        SearchConfig(verifier=False, leaf_value="critic")  # finish: the frozen critic can't value
    blind = inference_config(SearchConfig(critic="none", simulations=3), simulations=5)
    assert (blind.simulations, blind.verifier, blind.finish, blind.leaf_value) == (
        5, False, False, "critic")
    assert blind.critic != "none"
    learned = inference_config(SearchConfig(critic="learned"), simulations=5)
    assert (learned.verifier, learned.finish, learned.critic) == (False, True, "learned")
    assert not inference_config(SearchConfig(critic="learned", finish=False), 5).finish


# ---- the Env side ---------------------------------------------------------------------------
def test_ending_call_names_the_ending_calls_the_state_offers():
    shop = MiniShop()
    shop.reset(shop.tasks("test", 1)[0])
    assert shop.ending_call("buy") is None  # the search page offers no buy: act makes it invalid
    shop.act("search[shirt]")
    shop.act(f"click[{shop.available_actions()[0][len('click['):-1]}]")
    assert shop.ending_call("buy").name == "buy"
    assert shop.ending_call("click[back]") is None
    math = CalculatorMath()
    math.reset(math.tasks("test", 1)[0])
    assert math.ending_call("answer[3]").name == "answer"
    assert math.ending_call("calculate[1+2]") is None and math.ending_call("answer") is None


def test_verifier_free_steps_never_run_an_ending_and_drop_rewards_they_see():
    SubmitCorridor.verifier_calls = 0
    env = SubmitCorridor(max_steps=2)
    env.reset(env.tasks("test", 1)[0])
    here = env.snapshot()
    call, result, snapshot = search_step(env, "submit", verifier=False)
    assert call.name == "submit" and result.done and result.reward == 0
    assert result.info == {UNSCORED: "not run"} and snapshot == here
    assert SubmitCorridor.verifier_calls == 0
    old = UndeclaredSubmitCorridor(max_steps=2)
    old.reset(old.tasks("test", 1)[0])
    old.act("go[right]")
    old.act("go[right]")
    old.restore(old.snapshot() | {"num_steps": 0})
    _, result, _ = search_step(old, "submit", verifier=False)
    assert result.done and result.reward == 0.0 and result.info == {UNSCORED: "reward dropped"}
    assert SubmitCorridor.verifier_calls == 1  # it ran: the env could not say it ends


# ---- search at inference ----------------------------------------------------------------------
def inference(tokenizer, env_class, n_tasks=5, sims=6):
    make_env = lambda: env_class(max_steps=4)
    policy = SubmittingPolicy(tokenizer)
    cfg = inference_config(SearchConfig(k=3, max_depth=4, trees_per_batch=2), sims)
    return policy, make_env, Searcher(policy, make_env, cfg, FrozenCritic(policy, make_env())), \
        make_env().tasks("test", n_tasks)


@pytest.mark.parametrize("sims", [1, 6])  # 1: most paths stop short of an ending: greedy goes on
def test_inference_search_runs_the_verifier_once_per_task(tokenizer, sims):
    policy, make_env, searcher, tasks = inference(tokenizer, SubmitCorridor, sims=sims)
    SubmitCorridor.verifier_calls = 0
    trees = [Tree.new(t, make_env()) for t in tasks]
    searcher.run(trees, lambda finished: None, progress=False)
    assert SubmitCorridor.verifier_calls == 0  # the search alone: never
    assert all(n.reward == 0 for t in trees for n in t.nodes)
    assert any(n.info.get(UNSCORED) == "not run" for t in trees for n in t.nodes)
    episodes = []
    search_and_commit(policy, make_env, tasks, searcher, batch_size=3, on_done=episodes.append,
                      commit="path", progress=False)
    assert SubmitCorridor.verifier_calls == len(tasks)  # one committed episode each
    assert sorted(e.task_id for e in episodes) == [t.id for t in tasks]
    by_task, continued = {e.task_id: e for e in episodes}, 0
    for tree in trees:  # the same seeded search: its most-visited path starts each episode
        path = [n.action for n in most_visited_path(tree)]
        episode = by_task[tree.task.id]
        assert [s.action for s in episode.steps][:len(path)] == path and path
        continued += len(episode.steps) > len(path)
        assert episode.steps[-1].action == "submit" and episode.steps[-1].done
        assert episode.reward == {"rr": 1.0, "rl": 0.25}.get(
            "".join(s.action[3] for s in episode.steps if s.action.startswith("go["))[-2:], 0.0)
    assert continued >= (sims == 1)


def test_an_env_without_ending_tools_is_searched_with_its_rewards_dropped(tokenizer):
    policy, make_env, searcher, tasks = inference(tokenizer, UndeclaredSubmitCorridor, 2)
    trees = [Tree.new(t, make_env()) for t in tasks]
    searcher.run(trees, lambda finished: None, progress=False)
    ended = [n for t in trees for n in t.nodes if n.terminal]
    assert ended and all(n.reward == 0 and n.info == {UNSCORED: "reward dropped"} for n in ended)
    episodes = []
    search_and_commit(policy, make_env, tasks, searcher, batch_size=2, on_done=episodes.append,
                      commit="path", progress=False)
    assert len(episodes) == 2 and all(e.steps[-1].done for e in episodes)


def test_most_visited_path_on_a_hand_built_tree():
    nodes = [Node(id=0, parent=None, depth=0, visits=9, children=[1, 2, 3]),
             Node(id=1, parent=0, depth=1, visits=3, action="a", children=[4, 5]),
             Node(id=2, parent=0, depth=1, visits=5, action="b", children=[6, 7]),
             Node(id=3, parent=0, depth=1, visits=1, action="c"),
             Node(id=4, parent=1, depth=2, visits=3, action="aa"),
             Node(id=5, parent=1, depth=2, visits=0, action="ab"),
             Node(id=6, parent=2, depth=2, visits=2, action="ba", children=[8]),
             Node(id=7, parent=2, depth=2, visits=2, action="bb"),  # a tie: the earlier child
             Node(id=8, parent=6, depth=3, visits=0, action="baa")]  # never visited: not taken
    tree = Tree(task=Task(id="t", env="e", instruction=""), nodes=nodes)
    assert [n.action for n in most_visited_path(tree)] == ["b", "ba"]


def test_a_tie_in_visits_goes_to_the_higher_q_and_a_base_commits_its_path():
    nodes = [Node(id=0, parent=None, depth=0, visits=4, children=[1, 2]),
             Node(id=1, parent=0, depth=1, visits=2, value_sum=0.2, action="a", children=[3]),
             Node(id=2, parent=0, depth=1, visits=2, value_sum=0.8, action="b", children=[4, 5]),
             Node(id=3, parent=1, depth=2, visits=2, action="aa"),
             Node(id=4, parent=2, depth=2, visits=0, action="ba"),
             Node(id=5, parent=2, depth=2, visits=1, action="bb")]
    tree = Tree(task=Task(id="t", env="e", instruction=""), nodes=nodes)
    assert most_visited_child(tree, nodes[0]).action == "b"
    assert most_visited_child(tree, nodes[4]) is None
    assert [n.action for n in committed(tree)] == ["b", "bb"]
    tree.base = 1  # committed "a" step by step: the path goes through it, whatever the visits
    assert [n.action for n in most_visited_path(tree)] == ["aa"]
    assert [n.action for n in committed(tree)] == ["a", "aa"]


@pytest.mark.parametrize("sims", [1, 3])
def test_step_commits_search_again_from_each_committed_state(tokenizer, sims):
    policy, make_env, searcher, tasks = inference(tokenizer, SubmitCorridor, n_tasks=4, sims=sims)
    trees = [Tree.new(t, make_env()) for t in tasks]
    totals = search_by_step(searcher, trees, progress=False)
    for tree in trees:
        base = tree.nodes[tree.base]
        assert base.terminal and base.depth >= 1
        assert tree.simulations_done == sims * base.depth  # `sims` more for every action
        for node in tree.path(base)[1:]:  # each still the most-visited of its siblings
            assert most_visited_child(tree, tree.nodes[node.parent]) is node
    assert totals["simulations"] == sum(t.simulations_done for t in trees)
    SubmitCorridor.verifier_calls, episodes = 0, []
    search_and_commit(policy, make_env, tasks, searcher, batch_size=3, on_done=episodes.append,
                      commit="step", progress=False)
    submitted = sum(e.steps[-1].action == "submit" for e in episodes)
    assert SubmitCorridor.verifier_calls == submitted >= 1  # the searches read no reward;
    by_task = {e.task_id: e for e in episodes}  # an episode cut at the depth limit none
    for tree in trees:  # the same seeded searches: the committed actions are the episode
        episode = by_task[tree.task.id]
        assert [s.action for s in episode.steps] == [n.action for n in committed(tree)]
        assert episode.steps[-1].done
    with pytest.raises(ValueError, match="commit must be one of"):
        search_and_commit(policy, make_env, tasks, searcher, 3, episodes.append, commit="greedy")
    with pytest.raises(ValueError, match="eval.mcts_commit"):
        EvalConfig(mcts_commit="greedy")


def test_prefixes_are_replayed_before_the_policy_plays(tokenizer):
    SubmitCorridor.verifier_calls = 0
    policy = SubmittingPolicy(tokenizer)
    tasks = SubmitCorridor().tasks("test", 3)
    prefixes = [[("go[right]", None), ("go[right]", None)],  # then the policy submits
                [("go[right]", [1, 2]), ("go[left]", None), ("submit", None)],  # ended: no call
                []]
    episodes = run_episodes(policy, lambda: SubmitCorridor(max_steps=5), tasks, batch_size=2,
                            prefixes=prefixes)
    assert [[s.action for s in e.steps] for e in episodes] == [
        ["go[right]", "go[right]", "submit"], ["go[right]", "go[left]", "submit"], ["submit"]]
    assert [e.reward for e in episodes] == [1.0, 0.25, 0.0]
    assert episodes[1].steps[0].token_ids == [1, 2]
    assert policy.rows == 2 and SubmitCorridor.verifier_calls == 3



# ---- finish without the verifier: the critic values the endings a child's state lists --------
class ListedSubmitCorridor(SubmitCorridor):
    """SubmitCorridor that lists its actions, `submit` among them."""

    def available_actions(self):
        return ["go[left]", "go[right]", "submit"]


def ending_critic(requests):
    """A critic stand-in: `submit` after a path ending in rr is worth .9, after rl .4, else .1;
    any other action .2."""
    def value(request, action):
        where = "".join(s.action[3] for s in request.steps if s.action.startswith("go["))
        return {"rr": .9, "rl": .4}.get(where[-2:], .1) if action == "submit" else .2
    return [[value(r, a) for a in r.actions] for r in requests]


def test_verifier_free_finish_takes_the_critic_s_value_of_ending_one_step_on():
    cfg = SearchConfig(simulations=8, k=3, max_depth=4, verifier=False, leaf_value="critic",
                       critic="learned")
    SubmitCorridor.verifier_calls = 0
    env = ListedSubmitCorridor(max_steps=4)
    tree = Tree.new(env.tasks("test", 1)[0], env)
    asked = []

    def serve(request):
        if isinstance(request, Sample):
            return [(MOVES[(request.seed + j) % 2], None) for j in range(request.n)]
        if isinstance(request, Rank):
            return [[0.0] * len(request.actions)] * 2
        asked.append(request)
        return ending_critic([request])[0]

    for _ in range(cfg.simulations):
        drive(simulate(tree, env, cfg), serve)
    assert SubmitCorridor.verifier_calls == 0  # nothing was submitted for real
    going_on = [n for n in tree.nodes[1:] if not n.terminal]
    assert going_on and all(n.reward == 0 for n in tree.nodes)
    for node in going_on:  # each asked once, at its own state, for the ending it lists
        (request,) = [r for r in asked if r.actions == ["submit"]
                      and [s.action for s in r.steps] == [s.action for s in tree.steps(node)]]
        assert node.ending == ending_critic([request])[0][0]
        assert child_value(node, 0.5, 1 / 3, verifier=False) == pytest.approx(
            node.ending if not node.visits else 0.5 * node.q + 0.5 * node.ending)
    rr = [n for n in going_on if n.action == "go[right]" and n.depth == 2
          and tree.nodes[n.parent].action == "go[right]"]
    assert all(n.ending == .9 for n in rr)
    assert sum(1 for n in tree.nodes if n.terminal) >= 1  # `submit` children stay, valued too


def test_finish_off_or_an_unlisted_ending_asks_the_critic_nothing_more():
    env = ListedSubmitCorridor(max_steps=4)
    off = SearchConfig(simulations=4, k=3, max_depth=4, verifier=False, leaf_value="critic",
                       critic="learned", finish=False)
    for cfg, make in ((off, ListedSubmitCorridor), (replace(off, finish=True), SubmitCorridor)):
        env = make(max_steps=4)  # SubmitCorridor lists nothing: no ending to value
        tree = Tree.new(env.tasks("test", 1)[0], env)
        counts: dict = {}
        for _ in range(cfg.simulations):
            drive(simulate(tree, env, cfg), counting_serve(counts))
        assert counts["Critique"] == sum(1 for n in tree.nodes if n.children)
        assert all(n.ending is None for n in tree.nodes)


def test_verifier_free_finish_always_offers_the_listed_ending_as_a_child():
    """Proposals that never write `submit`, k 2 with one listed slot: every expanded state
    still has the env's `submit` as a child (never run), since the agent may always end."""
    cfg = SearchConfig(simulations=6, k=2, listed=1, max_depth=4, verifier=False,
                       leaf_value="critic", critic="learned")
    SubmitCorridor.verifier_calls = 0
    env = ListedSubmitCorridor(max_steps=4)
    tree = Tree.new(env.tasks("test", 1)[0], env)

    def serve(request):
        if isinstance(request, Sample):
            return [("go[left]", None)] * request.n
        if isinstance(request, Rank):  # the policy's ranking puts `submit` last
            return [[-float(a == "submit") for a in request.actions]] * 2
        return ending_critic([request])[0]

    for _ in range(cfg.simulations):
        drive(simulate(tree, env, cfg), serve)
    expanded = [n for n in tree.nodes if n.children and n.depth < cfg.max_depth - 1]
    assert expanded and SubmitCorridor.verifier_calls == 0
    for node in expanded:
        kids = [tree.nodes[i] for i in node.children]
        assert [k.action for k in kids if k.terminal] == ["submit"]
        assert kids[0].action == "submit"  # the ending leads: a tie goes to ending now
    # at the root, going left is worth what ending there is worth (.1 both): ending now wins
    tree = Tree.new(env.tasks("test", 1)[0], env)
    drive(simulate(tree, env, cfg), serve)
    kids = [tree.nodes[i] for i in tree.root.children]
    assert [child_value(k, cfg.alpha, .5, False) for k in kids] == [.1, .1]
    assert select_child(tree, tree.root, cfg).action == "submit"
    off = replace(cfg, finish=False)
    tree = Tree.new(env.tasks("test", 1)[0], env)
    drive(simulate(tree, env, off), serve)
    assert "submit" not in [tree.nodes[i].action for i in tree.root.children]  # ranked last

    def own_words(request):  # the greedy proposal writes the ending its own way
        if isinstance(request, Sample):
            return [("submit()", None)] + [("go[left]", None)] * (request.n - 1)
        return serve(request)

    tree = Tree.new(env.tasks("test", 1)[0], env)
    drive(simulate(tree, env, cfg), own_words)
    ended = [tree.nodes[i].action for i in tree.root.children if tree.nodes[i].terminal]
    assert ended == ["submit"]  # the same call, in the env's words


def test_going_on_must_beat_ending_now_by_the_step_cost():
    """Verifier-free finish: a child that goes on is worth the critic's value of ending one
    step later less `step_cost`, so an action that leaves the state as it was (its ending value
    equals ending now) loses to ending now instead of tying with it."""
    end_now = Node(id=1, parent=0, depth=1, terminal=True, critic_score=0.6)
    no_op = Node(id=2, parent=0, depth=1, critic_score=0.9, ending=0.6)
    better = Node(id=3, parent=0, depth=1, critic_score=0.1, ending=0.65)
    value = lambda n, c: child_value(n, 0.5, 1 / 3, verifier=False, step_cost=c)  # noqa: E731
    assert value(end_now, 0.01) == pytest.approx(0.6)
    assert value(no_op, 0.01) == pytest.approx(0.59) and value(no_op, 0.0) == pytest.approx(0.6)
    assert value(better, 0.01) == pytest.approx(0.64)
    assert value(better, 0.01) > value(end_now, 0.01) > value(no_op, 0.01)
    assert child_value(no_op, 0.5, 1 / 3, verifier=True, step_cost=0.01) == pytest.approx(0.6)
