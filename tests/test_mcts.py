"""MCTS core: arithmetic against hand-computed values, and search on a toy env with a known optimum."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from offline_agent.envs.base import StepResult
from offline_agent.search.config import SearchConfig
from offline_agent.search.mcts import (
    Candidate,
    Node,
    Tree,
    action_key,
    backup,
    child_value,
    choose_children,
    drive,
    interleave,
    puct,
    rank_scores,
    select_child,
    simulate,
    ucb1,
)
from offline_agent.search.requests import Critique, Rank, Sample
from offline_agent.types import Task, ToolCall
from tests.fakes import Corridor, ListedCorridor


def fake_ids(text: str) -> list[int]:
    """Stand-in for the ids a policy generated for `text` (one per character)."""
    return [ord(c) for c in text]


def generated(texts: list[str]) -> list[tuple[str, list[int]]]:
    """A Sample's answer: each action with the ids the policy generated for it."""
    return [(t, fake_ids(t)) for t in texts]


def uniform_policy(request):
    """Random proposals; the critic mildly prefers the first proposal it is shown."""
    if isinstance(request, Sample):
        r = random.Random(request.seed)
        moves = ["go[left]", "go[right]", "jump"]
        if request.n == 1:
            return generated([r.choice(moves)])
        r.shuffle(moves)  # expansions see every move, in a seeded order
        return generated((moves + [r.choice(moves) for _ in range(request.n)])[: request.n])
    assert isinstance(request, Critique)
    n = len(request.actions)
    return [1.0 / n] * n


def test_ucb1_and_puct_by_hand():
    assert ucb1(0.5, 10, 3, 1.0) == pytest.approx(0.5 + math.sqrt(math.log(10) / 4))
    assert ucb1(0.2, 1, 0, 2.0) == pytest.approx(0.2)  # log 1 = 0: no bonus yet
    assert puct(0.1, 0.6, 9, 2, 1.5) == pytest.approx(0.1 + 1.5 * 0.6 * 3 / 3)


def test_backup_is_a_running_mean():
    nodes = [Node(id=0, parent=None, depth=0), Node(id=1, parent=0, depth=1)]
    for r in (1.0, 0.0, 0.5):
        backup(nodes, r, r / 2)
    assert [n.visits for n in nodes] == [3, 3]
    assert nodes[1].q == pytest.approx(0.5)
    assert nodes[0].value_sum == pytest.approx(1.5)
    assert nodes[0].realized_sum == nodes[1].realized_sum == pytest.approx(0.75)


def test_select_prefers_critic_for_unvisited_then_ucb():
    cfg = SearchConfig(c=1.0, alpha=1.0)  # alpha 1: visited children by their MCTS Q alone
    root = Node(id=0, parent=None, depth=0, visits=4, children=[1, 2])
    a = Node(id=1, parent=0, depth=1, critic_score=0.1, visits=3, value_sum=0.9)  # q 0.3
    b = Node(id=2, parent=0, depth=1, critic_score=0.9)  # unvisited: value 0.9
    tree = Tree(task=Task(id="t", env="e", instruction=""), nodes=[root, a, b])
    # a: 0.3 + sqrt(ln4/4) = 0.889 ; b: 0.9 + sqrt(ln4/1) = 2.077
    assert select_child(tree, root, cfg) is b
    b.visits, b.value_sum = 20, 0.0  # b proved worthless
    # a: 0.889 ; b: 0 + sqrt(ln4/21) = 0.257
    assert select_child(tree, root, cfg) is a
    # alpha 0: the critic alone. a: 0.1 + 0.589 = 0.689 ; b: 0.9 + 0.257 = 1.157
    assert select_child(tree, root, SearchConfig(c=1.0, alpha=0.0)) is b
    # alpha 0.5 (eq. 10): a: 0.2 + 0.589 = 0.789 ; b: 0.45 + 0.257 = 0.707
    assert child_value(a, 0.5, 0.5) == pytest.approx(0.2)
    assert child_value(b, 0.5, 0.5) == pytest.approx(0.45)
    assert select_child(tree, root, SearchConfig(c=1.0, alpha=0.5)) is a
    puct_cfg = SearchConfig(selection="puct", c=1.0, alpha=1.0)
    # a: 0.3 + 0.1*2/4 = 0.35 ; b: 0 + 0.9*2/21 = 0.086
    assert select_child(tree, root, puct_cfg) is a


def test_an_unvisited_terminal_child_is_worth_its_reward():
    bought = Node(id=1, parent=0, depth=1, terminal=True, reward=0.75, critic_score=0.1)
    wrong = Node(id=2, parent=0, depth=1, terminal=True, reward=0.0, critic_score=0.9)
    assert child_value(bought, 0.5, 0.5) == 0.75 and child_value(wrong, 0.5, 0.5) == 0.0
    wrong.visits = 1  # visited: still its exact reward, not eq. 10's mix with the critic's 0.9
    bought.visits, bought.value_sum = 2, 1.5
    assert child_value(bought, 0.5, 0.5) == 0.75 and child_value(wrong, 0.5, 0.5) == 0.0
    tree = Tree(task=Task(id="t", env="e", instruction=""),
                nodes=[Node(id=0, parent=None, depth=0, visits=2, children=[1, 2, 3]), bought,
                       wrong, Node(id=3, parent=0, depth=1, critic_score=0.0)])
    bought.reward = 0.0  # both known failures: the unvisited child is tried next
    assert select_child(tree, tree.root, SearchConfig(c=1.0, alpha=0.5)).id == 3
    # a child one listed step from an ending is worth at least that ending until visited
    opened = Node(id=3, parent=0, depth=1, ending=0.9, critic_score=0.2)
    assert child_value(opened, 0.5, 0.5) == 0.9
    opened.ending = None
    assert child_value(opened, 0.5, 0.5) == 0.2


def test_first_proposal_is_greedy_when_asked():
    asked = []

    def record(request):
        asked.append(request)
        return uniform_policy(request)

    run_search(SearchConfig(simulations=2, k=3, oversample=1, max_depth=2,
                            expand_temperature=0.9), record)
    expansions = [r for r in asked if isinstance(r, Sample) and r.n == 3]
    assert expansions and all(r.temperatures == [0.0, 0.9, 0.9] for r in expansions)
    asked.clear()
    run_search(SearchConfig(simulations=2, k=3, oversample=1, max_depth=2,
                            expand_temperature=0.9, expand_greedy=False, rollout_temperature=0.3),
               record)
    assert {tuple(r.temperatures) for r in asked if isinstance(r, Sample)} == {(0.9,) * 3, (0.3,)}


def test_children_are_the_first_k_distinct_proposals_valid_first():
    def proposals(request):
        if isinstance(request, Sample):
            return generated(["jump", "go[right]", "go[ right ]", "fly", "go[left]",
                              "swim"][: request.n])
        return [1.0 / len(request.actions)] * len(request.actions)

    for k, expected in ((2, ["go[right]", "go[left]"]), (3, ["go[right]", "go[left]", "jump"]),
                        (4, ["go[right]", "go[left]", "jump"])):
        tree = run_search(SearchConfig(simulations=1, k=k, oversample=3, max_depth=2), proposals)
        assert [tree.nodes[i].action for i in tree.root.children] == expected


def test_proposals_the_env_scored_come_first_behind_the_greedy_one():
    def candidate(text, reward=0.0, done=False, ending=None):
        return Candidate(text, None, StepResult("", reward=reward, done=done), {}, ending, None)

    greedy, run, junk = candidate("greedy"), candidate("run"), candidate("junk", done=True)
    passed, half = candidate("passed", 1.0, done=True), candidate("half", ending=0.5)
    sampled = [greedy, run, junk, half, passed]
    cfg = SearchConfig(k=3, listed=0)
    assert choose_children(sampled, [], cfg) == [greedy, passed, half]
    off = SearchConfig(k=3, listed=0, finish=False)  # without finish: proposal order
    assert choose_children(sampled, [], off) == [greedy, run, junk]


def test_listed_actions_take_their_slots_in_the_policys_order():
    def stubborn(prefer):  # proposes only junk; ranks `prefer` highest among listed moves
        def serve(request):
            if isinstance(request, Sample):
                return generated(["jump"] * request.n)
            if isinstance(request, Rank):
                return [[0.0 if a == prefer else -3.0 for a in request.actions]]
            return [1.0 / len(request.actions)] * len(request.actions)
        return serve

    def children(cfg, serve):
        env = ListedCorridor(max_steps=5)
        tree = Tree.new(env.tasks("train", 1)[0], env)
        drive(simulate(tree, env, cfg), serve)
        return [tree.nodes[i].action for i in tree.root.children]

    cfg = SearchConfig(simulations=1, k=2, listed=1, max_depth=2, finish=False)
    assert children(cfg, stubborn("go[right]")) == ["go[right]", "go[left]"]  # junk loses its slot
    assert children(cfg, stubborn("go[left]")) == ["go[left]", "go[right]"]
    assert children(SearchConfig(simulations=1, k=3, listed=1, max_depth=2, finish=False),
                    stubborn("go[left]")) == ["go[left]", "go[right]", "jump"]  # room left: one junk
    assert children(SearchConfig(simulations=1, k=2, listed=0), stubborn("go[left]")) == ["jump"]
    # finish: a listed action with a better ending one step away goes first, whatever the model
    # says (go[right] can end with rr = 1; go[left] only with 0)
    assert children(SearchConfig(simulations=1, k=2, listed=1, max_depth=2),
                    stubborn("go[left]")) == ["go[right]", "go[left]"]


def test_nodes_and_rollout_steps_keep_the_ids_the_policy_generated():
    """Sampled actions carry their generated ids into nodes, paths and rollouts; env-listed
    actions, which the policy never generated, carry None (training encodes their text)."""
    def serve(request):
        if isinstance(request, Sample):
            return generated(["go[right]", "jump", "go[right]"][: request.n])
        if isinstance(request, Rank):
            return [[0.0] * len(request.actions)]
        return [1.0 / len(request.actions)] * len(request.actions)

    env = ListedCorridor(max_steps=5)
    tree = Tree.new(env.tasks("train", 1)[0], env)
    cfg = SearchConfig(simulations=3, k=3, oversample=1, listed=1, max_depth=3, finish=False)
    results = [drive(simulate(tree, env, cfg), serve) for _ in range(cfg.simulations)]
    sampled = {"go[right]", "jump"}
    children = tree.nodes[1:]
    assert {n.action for n in children} >= {"go[right]", "jump", "go[left]"}
    for node in children:
        assert node.token_ids == (fake_ids(node.action) if node.action in sampled else None)
    steps = [s for r in results for s in r.trajectory.steps]
    assert any(s.action == "go[left]" for s in steps) and len(steps) > len(results)
    for step in steps:
        assert step.token_ids == (fake_ids(step.action) if step.action in sampled else None)


def test_listed_actions_let_search_find_what_the_policy_never_samples():
    def left_only(request):
        if isinstance(request, Sample):
            return generated(["go[left]"] * request.n)
        if isinstance(request, Rank):
            return [[-1.0] * len(request.actions)]
        return [1.0 / len(request.actions)] * len(request.actions)

    def best_return(cfg):
        env = ListedCorridor(max_steps=5)
        tree = Tree.new(env.tasks("train", 1)[0], env)
        results = [drive(simulate(tree, env, cfg), left_only) for _ in range(cfg.simulations)]
        return max(r.reward for r in results)

    assert best_return(SearchConfig(simulations=12, k=2, listed=0, max_depth=3)) == 0.0
    assert best_return(SearchConfig(simulations=12, k=2, listed=1, max_depth=3)) == 1.0


def test_helpers():
    assert rank_scores([0.2, 0.5, 0.3]) == [2, 0, 1]
    assert interleave([["a", "b", "c"], ["c", "b", "a"]]) == ["a", "c", "b"]
    assert interleave([["a", "b", "c"], ["a", "c", "b"]]) == ["a", "b", "c"]
    assert interleave([["b", "a"], ["a", "b"]]) == ["b", "a"]
    assert action_key("search[x]", ToolCall("search", {"query": "x"})) == action_key(
        'search[ x ]', ToolCall("search", {"query": "x"}))
    assert action_key("  foo   bar ", None) == "foo bar"


def run_search(cfg: SearchConfig, serve=uniform_policy) -> Tree:
    env = Corridor(max_steps=5)
    tree = Tree.new(env.tasks("train", 1)[0], env)
    for _ in range(cfg.simulations):
        drive(simulate(tree, env, cfg), serve)
    return tree


def test_mcts_finds_the_best_first_action():
    cfg = SearchConfig(simulations=40, k=4, c=1.0, max_depth=3)
    tree = run_search(cfg)
    root = tree.root
    assert root.visits == 40 == tree.simulations_done
    children = {tree.nodes[i].action: tree.nodes[i] for i in root.children}
    # an expansion of k*oversample = 8 samples sees every move (uniform_policy), and k = 4
    # leaves room for the one invalid proposal after the two valid ones
    assert set(children) == {"go[left]", "go[right]", "jump"}
    best = max(children.values(), key=lambda n: n.q)
    assert best.action == "go[right]"
    # the search spent most of its visits on the better branch
    assert children["go[right]"].visits > children["go[left]"].visits
    # visits of children sum to parent visits minus the first (root-only) pass
    assert sum(tree.nodes[i].visits for i in root.children) == root.visits
    # an invalid proposal becomes a flagged child, never an exception
    assert children["jump"].invalid and not children["jump"].terminal
    assert [children[a].invalid for a in ("go[left]", "go[right]")] == [False, False]


def test_duplicates_are_merged_and_critic_scores_stored():
    def fixed(request):
        if isinstance(request, Sample):
            return generated(["go[right]", "go[ right ]", "go[left]", "go[right]"][: request.n])
        return [0.8, 0.2]

    cfg = SearchConfig(simulations=1, k=4, max_depth=3)
    tree = run_search(cfg, fixed)
    kids = [tree.nodes[i] for i in tree.root.children]
    assert [k.action for k in kids] == ["go[right]", "go[left]"]
    assert [k.critic_rank for k in kids] == [0, 1]
    assert [k.critic_score for k in kids] == [0.8, 0.2]
    # the first simulation rolled out from the critic's favourite
    assert kids[0].visits == 1 and kids[1].visits == 0


def test_search_is_deterministic_given_seed():
    cfg = SearchConfig(simulations=12, k=3, max_depth=3, seed=7)
    a, b = run_search(cfg), run_search(cfg)
    c = run_search(replace(cfg, seed=8))

    def shape(tree: Tree) -> list:
        return [(n.action, n.parent, n.visits, n.value_sum) for n in tree.nodes]

    assert shape(a) == shape(b)
    assert shape(c) != shape(a)  # the seed is used: another one grows another tree


def test_step_cost_and_max_depth():
    cfg = SearchConfig(simulations=6, k=2, max_depth=1, step_cost=0.1)
    tree = run_search(cfg)
    assert all(tree.nodes[i].terminal for i in tree.root.children)  # depth 1 is the limit
    assert tree.root.value_sum == pytest.approx(-0.1 * 6)  # never reaches a reward at depth 1


class StopCorridor(Corridor):
    """Walk, then `stop` to be scored: stopping after rr... pays 1, after r 0.25, else 0."""

    name = "stop-corridor"
    tools = Corridor.tools + [{"type": "function", "function": {
        "name": "stop", "parameters": {"type": "object", "properties": {}, "required": []}}}]

    def _execute(self, call: ToolCall) -> StepResult:
        if call.name == "stop":
            reward = 1.0 if self.state.startswith("rr") else 0.25 if self.state == "r" else 0.0
            self.state += "!"
            return StepResult(observation="stopped", reward=reward, done=True)
        self.state += call.arguments["direction"][0]
        return StepResult(observation=f"at {self.state}")

    def available_actions(self):
        return ["go[left]", "go[right]", "stop"]


def test_rollouts_finish_where_the_env_offers_an_ending_the_policy_never_writes():
    rollout_steps = []

    def walker(request):  # only ever walks right: never ends an episode itself
        if isinstance(request, Sample):
            rollout_steps.append(request.n == 1)
            return generated(["go[right]"] * request.n)
        return [[0.0] * len(request.actions)] * 2

    def first_simulation(finish):
        env = StopCorridor(max_steps=10)
        tree = Tree.new(env.tasks("train", 1)[0], env)
        return tree, drive(simulate(tree, env, SearchConfig(k=1, listed=0, max_depth=4,
                                                            finish=finish)), walker)

    tree, plain = first_simulation(finish=False)
    assert plain.reward == 0.0  # walked to max depth, never scored
    assert tree.root.realized_sum == tree.root.value_sum == 0.0
    assert [s.action for s in plain.trajectory.steps] == ["go[right]"] * 4
    assert sum(rollout_steps) == 3
    rollout_steps.clear()
    tree, result = first_simulation(finish=True)
    assert sum(rollout_steps) == 1  # at rr the rollout stops: stopping there is a success
    # stop pays 1 after rr and after rrr: the earliest such ending is the trajectory
    assert result.reward == result.trajectory.reward == 1.0
    assert [s.action for s in result.trajectory.steps] == ["go[right]", "go[right]", "stop"]
    assert result.trajectory.steps[-1].done and result.trajectory.success
    assert tree.root.q == 1.0 and len(tree.nodes) == 2  # the tree itself holds only go[right]
    # the policy itself only walked on, to max depth: what it realised is 0
    assert [n.realized_sum for n in tree.nodes] == [0.0, 0.0]
