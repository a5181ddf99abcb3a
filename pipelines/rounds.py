"""Rounds of `run.iterations`: the names of round k's stages and policies.

Round 1 is the plain pipeline. Round k >= 2 runs search, critic, mine, train and eval again
as `search@k`, `critic@k`, `mine@k`, `train@k`, `eval@k`; every row a stage writes carries
its stage name, so each round's trees, episodes, pairs, examples, checkpoints and metrics
stay apart (and `--force` clears one round only). Round k's trained policies are named `<policy>@k`.
A stage knows its round as data (Stage.round, ctx.round); the name only labels the rows.
Round k's model, the iterate of round k-1, and where it lives: pipelines/artifacts.py.
"""

from __future__ import annotations

from collections.abc import Callable, Collection


def round_name(name: str, r: int) -> str:
    """Round r's name of a stage or policy: unchanged in round 1, `name@r` after."""
    return name if r == 1 else f"{name}@{r}"


def stored_rounds(rows: Callable[[str], Collection], name: str) -> list[int]:
    """The rounds r whose stage `name` left rows (rows(round_name(name, r)), e.g.
    store.trees and "search"), in order. Rounds run one after another (round r starts from
    round r-1's training), so the first round without rows ends the list."""
    out: list[int] = []
    while rows(round_name(name, len(out) + 1)):
        out.append(len(out) + 1)
    return out
