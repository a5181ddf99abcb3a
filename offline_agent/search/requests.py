"""What a simulation yields to its driver (mcts.py's generators): `Sample` proposals or a
rollout action, `Rank` the env's listed actions, `Critique` the proposals; and the critic's
choice labels, which bound how many actions one Critique may hold.

Their own module, imported by the algorithm (mcts.py), the drivers (searcher.py, critic.py)
and the settings (config.py checks search.k against MAX_ACTIONS), none of which the others
need to import for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from offline_agent.types import Step, Task

LABELS = "ABCDEFGHIJKLMNOP"
MAX_ACTIONS = len(LABELS)  # one choice label per action: SearchConfig refuses a larger search.k


@dataclass
class Sample:
    """Ask the policy for one action per temperature after `steps` (answer: one
    (text, generated ids or None) per action).

    Action j is drawn at temperatures[j] (0: greedy) with seed `stable_seed(seed, j)`."""

    task: Task
    first_observation: str
    steps: list[Step]
    temperatures: list[float]
    seed: int
    tools: list[dict] | None = None  # the state's Env.call_tools(), for constrained decoding

    @property
    def n(self) -> int:
        return len(self.temperatures)


@dataclass
class Rank:
    """Ask for rankings of `actions` as the next reply (answer: one list of scores per ranking,
    higher is better: the task's PMI and the policy's log-prob, from
    `searcher.rank_available`). The listed children alternate between the rankings' tops."""

    task: Task
    first_observation: str
    steps: list[Step]
    actions: list[str]


@dataclass
class Critique:
    """Ask the critic to score `actions` after `steps` (answer: list[float] in [0, 1])."""

    task: Task
    first_observation: str
    steps: list[Step]
    actions: list[str]
