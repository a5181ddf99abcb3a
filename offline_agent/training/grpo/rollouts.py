"""GRPO's rollouts: G sampled episodes per task, each action kept with the exact ids it was
sampled on (token-in/token-out).

An action is trained in the context the policy saw, as ids: the prompt ids the backend
encoded for that turn, then the ids it sampled (`Completion.token_ids`, eos included). Not
a re-encoding of the decoded conversation, whose ids can differ where text joins text (TRL
#5224): for an importance ratio that is bias, not noise. The turns of an episode share
their prefix, and the packed trie (logprobs.py) computes a shared prefix once, so per-turn
sequences cost little more than one sequence per episode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from offline_agent.envs.base import Env
from offline_agent.policy.base import Completion, Policy, encode_prompt
from offline_agent.policy.constrained import GrammarMasks, TokenMask
from offline_agent.policy.grammar import prompt_grammars
from offline_agent.rollout import action_sampling, run_episodes
from offline_agent.seeding import stable_seed
from offline_agent.types import Task, Trajectory

from .objective import state_hash


@dataclass
class Turn:
    """One sampled action, as the ratio needs it."""

    context: list[int]  # the prompt ids the policy sampled the action on
    action: list[int]   # the ids it sampled (eos included when it ended the turn)
    state: str          # state_hash of the env before the action (step groups)
    # per action id, the grammar's mask it was drawn under (model.constrain: tools; replayed
    # by GrammarMasks.replay), so the ratio renormalises over it; None: drawn unconstrained
    masks: list[TokenMask] | None = None


@dataclass
class Rollout:
    group: int  # index of its task among the step's tasks: the G rollouts of a task share it
    trajectory: Trajectory
    turns: list[Turn]


def member_seeds(seed: int, step: int, attempt: int, members: int) -> list[int]:
    """The episode seeds of a group's members at (step, attempt): a resumed run samples the
    same next rollouts, and a resampled group (attempt + 1) draws new ones."""
    return [stable_seed(seed, "grpo", step, attempt, j) for j in range(members)]


def sample_groups(policy: Policy, make_env: Callable[[], Env], tasks: list[Task],
                  group_size: int, temperature: float, seeds: list[list[int]],
                  batch_size: int, grammars: GrammarMasks | None = None) -> list[Rollout]:
    """group_size episodes of each task (seeds[g]: its members' seeds), batched together.
    `grammars`: the hf decoder's (HFPolicy.grammars), which replays each constrained
    action's masks."""
    jobs = [(g, s) for g, task_seeds in enumerate(seeds) for s in task_seeds[:group_size]]
    turns: list[list[Turn]] = [[] for _ in jobs]

    def on_turn(i: int, prompt: str, completion: Completion, env: Env) -> None:
        turns[i].append(Turn(encode_prompt(policy.tokenizer, prompt), list(completion.token_ids),
                             state_hash(env.snapshot()), replay(grammars, completion, env)))

    trajectories = run_episodes(policy, make_env, [tasks[g] for g, _ in jobs],
                                temperature=temperature, seeds=[s for _, s in jobs],
                                batch_size=batch_size, on_turn=on_turn)
    return [Rollout(g, t, turns[i]) for i, ((g, _), t) in enumerate(zip(jobs, trajectories))]


def replay(grammars: GrammarMasks | None, completion: Completion,
           env: Env) -> list[TokenMask] | None:
    """The masks a constrained completion was drawn under (None for a free one): its grammar
    is the one the rollout asked for, from the env's tools before it acts."""
    if not completion.constrained:
        return None
    if grammars is None:
        raise ValueError("a constrained completion needs the hf decoder's GrammarMasks to "
                         "replay its masks (GRPO's ratio under model.constrain: tools)")
    sampling = action_sampling(env, 1.0, None, [env.call_tools()])
    grammar = prompt_grammars(sampling, 1)[0]
    return grammars.replay(grammar, completion.token_ids, sampling.max_new_tokens)
