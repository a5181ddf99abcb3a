"""The critic's concordance with search's returns (offline_agent/search/concordance.py) on
hand-built trees with known Q and scores; read back from a store; in the report's JSON and page."""

from __future__ import annotations

from offline_agent.evaluation import EvalConfig
from offline_agent.search.concordance import concordance, mcts_q
from offline_agent.types import Task
from pipelines.artifacts import CONCORDANCE
from pipelines.report import build_report, write_report
from pipelines.report_table import concordance_text
from storage import Store, TreeRow
from tests.rows import node_row


def shop_tree() -> list:
    """Tree 0 (local ids). Root's children: a (Q .8, score .5), b (Q .2, .3), c terminal
    (reward 1 though its mean return is .7, score .1), d unvisited. Under a (depth 2): e, f,
    h with equal Q .5 and scores .6, .4, .4; i (Q .1, .4); k without a score. Under b: one
    child."""
    n = node_row
    return [
        n(0, 0, visits=4, value_sum=2.5),
        n(0, 1, 0, visits=2, value_sum=1.6, critic_score=0.5),  # a
        n(0, 2, 0, visits=1, value_sum=0.2, critic_score=0.3),  # b
        n(0, 3, 0, visits=1, value_sum=0.7, critic_score=0.1, terminal=True, reward=1.0),  # c
        n(0, 4, 0, visits=0, value_sum=0.0, critic_score=0.1),  # d: never visited
        n(0, 5, 1, depth=2, visits=1, value_sum=0.5, critic_score=0.6),  # e
        n(0, 6, 1, depth=2, visits=1, value_sum=0.5, critic_score=0.4),  # f
        n(0, 7, 1, depth=2, visits=1, value_sum=0.5, critic_score=0.4),  # h
        n(0, 8, 1, depth=2, visits=1, value_sum=0.1, critic_score=0.4),  # i
        n(0, 9, 1, depth=2, visits=1, value_sum=0.9, critic_score=None),  # k: no score
        n(0, 10, 2, depth=2, visits=1, value_sum=0.3, critic_score=1.0),  # b's only child
    ]


def math_tree() -> list:
    """Tree 1: two visited children with the uniform score (no critic) and different Q."""
    return [node_row(1, 0, visits=2, value_sum=1.0),
            node_row(1, 1, 0, visits=1, value_sum=1.0, critic_score=0.5),
            node_row(1, 2, 0, visits=1, value_sum=0.0, critic_score=0.5)]


def counts(concordance, n, c, d, tq=0, ts=0, tb=0) -> dict:
    return {"concordance": concordance, "n": n, "concordant": c, "discordant": d,
            "tied_q": tq, "tied_score": ts, "tied_both": tb}


EXPECTED = {
    # root: (a,b) concordant; (a,c), (b,c) discordant (c's Q is its reward 1, not .7); d
    # skipped. math root: a tie in score. Under a: (e,f), (e,h) tied Q, (f,h) both, (e,i)
    # concordant, (f,i), (h,i) tied score; k skipped. Under b: no pair.
    "overall": counts(0.5, 4, 2, 2, tq=2, ts=3, tb=1),
    "by_depth": {"0": counts(0.333, 3, 1, 2, ts=1), "1": counts(1.0, 1, 1, 0, tq=2, ts=2, tb=1)},
    "by_env": {"math": counts(None, 0, 0, 0, ts=1),
               "minishop": counts(0.5, 4, 2, 2, tq=2, ts=2, tb=1)},
}


def test_counts_on_a_hand_built_tree():
    assert concordance([("minishop", shop_tree()), ("math", math_tree())]) == EXPECTED
    assert mcts_q(shop_tree()[3]) == 1.0 and mcts_q(shop_tree()[1]) == 0.8


def test_empty_trees_have_no_concordance_not_nan():
    empty = {"overall": counts(None, 0, 0, 0), "by_depth": {}, "by_env": {}}
    assert concordance([]) == empty
    assert concordance([("minishop", [node_row(0, 0, visits=3, value_sum=1.0)])]) == empty
    one_child = [node_row(0, 0, visits=1, value_sum=1.0),
                 node_row(0, 1, 0, visits=1, value_sum=1.0, critic_score=1.0)]
    assert concordance([("minishop", one_child)])["overall"] == counts(None, 0, 0, 0)


def test_any_score_can_be_checked():
    """A learned critic's predictions in place of the stored scores: the returns themselves
    agree on every pair without a tie in Q; a child without a prediction is skipped."""
    tree = shop_tree()
    predicted = {r.node_id: mcts_q(r) for r in tree if r.visits and r.node_id != tree[2].node_id}
    got = concordance([("minishop", tree)], score=lambda r: predicted.get(r.node_id))
    # root: a, c left (b has no prediction): 1 pair; under a: e, f, h, i, k: (e,f), (e,h),
    # (f,h) tied both, 7 others concordant; b's child alone
    assert got["overall"] == counts(1.0, 8, 8, 0, tb=3)


def stored(tmp_path) -> Store:
    store = Store(tmp_path / "store.duckdb")
    store.insert_tasks([Task("t0", "minishop", "buy"), Task("t1", "math", "add")], "tasks")
    store.upsert_trees([TreeRow(0, "t0", "done", 4), TreeRow(1, "t1", "done", 2)], "search")
    store.insert_nodes(shop_tree() + math_tree())
    return store


def test_read_back_from_the_store(tmp_path):
    with stored(tmp_path) as store:
        trees = store.tree_statistics("search")
        assert [env for env, _ in trees] == ["minishop", "math"]
        assert [len(nodes) for _, nodes in trees] == [11, 3]
        assert trees[0][1][3].terminal and trees[0][1][3].observation is None
        assert concordance(trees) == EXPECTED
        assert store.tree_statistics("search@2") == []


def test_report_json_page_and_status_line(tmp_path):
    with stored(tmp_path) as store:
        report = build_report(store, EvalConfig())
    assert report[CONCORDANCE] == {"search": EXPECTED}
    html = write_report(tmp_path, report).read_text()
    section = html[html.index("<h2>Critic concordance</h2>"):html.index("<h2>Data</h2>")]
    for cells in (["all", "0.500", "4", "2", "2", "2", "3", "1"],
                  ["depth 0", "0.333", "3"], ["depth 1", "1.000", "1"], ["env math", "-", "0"]):
        assert "<tr>" + "".join(f"<td>{c}</td>" for c in cells) in section
    assert concordance_text(EXPECTED) == (
        "critic concordance 0.500 (n 4), ties Q/score/both 2/3/1; depth 0 0.333 (n 3); "
        "depth 1 1.000 (n 1); math - (n 0); minishop 0.500 (n 4)")
