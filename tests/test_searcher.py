"""The batched driver must grow exactly the trees that one-tree-at-a-time search grows."""

from __future__ import annotations

import hashlib

import pytest

from offline_agent.policy.base import Completion, Sampling
from offline_agent.search.config import SearchConfig
from offline_agent.search.frozen_critic import FrozenCritic
from offline_agent.search.mcts import Tree, drive, simulate
from offline_agent.search.requests import Critique, Rank, Sample
from offline_agent.search.searcher import Searcher, rank_available, sample_prompt
from offline_agent.seeding import stable_seed
from tests.fakes import Corridor, ListedCorridor

ACTIONS = ["go[left]", "go[right]", "jump", "go[right]"]


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:4], "little")


class PromptHashPolicy:
    """Answers depend only on (prompt, temperature, seed), so batching cannot change them;
    temperature 0 gives the prompt's one greedy answer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.sample_calls = 0
        self.critic_calls = 0

    def sample(self, prompts, n, sampling):
        self.sample_calls += 1
        assert n == 1
        out = []
        for p, t, s in zip(prompts, sampling.temperature, sampling.seed):
            key = _h(p) if t == 0 else _h(p, t, s)
            out.append([Completion(ACTIONS[key % len(ACTIONS)], [], [])])
        return out

    def choice_logprobs(self, prompts, choices):
        self.critic_calls += 1
        return [[-(_h(p, c) % 7) / 3 for c in cs] for p, cs in zip(prompts, choices)]


def _sequential(policy, env, cfg, tree):
    critic = FrozenCritic(policy, env)

    def serve(req):
        if isinstance(req, Sample):
            prompt = sample_prompt(policy, env, req)
            completions = [policy.sample([prompt], 1, Sampling(
                temperature=[t], seed=[stable_seed(req.seed, j)]))[0][0]
                for j, t in enumerate(req.temperatures)]
            return [(c.text, c.action_ids) for c in completions]
        if isinstance(req, Rank):
            return rank_available(policy, env, [req])[0]
        assert isinstance(req, Critique)
        return critic.score([req])[0]

    while tree.simulations_done < cfg.simulations:
        drive(simulate(tree, env, cfg), serve)


def _signature(tree):
    return [(n.parent, n.action, n.visits, round(n.value_sum, 9), n.critic_rank) for n in tree.nodes]


@pytest.mark.parametrize("env_class", [Corridor, ListedCorridor])
def test_batched_equals_sequential_and_commits_every_simulation(tokenizer, env_class):
    cfg = SearchConfig(simulations=6, k=3, max_depth=3, trees_per_batch=3)
    make_env = lambda: env_class(max_steps=5)
    tasks = [t for t in make_env().tasks("train", 5)]
    for i, t in enumerate(tasks):  # distinct instructions -> distinct prompts per tree
        t.instruction = f"reach the end, attempt {i}"

    policy = PromptHashPolicy(tokenizer)
    trees = [Tree.new(t, make_env()) for t in tasks]
    committed = []
    stats = Searcher(policy, make_env, cfg, FrozenCritic(policy, make_env())).run(
        trees, lambda batch: committed.append(batch), progress=False)

    reference = []
    for t in tasks:
        env = make_env()
        tree = Tree.new(t, env)
        _sequential(PromptHashPolicy(tokenizer), env, cfg, tree)
        reference.append(tree)

    assert [_signature(t) for t in trees] == [_signature(t) for t in reference]
    assert all(t.simulations_done == cfg.simulations for t in trees)
    results = [r for batch in committed for r in batch]
    assert len(results) == len(tasks) * cfg.simulations == stats["simulations"]
    assert stats["nodes"] == sum(len(t.nodes) - 1 for t in trees)
    # batching: far fewer model calls than simulations x requests
    assert policy.sample_calls < sum(len(r.trajectory.steps) for _, r in results)


def test_resumed_trees_only_run_missing_simulations(tokenizer):
    cfg = SearchConfig(simulations=4, k=2, max_depth=3, trees_per_batch=2)
    make_env = lambda: Corridor(max_steps=5)
    policy = PromptHashPolicy(tokenizer)
    trees = [Tree.new(t, make_env()) for t in make_env().tasks("train", 2)]
    Searcher(policy, make_env, SearchConfig(simulations=2, k=2, max_depth=3), None).run(
        trees, lambda b: None, progress=False)
    committed = []
    Searcher(policy, make_env, cfg, None).run(trees, committed.append, progress=False)
    assert sum(len(b) for b in committed) == 2 * 2
    assert [t.simulations_done for t in trees] == [4, 4]


class HabitPolicy:
    """Writes go[left] out of habit; go[right] gains 2 nats when the task says 'right'."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def choice_logprobs(self, prompts, choices):
        return [[-1.0 if c == "go[left]" else -5.0 + 2.0 * ("go right" in p) for c in cs]
                for p, cs in zip(prompts, choices)]


def test_rankings_are_habit_and_what_the_task_adds(tokenizer):
    env = ListedCorridor(max_steps=5)
    task = env.tasks("train", 1)[0]
    task.instruction = "go right twice"
    request = Rank(task, env.reset(task), [], ["go[left]", "go[right]"])
    ((pmi, logprobs),) = rank_available(HabitPolicy(tokenizer), env, [request])
    assert logprobs == [-1.0, -3.0]  # habit: go[left]
    assert pmi == [0.0, 2.0]  # the task: go[right]
