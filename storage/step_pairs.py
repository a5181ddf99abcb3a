"""Step-pair mining as one SQL pass over every stored node (siblings self-join + window caps).

The rules are offline_agent.mining.pairs.step_pairs (the oracle, in Python), and a child's
value is offline_agent.mining.value.child_value (Agent Q eq. 10: a terminal child is worth its
reward, others alpha*Q_mcts + (1-alpha)*critic); the `valued` CTE below is that function
written in SQL. Pairs with Q_w - Q_l >= theta, then caps per node, per task and in all (0:
none) taken round-robin over margin bins in a seeded md5 order. tests/test_mining.py checks
SQL and Python return identical pairs.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import contextmanager

import pyarrow as pa

from offline_agent.types import StepPair, StepPairParams
from storage.rows import NodeRow
from storage.store import Store, _where


def _capped(name: str, source: str, group: str, cap: str) -> str:
    """Two CTEs keeping at most `cap` rows of `source` per `group`: the first of every
    margin bin, then the second, ... (seeded `key` order inside a bin)."""
    return (f"{name}_ranked AS (SELECT *, row_number() OVER (PARTITION BY {group}, bin "
            f"ORDER BY key) AS rank FROM {source}), "
            f"{name} AS (SELECT * EXCLUDE (rank) FROM {name}_ranked QUALIFY row_number() "
            f"OVER (PARTITION BY {group} ORDER BY rank, bin, key) <= {cap})")


def _valued(stage_clause: str) -> str:
    """The CTEs `kids` (every child of a searched tree) and `valued` (the children that count,
    with their value Q): what both the pair pass and `sibling_gaps` read."""
    return f"""searched AS (SELECT tree_id FROM trees {stage_clause}),
        kids AS (
            SELECT n.node_id, n.parent_id, n.invalid, n.terminal, n.reward, tk.task_id, tk.env,
                n.terminal OR n.visits >= $min_visits AS counted,
                CASE WHEN n.visits > 0 THEN n.value_sum / n.visits
                     ELSE coalesce(n.ending, 0.0) END AS q_mcts,
                coalesce(cv.value, n.critic_score,
                         1.0 / count(*) OVER (PARTITION BY n.parent_id)) AS q_critic
            FROM nodes n JOIN searched USING (tree_id) JOIN trees t USING (tree_id)
                JOIN tasks tk USING (task_id) LEFT JOIN _critic_values cv USING (node_id)
            WHERE n.parent_id IS NOT NULL),
        valued AS (  -- offline_agent.mining.value.child_value
            SELECT *, CASE WHEN terminal THEN coalesce(reward, 0.0)
                           ELSE $alpha * q_mcts + (1 - $alpha) * q_critic END AS q
            FROM kids WHERE counted AND ($invalid OR NOT invalid))"""


def _query(edges: tuple[float, ...], stage_clause: str) -> str:
    bin_sql = " + ".join(f"(margin >= {float(e)!r})::INTEGER" for e in edges) or "0"
    return f"""CREATE OR REPLACE TEMP TABLE _step_pairs AS
        WITH {_valued(stage_clause)},
        cand AS (
            SELECT c.task_id, c.env, c.parent_id AS node_id, c.node_id AS chosen_id,
                r.node_id AS rejected_id, c.q AS chosen_q, r.q AS rejected_q,
                c.q - r.q AS margin,
                md5(concat($seed, ':', c.node_id, ':', r.node_id)) AS key
            FROM valued c JOIN valued r
                ON c.parent_id = r.parent_id AND c.node_id <> r.node_id
            WHERE NOT c.invalid AND c.q - r.q >= $theta),
        binned AS (
            SELECT *, {bin_sql} AS bin FROM cand),
        {_capped("by_node", "binned", "node_id", "$per_node")},
        {_capped("by_task", "by_node", "task_id", "$per_task")},
        all_ranked AS (
            SELECT *, row_number() OVER (PARTITION BY env, bin ORDER BY key) AS rank
            FROM by_task)
        SELECT *,
            row_number() OVER (ORDER BY rank, env, bin, key) <= $total AS kept,
            (SELECT count(*) FROM binned) AS n_candidates,
            (SELECT count(*) FROM by_node) AS n_after_node_cap
        FROM all_ranked"""


def select_step_pairs(store: Store, params: StepPairParams, stage: str | None = None,
                      critic: Mapping[int, float] | None = None
                      ) -> tuple[list[StepPair], dict[str, int]]:
    """Step-level pairs of every stored tree (those `stage` searched, when given), mined and
    balanced in one SQL pass. `critic` (node id -> value: the learned critic's) replaces the
    stored critic scores in Q_critic where it has a node. Returns the kept pairs (task, node,
    chosen, rejected order) and counts: candidates, after_node_cap, after_task_cap, kept."""
    stage_clause, stage_params = _where(stage=stage)
    with _critic_values(store, critic):
        _run_query(store, params, stage_clause, stage_params)
    rows = store._sql("SELECT task_id, env, node_id, chosen_id, rejected_id, chosen_q, "
                      "rejected_q, margin, bin FROM _step_pairs WHERE kept "
                      "ORDER BY task_id, node_id, chosen_id, rejected_id")
    counts = store._sql("SELECT any_value(n_candidates), any_value(n_after_node_cap), "
                        "count(*), count(*) FILTER (kept) FROM _step_pairs")[0]
    store._sql("DROP TABLE _step_pairs")
    stats = dict(zip(("candidates", "after_node_cap", "after_task_cap", "kept"),
                     [c or 0 for c in counts]))
    return [StepPair(*r) for r in rows], stats


def sibling_gaps(store: Store, params: StepPairParams, stage: str | None = None,
                 critic: Mapping[int, float] | None = None) -> dict:
    """Why the pass found what it found, by the same values: `expanded`, the nodes with a
    child; `compared`, those with two children that count (terminal, or `min_visits`
    visits); `best_gap`, the largest Q of a valid child minus the least Q of a sibling over
    those (None without one), which theta is compared with."""
    stage_clause, stage_params = _where(stage=stage)
    with _critic_values(store, critic):
        (row,) = store._sql(
            f"""WITH {_valued(stage_clause)},
            gaps AS (SELECT max(q) FILTER (NOT invalid) - min(q) AS gap FROM valued
                     GROUP BY parent_id HAVING count(*) >= 2)
            SELECT (SELECT count(DISTINCT parent_id) FROM kids),
                   (SELECT count(*) FROM gaps), (SELECT max(gap) FROM gaps)""",
            {**stage_params, "alpha": params.alpha, "min_visits": params.min_visits,
             "invalid": params.invalid_rejected})
    return dict(zip(("expanded", "compared", "best_gap"), row))


@contextmanager
def _critic_values(store: Store, critic: Mapping[int, float] | None):
    """The learned critic's values as the table `_critic_values` while the block runs."""
    values = pa.table({"node_id": pa.array(list(critic or {}), pa.int64()),
                       "value": pa.array(list((critic or {}).values()), pa.float64())})
    store.con.register("_critic_values", values)
    try:
        yield
    finally:
        store.con.unregister("_critic_values")


def _run_query(store: Store, params: StepPairParams, stage_clause: str,
               stage_params: dict) -> None:
    store._sql(_query(params.margin_bins, stage_clause), {
        **stage_params, "alpha": params.alpha, "theta": params.theta,
        "min_visits": params.min_visits, "seed": str(params.seed),
        "invalid": params.invalid_rejected, "per_node": params.max_pairs_per_node,
        "per_task": params.max_pairs_per_task, "total": params.max_pairs or (1 << 62)})


def step_pair_inputs(store: Store) -> tuple[list[NodeRow], dict[int, tuple[str, str]]]:
    """What the Python oracle mines: every node of a stored tree (id order), and tree id ->
    (task id, env)."""
    trees = {t: (task, env) for t, task, env in store._sql(
        "SELECT t.tree_id, tk.task_id, tk.env FROM trees t JOIN tasks tk USING (task_id)")}
    nodes = store._read(NodeRow, "SELECT * FROM nodes WHERE tree_id IN (SELECT tree_id FROM "
                        "trees) ORDER BY node_id")
    return nodes, trees
