"""The learned critic in search and mining: FrozenCritic's interface, values from the
value model.

`score` answers Critique requests as search.frozen_critic.FrozenCritic does, one list per request in its
actions' order, higher is better; here the numbers are predicted returns V(state, action),
not shares that sum to 1. All requests of a tick go in tries of at most `budget` tokens: one
forward per trie, each state's prompt computed once for all its actions.

Each value is kept, by the ids of its state and action: a pair asked again is answered from
memory, not forwarded. Search asks the same pair twice by design (V(page, buy) as a child's
`ending` value, then as the value of that page's own `buy` child), and a second forward, in
another trie, differed by float noise: enough to break the tie between `buy` and an action
that leaves the page as it was (re-clicking a chosen option) the wrong way, one step more
each time (docs/architecture.md, "The learned critic").
"""

from __future__ import annotations

import hashlib
from array import array
from pathlib import Path

from offline_agent.envs.base import Env
from offline_agent.search.requests import Critique
from offline_agent.value import value_model
from offline_agent.value.value_model import ValueModel, encode_actions, state_prompt


class LearnedCritic:
    def __init__(self, model: ValueModel, tokenizer, env: Env, budget: int, state: str):
        self.model, self.tokenizer, self.budget, self.state = model, tokenizer, budget, state
        self.system, self.demo = env.system_prompt(), env.demonstration()
        self.known: dict[bytes, float] = {}  # digest of (state + action) ids -> V

    @classmethod
    def load(cls, folder: str | Path, env: Env, device: str = "cpu",
             budget: int = 8192) -> LearnedCritic:
        """The value model saved in `folder` (value_model.save), with its base's tokenizer and
        the state reading it was fitted with."""
        tokenizer = value_model.load_tokenizer(value_model.base_of(folder))
        return cls(value_model.load(folder, device), tokenizer, env, budget,
                   value_model.state_of(folder))

    def score(self, requests: list[Critique]) -> list[list[float]]:
        seqs = [encode_actions(self.tokenizer, state_prompt(
            self.state, self.system, self.demo, r.task.instruction, r.first_observation, r.steps),
            r.actions) for r in requests]
        keys = [[digest(ids) for ids in s] for s in seqs]
        states: list[dict[bytes, list[int]]] = []  # per request, the pairs not yet valued
        pending: set[bytes] = set()
        for s, ks in zip(seqs, keys):
            new = {k: ids for ids, k in zip(s, ks) if k not in self.known and k not in pending}
            pending.update(new)
            if new:
                states.append(new)
        values = value_model.values_of(self.model, [list(st.values()) for st in states],
                                       self.budget)
        for state, vs in zip(states, values):
            self.known.update(zip(state, vs))
        return [[self.known[k] for k in ks] for ks in keys]


def digest(ids: list[int]) -> bytes:
    """16 bytes that stand for a token sequence (a value's key in LearnedCritic.known)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()
