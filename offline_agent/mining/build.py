"""Stored rows -> chat conversations in TRL's format (what the policy saw, turn by turn).

Every conversation starts as the policy's prompts did (offline_agent.chat.history_messages:
system prompt, the env's demonstration, instruction + first observation), so a pair's
prompt is exactly the context its actions were sampled in. Actions keep the ids the policy
generated (`token_ids` on assistant turns), which training uses; exports drop them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from offline_agent.chat import history_messages, to_chat_dicts
from offline_agent.types import Message, Step, ToolCall


@dataclass
class Context:
    """What every conversation of one env starts with."""

    system: str
    demo: list[Message]

    def messages(self, instruction: str, first_observation: str, steps: list[Step]) -> list[dict]:
        return to_chat_dicts(history_messages(self.system, instruction, first_observation,
                                              steps, self.demo))

    def prompt_len(self) -> int:
        """Messages before the first action: system, demonstration, user."""
        return 2 + len(self.demo)


class StoredNode(Protocol):
    """A stored node as conversations read it (a storage NodeRow)."""

    parent_id: int | None
    action: str | None
    tool_call: dict | None
    observation: str | None
    reward: float | None
    terminal: bool
    invalid: bool
    info: dict | None
    token_ids: list[int] | None


def node_step(row: StoredNode) -> Step:
    call = row.tool_call
    return Step(action=row.action or "", observation=row.observation or "",
                tool_call=ToolCall(**call) if call else None, reward=row.reward or 0.0,
                done=row.terminal, invalid=row.invalid, info=row.info or {},
                token_ids=row.token_ids)


def path_steps(nodes: Mapping[int, StoredNode], node_id: int) -> tuple[str, list[Step]]:
    """(root observation, the steps from the root down to `node_id`) of a stored tree."""
    path = []
    row = nodes[node_id]
    while row.parent_id is not None:
        path.append(node_step(row))
        row = nodes[row.parent_id]
    return row.observation or "", path[::-1]


def step_pair_messages(ctx: Context, instruction: str, nodes: Mapping[int, StoredNode],
                       node_id: int, chosen_id: int, rejected_id: int) -> tuple[list, list, list]:
    """(prompt, [chosen assistant turn], [rejected assistant turn]) of a step pair."""
    first, steps = path_steps(nodes, node_id)
    prompt = ctx.messages(instruction, first, steps)
    turn = [to_chat_dicts([Message("assistant", s.action, [s.tool_call] if s.tool_call else None,
                                   s.token_ids)])
            for s in (node_step(nodes[i]) for i in (chosen_id, rejected_id))]
    return prompt, turn[0], turn[1]


def episode_messages(ctx: Context, instruction: str, first_observation: str,
                     steps: list[Step]) -> tuple[list, list]:
    """(prompt, completion) of a whole episode: the completion alternates actions and
    observations (tool turns), which training masks out."""
    full = ctx.messages(instruction, first_observation, steps)
    return full[: ctx.prompt_len()], full[ctx.prompt_len():]
