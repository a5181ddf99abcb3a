"""How often a critic orders sibling actions the way search's returns do: a standing diagnostic.

For every expanded node, each pair of its children that search visited (visits >= 1) and that
both have a score is compared twice: by Q, search's estimate of the return (Q_mcts =
value_sum / visits; a terminal child's exact reward, as in offline_agent/mining/value.py and
search/mcts.py), and by the critic's score. Concordant: both order the pair the same way;
discordant: the opposite way; a tie in Q, in the score or in both is counted apart and
left out. Concordance = concordant / (concordant + discordant) over n = concordant +
discordant pairs, Kendall-style: 1 is a critic that always agrees with the returns, 0.5 is
chance, None is no comparable pair (never NaN). Counted in all, per depth (of the parent:
depth 0 compares the root's children) and per env.

Why visited children only: an unvisited child's return is unknown, so there is nothing to
agree with. Why not the eq. 10 mix: that Q contains the critic's own score, and a critic
cannot be checked against itself.

The score is a function of the child, so one count serves any critic: the frozen critic's
stored `critic_score` by default; a learned critic passes its predictions for held-out trees.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Protocol

TIE = 1e-9  # |difference| at most this is a tie: equal returns summed in another order


class Child(Protocol):
    """What the count reads of a stored node (a storage NodeRow has these fields)."""

    node_id: int
    parent_id: int | None
    depth: int
    visits: int
    value_sum: float
    terminal: bool
    reward: float | None
    critic_score: float | None


Score = Callable[[Child], float | None]


def stored_score(child: Child) -> float | None:
    """The frozen critic's score as search stored it."""
    return child.critic_score


def mcts_q(child: Child) -> float:
    """Search's value of a visited child: its reward if terminal, else its mean return."""
    if child.terminal:
        return child.reward if child.reward is not None else 0.0
    return child.value_sum / child.visits


@dataclass
class Counts:
    """Pairs of visited siblings by how the critic's order compares with Q's."""

    concordant: int = 0
    discordant: int = 0
    tied_q: int = 0  # equal Q, different scores
    tied_score: int = 0  # equal scores, different Q
    tied_both: int = 0

    def add(self, q: tuple[float, float], score: tuple[float, float]) -> None:
        dq, ds = q[0] - q[1], score[0] - score[1]
        q_tie, s_tie = abs(dq) <= TIE, abs(ds) <= TIE
        if q_tie and s_tie:
            self.tied_both += 1
        elif q_tie:
            self.tied_q += 1
        elif s_tie:
            self.tied_score += 1
        elif (dq > 0) == (ds > 0):
            self.concordant += 1
        else:
            self.discordant += 1

    def merge(self, other: Counts) -> None:
        for name in vars(other):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict:
        """Plain values (a stage's stats, report.json): concordance None without a pair."""
        n = self.concordant + self.discordant
        return {"concordance": round(self.concordant / n, 3) if n else None, "n": n,
                **vars(self)}


def sibling_counts(children: Sequence[Child], score: Score = stored_score) -> Counts:
    """The pairs among one node's children: those visited and scored, two by two."""
    counts = Counts()
    kept = [(mcts_q(c), s) for c in children if c.visits >= 1 and (s := score(c)) is not None]
    for (qa, sa), (qb, sb) in combinations(kept, 2):
        counts.add((qa, qb), (sa, sb))
    return counts


def concordance(trees: Iterable[tuple[str, Sequence[Child]]],
                score: Score = stored_score) -> dict:
    """{"overall", "by_depth" (parent's depth as text), "by_env"} of trees given as (env, the
    tree's nodes); each a Counts.to_dict()."""
    overall, by_depth, by_env = Counts(), {}, {}
    for env, nodes in trees:
        families: dict[int, list[Child]] = {}
        for node in nodes:
            if node.parent_id is not None:
                families.setdefault(node.parent_id, []).append(node)
        for children in families.values():
            counts = sibling_counts(children, score)
            overall.merge(counts)
            by_depth.setdefault(children[0].depth - 1, Counts()).merge(counts)
            by_env.setdefault(env, Counts()).merge(counts)
    return {"overall": overall.to_dict(),
            "by_depth": {str(d): c.to_dict() for d, c in sorted(by_depth.items())},
            "by_env": {e: c.to_dict() for e, c in sorted(by_env.items())}}
