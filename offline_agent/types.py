"""Plain data passed between stages. No behaviour here, so every module can import it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """A parsed action: the tool's name and its JSON arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass
class Message:
    """One chat turn. `tool_calls` is set on assistant turns whose text parsed into a call."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: list[ToolCall] | None = None
    # an assistant turn's ids as the policy generated them (Step.token_ids); training uses them
    token_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        if self.token_ids is not None:
            d["token_ids"] = self.token_ids
        return d


@dataclass
class Task:
    """One episode's goal. `data` holds what the env's verifier needs (target item, answer, tests)."""

    id: str
    env: str
    instruction: str
    split: str = "train"
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Step:
    """One agent turn: the raw text the policy wrote, what it parsed into, and what came back."""

    action: str
    observation: str
    tool_call: ToolCall | None = None
    reward: float = 0.0
    done: bool = False
    invalid: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    # the ids the policy generated for `action`, decoding to exactly it (Completion.action_ids);
    # None where the policy did not write it (an env-listed action) or the store predates them
    token_ids: list[int] | None = None


SUCCESS = 1.0  # the reward of a solved task


@dataclass
class Trajectory:
    """A full episode: the prompt the agent saw (system + instruction) and its steps."""

    task_id: str
    env: str
    instruction: str
    first_observation: str
    steps: list[Step] = field(default_factory=list)
    reward: float = 0.0
    achieved: str | None = None  # instruction the final state satisfies (hindsight)

    @property
    def success(self) -> bool:
        return self.reward >= SUCCESS

    @property
    def done(self) -> bool:
        return bool(self.steps) and self.steps[-1].done


def step_to_dict(step: Step) -> dict[str, Any]:
    return asdict(step)


def step_from_dict(d: dict[str, Any]) -> Step:
    call = d.get("tool_call")
    return Step(**{**d, "tool_call": ToolCall(**call) if call else None})


@dataclass(frozen=True)
class StepPairParams:
    """What step-pair mining reads of `mine.*` (MineConfig; offline_agent.mining.pairs.
    step_params), handed as one value to the SQL pass (storage/step_pairs.py) and to the Python
    oracle (offline_agent.mining.pairs), so both mine by the same settings."""

    alpha: float  # eq. 10's weight of Q_mcts against the critic score
    theta: float  # least Q difference between the chosen and the rejected sibling
    min_visits: int  # visits a non-terminal child needs to count
    invalid_rejected: bool  # invalid actions may be rejected (never chosen)
    max_pairs_per_node: int
    max_pairs_per_task: int
    max_pairs: int  # 0: no cap
    margin_bins: tuple[float, ...]  # inner edges of the margin bins
    seed: int  # of the md5 order a cap keeps pairs in


@dataclass(frozen=True)
class StepPair:
    """One mined step pair: two sibling children of an expanded node, the chosen one worth at
    least theta more (what both the SQL pass and the oracle return)."""

    task_id: str
    env: str
    node_id: int  # the expanded node (the state both actions start from)
    chosen_id: int
    rejected_id: int
    chosen_q: float
    rejected_q: float
    margin: float
    bin: int
