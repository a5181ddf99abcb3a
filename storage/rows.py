"""One row dataclass per table that stages write: what the Store's methods take and return;
and StageRow, a stages row as the Store reads it back for the runner, CLI and report.

Fields are the table's columns (storage/schema.py BASELINE) minus those the database or the
Store fills: `stage` (the writing stage, given to each insert) and the timestamps. A field is
required exactly where its column is NOT NULL without a default; every other field defaults
to the column's default (None for NULL), so a row built with only what a writer knows
inserts what the database would have filled in. JSON columns hold plain Python values
(dicts, lists, ...) both ways. tests/test_store.py checks the fields against the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, ClassVar, TypeVar

R = TypeVar("R", bound="Row")


class Row:
    """to_row / from_row between a row dataclass and a dict keyed by column."""

    TABLE: ClassVar[str]

    def to_row(self) -> dict[str, Any]:
        """Column -> value (shallow: JSON values are shared, not copied)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_row(cls: type[R], row: dict[str, Any]) -> R:
        """The row of a selected dict; columns that are not fields (stage, timestamps) drop."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


@dataclass(frozen=True)
class TreeRow(Row):
    """A task's search tree (its nodes are NodeRows with its tree_id)."""

    TABLE: ClassVar[str] = "trees"
    tree_id: int
    task_id: str
    status: str  # running | done
    simulations_done: int = 0
    best_reward: float | None = None


@dataclass(frozen=True)
class NodeRow(Row):
    """A search-tree node: the edge into it (action, call, observation) and its statistics."""

    TABLE: ClassVar[str] = "nodes"
    node_id: int  # storage/ids.py make_node_id(tree_id, local id)
    tree_id: int
    depth: int
    parent_id: int | None = None  # None at the root
    action: str | None = None  # raw policy text of the edge into this node
    tool_call: dict | None = None  # the parsed call ({"name", "arguments"}), None: unparseable
    observation: str | None = None
    visits: int = 0
    value_sum: float = 0.0
    critic_rank: int | None = None
    critic_score: float | None = None
    reward: float | None = None
    terminal: bool = False
    invalid: bool = False
    created_sim: int | None = None
    ending: float | None = None  # best reward of a listed action that ends the episode here
    info: dict | None = None  # the env's StepResult.info
    snapshot: dict | None = None  # Env.snapshot() after the action (None where not read)
    token_ids: list[int] | None = None  # the ids the policy generated (None: env-listed)
    realized_sum: float = 0.0  # value_sum's returns from the policy's own playouts


@dataclass(frozen=True)
class NodeVisits(Row):
    """What backup changes of a stored node (Store.update_visits): a part of a nodes row."""

    TABLE: ClassVar[str] = "nodes"
    node_id: int
    visits: int
    value_sum: float
    realized_sum: float


@dataclass(frozen=True)
class TrajectoryRow(Row):
    """An episode: a search rollout (source mcts_rollout) or a greedy one (source greedy)."""

    TABLE: ClassVar[str] = "trajectories"
    traj_id: int  # storage/ids.py rollout_traj_id / greedy_traj_id
    task_id: str
    source: str
    steps: list[dict]  # offline_agent.types.step_to_dict of each step
    reward: float
    success: bool
    tree_id: int | None = None
    simulation: int | None = None
    achieved: str | None = None


@dataclass(frozen=True)
class PairRow(Row):
    """A preference pair in TRL's conversational format, with its provenance."""

    TABLE: ClassVar[str] = "pairs"
    pair_id: int
    task_id: str
    kind: str  # step | trajectory
    prompt: list[dict]
    chosen: list[dict]
    rejected: list[dict]
    node_id: int | None = None  # the expanded node of a step pair
    chosen_q: float | None = None
    rejected_q: float | None = None
    margin: float | None = None
    env: str | None = None
    chosen_ref: int | None = None  # node id (step) / traj id (trajectory)
    rejected_ref: int | None = None
    info: dict | None = None


@dataclass(frozen=True)
class ExampleRow(Row):
    """An SFT example: a successful episode (rft) or a verified relabel (hindsight)."""

    TABLE: ClassVar[str] = "examples"
    example_id: int
    task_id: str  # the task the messages solve (the relabeled one for hindsight)
    env: str
    kind: str  # rft | hindsight
    instruction: str
    messages: list[dict]
    source_traj: int | None = None
    reward: float | None = None
    info: dict | None = None


@dataclass(frozen=True)
class MetricRow(Row):
    """One optimizer step's metrics of one series (a trained policy) of a train stage."""

    TABLE: ClassVar[str] = "metrics"
    series: str  # the trained policy's name
    step: int
    data: dict  # {"loss": ..., "margin": ..., ...}


@dataclass(frozen=True)
class EvalEpisodeRow(Row):
    """One evaluation episode of a policy on a test task."""

    TABLE: ClassVar[str] = "eval_episodes"
    policy: str  # base | a trained policy's name (`<policy>@k` in round k)
    mode: str  # greedy | mcts (eval.mcts: search at inference)
    task_id: str
    steps: list[dict]  # offline_agent.types.step_to_dict of each step
    reward: float
    success: bool


@dataclass(frozen=True)
class StageRow(Row):
    """A stage's (and shard's) attempts, as the runner records them (Store.start_stage,
    mark_stage_done, fail_stage); read-only, so unlike the rows above it has every column."""

    TABLE: ClassVar[str] = "stages"
    stage: str
    shard: str  # '' for unsharded stages, else 'i/n'
    status: str  # running | done | failed
    config_hash: str
    config: dict  # the config sections the hash covers, for diffs
    stats: dict | None
    started_at: datetime  # the last attempt's
    finished_at: datetime | None
    earlier_seconds: float  # the attempts before it, when the stage was resumed

    @property
    def seconds(self) -> float | None:
        """How long the stage took, over all its attempts; None while one is running."""
        return (self.earlier_seconds + (self.finished_at - self.started_at).total_seconds()
                if self.finished_at else None)


ROWS: tuple[type[Row], ...] = (TreeRow, NodeRow, TrajectoryRow, PairRow, ExampleRow, MetricRow,
                               EvalEpisodeRow)
