"""The comparison table of a report: its columns and each policy entry's cells, shared by the
text table on stdout and the page (report_html.py), so both always show the same numbers; and
the critic concordance's rows (the page) and line (`offline-agent status`). On stdout the
table comes in blocks of columns that fit a terminal of WIDTH columns; the page and
report.json hold it whole.

An entry is one of report.json's `policies` (pipelines/report.py `policy_results`).
"""

from __future__ import annotations

import textwrap

from offline_agent.evaluation import BASE
from pipelines.artifacts import HELD_OUT


def _pct(value: float | None, ci: list[float] | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    text = f"{value * 100:{sign}.1f}%"
    return text + (f" [{ci[0] * 100:{sign}.1f}, {ci[1] * 100:{sign}.1f}]" if ci else "")


def _num(value: float | None, ci: list[float] | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    sign = "+" if signed else ""
    return f"{value:{sign}.3f}" + (f" [{ci[0]:{sign}.3f}, {ci[1]:{sign}.3f}]" if ci else "")


def comparison_cells(entry: dict) -> list[str]:
    """One row of the comparison table as text cells (shared by stdout and the page)."""
    d = entry["delta_vs_base"] or {}
    g = entry["delta_vs_greedy"] or {}
    return [
        entry["name"], entry["mode"], str(entry["n_tasks"]),
        _pct(entry["success_rate"], entry["ci95"]),
        _pct(d.get("success_rate"), d.get("ci95"), signed=True) if d else "-",
        _pct(g.get("success_rate"), g.get("ci95"), signed=True) if g else "-",
        _p(d),
        _num(entry["mean_reward"], entry["mean_reward_ci95"]),
        _num(d.get("mean_reward"), d.get("mean_reward_ci95"), signed=True) if d else "-",
        _changed(d),
        _pct(entry["invalid_rate"], None),
        _num(entry["mean_steps"], None),
        _held_out(entry[HELD_OUT]),
    ]


def held_out_lines(stats: dict) -> tuple[dict, list[str]]:
    """A train stage's stats ({policy: its final record}) without the held-out figures, and a
    line per policy that has them, for `offline-agent status`."""
    rest = {p: {k: x for k, x in v.items() if k != HELD_OUT} for p, v in stats.items()}
    lines = [f"held-out pairs {p}: {_held_out(v[HELD_OUT])}" for p, v in stats.items()
             if HELD_OUT in v]
    return rest, lines


def _held_out(h: dict | None) -> str:
    """Held-out pair accuracy [95% CI] of n, the base's on the same pairs, and the implicit
    reward accuracy (training moved toward the chosen)."""
    if not h:
        return "-"
    if not h["n"]:
        return f"none held out ({h['left_out_of']}'s sample took all {h['mined']})"
    return (f"{_pct(h['pair_accuracy'], h['pair_accuracy_ci95'])} of {h['n']} "
            f"(base {_pct(h['base_pair_accuracy'], None)}); reward "
            f"{_pct(h['reward_accuracy'], h['reward_accuracy_ci95'])}")


def _changed(d: dict) -> str:
    """Episodes whose actions differ from base's: changed/n [95% CI]."""
    if not d or d.get("changed_rate") is None:
        return "-"
    lo, hi = d["changed_ci95"]
    return f"{d['changed']}/{d['n_tasks']} [{lo * 100:.0f}, {hi * 100:.0f}%]"


def _p(d: dict) -> str:
    """McNemar's p with the discordant tasks (wins:losses) and the configurations tried."""
    if not d or d.get("mcnemar_p") is None:
        return "-"
    return f"{d['mcnemar_p']:.3g} ({d['wins']}:{d['losses']}, {d['configs_tried']} tried)"


HELD_OUT_COLUMN = "held-out pairs: acc [95% CI] (base); reward acc"
COLUMNS = ["policy", "mode", "n", "success [95% CI]", "vs base (paired)", "vs greedy (paired)",
           "McNemar p vs base", "mean reward [95% CI]", "vs base (paired)", "changed vs base",
           "invalid", "steps", HELD_OUT_COLUMN]
# on stdout each group of columns starts a block: success, reward and steps, held-out pairs
BLOCK_STARTS = ("mode", "mean reward [95% CI]", HELD_OUT_COLUMN)


def comparison_rows(policies: list[dict]) -> list[list[str]]:
    """The header and a row per entry; "vs greedy" only where a search row has one, the
    held-out pair accuracy only where a policy held pairs out (the table is wide enough
    without an empty column)."""
    shown = {"vs greedy (paired)": any(e["delta_vs_greedy"] for e in policies),
             HELD_OUT_COLUMN: any((e[HELD_OUT] or {}).get("n") for e in policies)}
    keep = [i for i, c in enumerate(COLUMNS) if shown.get(c, True)]
    return [[r[i] for i in keep] for r in [COLUMNS] + [comparison_cells(e) for e in policies]]


WIDTH = 100  # the terminal columns the printed table fits


def comparison_table(report: dict, width: int = WIDTH) -> str:
    """The policies side by side as fixed-width text, for stdout: the columns in order, in
    blocks (a group of BLOCK_STARTS each, split further where it is wider) that each fit
    `width` columns with the policy column leading each, one blank line apart."""
    if not report["policies"]:
        return "no evaluation episodes in this run yet"
    rows = comparison_rows(report["policies"])
    return "\n\n".join(text_table([[r[0], *(r[i] for i in block)] for r in rows], width)
                        for block in column_blocks(rows, width))


def column_blocks(rows: list[list[str]], width: int) -> list[list[int]]:
    """Columns 1.. in order, in runs that fit beside column 0 within `width`, a new run at
    each of BLOCK_STARTS (a column too wide even alone gets a run of its own, which
    text_table wraps)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    blocks: list[list[int]] = [[]]
    used = widths[0]
    for i in range(1, len(widths)):
        if blocks[-1] and (rows[0][i] in BLOCK_STARTS or used + 2 + widths[i] > width):
            blocks.append([])
            used = widths[0]
        blocks[-1].append(i)
        used += 2 + widths[i]
    return blocks


def text_table(rows: list[list[str]], width: int) -> str:
    """The header row, a dashed rule, the other rows, as fixed-width text; a last column
    wider than what `width` leaves it is wrapped onto lines of its own."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    widths[-1] = min(widths[-1], max(width - sum(widths[:-1]) - 2 * (len(widths) - 1), 1))
    lines = []
    for r in rows:
        for j, part in enumerate(textwrap.wrap(r[-1], widths[-1]) or [""]):
            cells = [*(r[:-1] if j == 0 else [""] * (len(r) - 1)), part]
            lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip())
        if r is rows[0]:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def diagnostics_text(lines: list[dict]) -> str:
    """One line for stdout: how many judged checks are past their threshold, and which."""
    bad = [d["check"] for d in lines if d["ok"] is False]
    judged = sum(d["ok"] is not None for d in lines)
    return (f"diagnostics: {len(bad)} of {judged} judged checks past their threshold"
            + (f": {', '.join(bad)} (the report's Diagnostics section)" if bad else ""))


# ---- paired tests: each policy vs base, and report.json's `comparisons` -------------------
TEST_COLUMNS = ["policy", "against", "n", "success difference (paired) [95% CI]",
                "wins", "losses", "McNemar p", "configs tried"]


def paired_test_rows(report: dict) -> list[list[str]]:
    """One row per paired test: each policy against base (a trained policy's +mcts row also
    against the same policy greedy: what search at inference adds), then the `comparisons`."""
    tests = []
    for e in report["policies"]:
        name = e["policy"] + ("" if e["mode"] == "greedy" else f" +{e['mode']}")
        if e["delta_vs_base"]:
            tests.append((name, BASE, e["delta_vs_base"]))
        if e["delta_vs_greedy"] and e["policy"] != BASE:  # base's is the row above
            tests.append((name, f"{e['policy']} greedy", e["delta_vs_greedy"]))
    tests += [(c["policy"], c["against"], c) for c in report.get("comparisons", [])]
    return [[a, b, str(d["n_tasks"]), _pct(d["success_rate"], d["ci95"], signed=True),
             str(d["wins"]), str(d["losses"]), f"{d['mcnemar_p']:.3g}",
             str(d["configs_tried"])] for a, b, d in tests]


# ---- critic concordance (offline_agent/search/concordance.py) -------------------------------
CONCORDANCE_COLUMNS = ["pairs", "concordance", "n", "concordant", "discordant",
                       "tied Q", "tied score", "tied both"]


def concordance_rows(c: dict) -> list[list[str]]:
    """The table rows of one concordance dict: all pairs, then per depth, then per env."""
    groups = [("all", c["overall"])]
    groups += [(f"depth {d}", v) for d, v in c["by_depth"].items()]
    groups += [(f"env {e}", v) for e, v in c["by_env"].items()]
    return [[label, _fmt_concordance(v["concordance"]), str(v["n"]), str(v["concordant"]),
             str(v["discordant"]), str(v["tied_q"]), str(v["tied_score"]), str(v["tied_both"])]
            for label, v in groups]


def _fmt_concordance(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def concordance_text(c: dict) -> str:
    """One line for `offline-agent status`: all pairs, then each depth and env, with n."""
    def one(v: dict) -> str:
        return f"{_fmt_concordance(v['concordance'])} (n {v['n']})"

    o = c["overall"]
    parts = [f"{one(o)}, ties Q/score/both {o['tied_q']}/{o['tied_score']}/{o['tied_both']}"]
    parts += [f"depth {d} {one(v)}" for d, v in c["by_depth"].items()]
    parts += [f"{e} {one(v)}" for e, v in c["by_env"].items()]
    return "critic concordance " + "; ".join(parts)
