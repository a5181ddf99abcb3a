"""The learned critic in search and mining: the frozen Critic's interface, values from the
value model.

`score` answers Critique requests as search.critic.Critic does, one list per request in its
actions' order, higher is better; here the numbers are predicted returns V(state, action),
not shares that sum to 1. All requests of a tick go in tries of at most `budget` tokens: one
forward per trie, each state's prompt computed once for all its actions.
"""

from __future__ import annotations

from pathlib import Path

from offline_agent.critic import value_model
from offline_agent.critic.value_model import ValueModel, encode_actions, state_prompt
from offline_agent.envs.base import Env
from offline_agent.search.requests import Critique


class LearnedCritic:
    def __init__(self, model: ValueModel, tokenizer, env: Env, budget: int, state: str):
        self.model, self.tokenizer, self.budget, self.state = model, tokenizer, budget, state
        self.system, self.demo = env.system_prompt(), env.demonstration()

    @classmethod
    def load(cls, folder: str | Path, env: Env, device: str = "cpu",
             budget: int = 8192) -> LearnedCritic:
        """The value model saved in `folder` (value_model.save), with its base's tokenizer and
        the state reading it was fitted with."""
        tokenizer = value_model.load_tokenizer(value_model.base_of(folder))
        return cls(value_model.load(folder, device), tokenizer, env, budget,
                   value_model.state_of(folder))

    def score(self, requests: list[Critique]) -> list[list[float]]:
        return value_model.values_of(self.model, [encode_actions(self.tokenizer, state_prompt(
            self.state, self.system, self.demo, r.task.instruction, r.first_observation, r.steps),
            r.actions) for r in requests], self.budget)
