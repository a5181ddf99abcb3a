"""The run report as one self-contained HTML page: tables, and matplotlib charts inlined as SVG
(no script, no network, opens from a file or a copied folder).

Input is report.json's dict (pipelines/report.py), so the page shows exactly what the
JSON holds; every section says so when its part of the run is missing.
"""

from __future__ import annotations

import io
import json
from html import escape

from pipelines.artifacts import CONCORDANCE
from pipelines.report_table import (
    CONCORDANCE_COLUMNS,
    TEST_COLUMNS,
    comparison_rows,
    concordance_rows,
    paired_test_rows,
)

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1280px;
       color: #222; padding: 0 16px; }
h1 { font-size: 22px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { padding: 4px 7px; border-bottom: 1px solid #eee; text-align: left;
         font-variant-numeric: tabular-nums; vertical-align: top; }
th { background: #f5f5f5; } .wide { overflow-x: auto; } .missing { color: #888; font-style: italic; }
.note { color: #555; font-size: 13px; } svg { max-width: 100%; height: auto; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; }
details { margin: 4px 0; } summary { cursor: pointer; }
.episode { display: flex; gap: 16px; } .episode > div { flex: 1; min-width: 0; }
.episode pre { white-space: pre-wrap; word-break: break-word; margin: 2px 0 6px;
               background: #f7f7f7; padding: 4px 6px; font-size: 12px; }
.invalid { color: #b00; }
.mark { font-weight: bold; white-space: nowrap; } .ok { color: #1a7f37; } .bad { color: #c62828; }
.na { color: #888; }
"""


def render(report: dict) -> str:
    parts = [
        f"<h1>offline-agent run {escape(str(report['run_id']))}</h1>",
        f"<p class='note'>generated {escape(report['generated_at'])}; numbers from "
        "report.json next to this page</p>",
        "<h2>Policies on the held-out test tasks</h2>", _comparison(report["policies"]),
        "<h2>Paired tests</h2>", _paired_tests(report),
        "<h2>Diagnostics</h2>", _diagnostics(report.get("diagnostics", [])),
        "<h2>Success by policy</h2>", _success_chart(report["policies"]),
        "<h2>What changed: episodes</h2>", _transcripts(report.get("transcripts", {})),
        "<h2>Training</h2>", _training(report["training"]),
        "<h2>Checkpoint selection on validation</h2>", _selection(report.get("selection", {})),
        "<h2>Online GRPO</h2>", _grpo(report.get("grpo", [])),
        "<h2>Search</h2>", _search(report["stages"]),
        "<h2>Critic concordance</h2>", _concordance(report[CONCORDANCE]),
        "<h2>Data</h2>", _data(report["data"]),
        "<h2>Stages</h2>", _stages(report["stages"]),
        "<h2>Config</h2>", _config(report["config"]),
    ]
    return ("<!doctype html><html><head><meta charset='utf-8'>"
            f"<title>offline-agent report {escape(str(report['run_id']))}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _missing(text: str) -> str:
    return f"<p class='missing'>{escape(text)}</p>"


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<div class='wide'><table><tr>{head}</tr>{body}</table></div>"


def _comparison(policies: list[dict]) -> str:
    if not policies:
        return _missing("No evaluation episodes yet (the eval stage has not run).")
    note = ("<p class='note'>success: Wilson 95% interval; mean reward: bootstrap 95% interval "
            "over tasks; vs base: mean per-task difference on the tasks both policies played, "
            "paired bootstrap 95% interval (it excludes 0 when the difference is clear); vs "
            "greedy: a <policy>+mcts row (search at inference) against the same policy's greedy "
            "episodes on the same tasks, paired the same way. "
            "McNemar p vs base (wins:losses, configurations tried): the paired tests below, "
            "which also test each trained policy's +mcts row against its greedy. "
            "changed vs base: the tasks where the policy's greedy actions differ from base's "
            "in any step (Wilson 95% interval), which moves before success does: on a handful "
            "of test tasks, success shows the pipeline working, not a result. "
            "held-out pairs (when a policy trained on a sample, train.max_pairs): on the mined "
            "pairs its sample left out (RFT: those dpo_step's left out), the share where the "
            "policy gives the chosen action a higher log-prob than the rejected one, of n pairs, "
            "Wilson 95% interval, base's share on the same pairs beside it; reward acc: the "
            "share where training raised the chosen's log-prob more than the rejected's "
            "(DPO's implicit reward accuracy).</p>")
    header, *rows = comparison_rows(policies)
    return _table(header, rows) + note


def _paired_tests(report: dict) -> str:
    rows = paired_test_rows(report)
    if not rows:
        return _missing("No two evaluated policies to compare yet.")
    note = ("<p class='note'>on the test tasks both policies played. wins: tasks only the "
            "policy solved; losses: tasks only the other one did. McNemar p: exact two-sided "
            "sign test on those discordant tasks (the others carry no information on the "
            "difference). configs tried: eval.configs_tried, the configurations tried to reach "
            "this one (it included); with k tried, read each p-value against k (e.g. "
            "Bonferroni: p &times; k).</p>")
    return _table(TEST_COLUMNS, rows) + note


def _selection(by_policy: dict[str, dict]) -> str:
    """Each policy's candidates on the validation tasks, the chosen one marked, and why."""
    if not by_policy:
        return _missing("train.select is last: each policy's final adapter is its last step's.")
    rows = [[policy, c["step"], "chosen" if c["step"] == sel["step"] else "",
             f"{100 * (c['success_rate'] or 0):.1f}%", _fmt(c["mean_reward"]), c["n_tasks"]]
            for policy, sel in by_policy.items() for c in sel["candidates"]]
    why = "".join(f"<li>{escape(p)}: {escape(sel['why'])}</li>" for p, sel in by_policy.items())
    return (_table(["policy", "step", "", "validation success", "mean reward", "n"], rows)
            + f"<ul class='note'>{why}</ul>")


MARKS = {True: ("ok", "&#9679; ok"), False: ("bad", "&#9679; check"), None: ("na", "&#9675; n/a")}


def _diagnostics(lines: list[dict]) -> str:
    """pipelines/diagnostics.py's lines: mark, check, figure, threshold, every policy."""
    if not lines:
        return _missing("No diagnostics (a report written before they existed).")
    head = "".join(f"<th>{h}</th>" for h in ("", "check", "figure", "threshold", "by policy"))
    rows = "".join(
        f"<tr><td class='mark {MARKS[d['ok']][0]}'>{MARKS[d['ok']][1]}</td>"
        f"<td>{escape(d['label'])}</td><td>{escape(d['figure'])}</td>"
        f"<td>{escape(d['threshold'])}</td><td class='note'>{escape(d['detail'])}</td></tr>"
        for d in lines)
    bad = sum(d["ok"] is False for d in lines)
    note = (f"<p class='note'>{bad} of {len(lines)} checks past their threshold (red); "
            "n/a: nothing to judge yet. Thresholds are rules of thumb: a red line says where "
            "to look (docs/evaluation.md).</p>")
    return f"<table><tr>{head}</tr>{rows}</table>{note}"


SIDES = (("wins", "solved where base failed"), ("losses", "failed where base solved"))


def _transcripts(by_policy: dict[str, dict]) -> str:
    """Per trained policy and side, a few tasks, each with both episodes side by side."""
    if not by_policy:
        return _missing("No trained policy evaluated beside base yet.")
    parts = []
    for policy, sides in by_policy.items():
        for side, label in SIDES:
            shown = "".join(_task(policy, t) for t in sides[side])
            count = f"{len(sides[side])} of {sides[f'n_{side}']} shown"
            parts.append(f"<details><summary><b>{escape(policy)}</b> {label} ({count})"
                         f"</summary>{shown or _missing('none')}</details>")
    note = ("<p class='note'>test tasks in task order; each step: the action the policy "
            "wrote, the observation it got back (long pages cut), the step's reward.</p>")
    return "".join(parts) + note


def _task(policy: str, t: dict) -> str:
    columns = "".join(f"<div>{_episode(name, t[key])}</div>"
                      for name, key in ((policy, "policy"), ("base", "base")))
    return (f"<details><summary>{escape(t['task_id'])}: {escape(t['instruction'])}</summary>"
            f"<div class='episode'>{columns}</div></details>")


def _episode(name: str, e: dict) -> str:
    head = (f"<p><b>{escape(name)}</b>: reward {e['reward']:.3g}, "
            f"{'solved' if e['success'] else 'not solved'}, {len(e['steps'])} steps</p>")
    return head + "".join(_step(i, s) for i, s in enumerate(e["steps"], 1))


def _step(i: int, s: dict) -> str:
    mark = " class='invalid'" if s["invalid"] else ""
    flag = ", invalid" if s["invalid"] else ""
    return (f"<p{mark}>step {i} (reward {s['reward']:.3g}{flag})</p>"
            f"<pre>&gt; {escape(s['action'])}</pre><pre>{escape(s['observation'])}</pre>")


def _svg(fig) -> str:
    """A matplotlib figure as an inline <svg> element (text kept as text)."""
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _success_chart(policies: list[dict]) -> str:
    from matplotlib.figure import Figure

    if not policies:
        return _missing("Nothing to plot yet.")
    fig = Figure(figsize=(max(4.0, 1.1 * len(policies) + 1.5), 3.2))
    ax = fig.subplots()
    labels = [e["name"] for e in policies]
    rates = [100 * (e["success_rate"] or 0) for e in policies]
    lo = [r - 100 * e["ci95"][0] if e["ci95"] else 0 for r, e in zip(rates, policies)]
    hi = [100 * e["ci95"][1] - r if e["ci95"] else 0 for r, e in zip(rates, policies)]
    bars = ax.bar(labels, rates, width=0.6, yerr=[lo, hi], capsize=6, color="#4c78a8")
    for i, bar in enumerate(bars):
        bar.set_gid(f"bar-{i}")  # <g id="bar-i"> in the SVG: one per policy (the browser test)
    for i, (rate, up, e) in enumerate(zip(rates, hi, policies)):
        ax.annotate(f"{rate:.1f}% (n={e['n_tasks']})", (i, rate + up), xytext=(0, 4),
                    textcoords="offset points", ha="center", fontsize=8)
    ax.set_ylabel("success (%)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    return _svg(fig) + "<p class='note'>error bars: Wilson 95% intervals</p>"


def _training(curves: dict[str, list[dict]]) -> str:
    from matplotlib.figure import Figure

    if not curves:
        return _missing("No training metrics yet (the train stage has not run or wrote none).")
    keys = [k for k in ("loss", "margin") if any(k in p for c in curves.values() for p in c)]
    fig = Figure(figsize=(5.2 * max(len(keys), 1), 3.2))
    axes = fig.subplots(1, len(keys), squeeze=False)[0]
    for ax, key in zip(axes, keys):
        for name, points in curves.items():
            xy = [(p["step"], p[key]) for p in points if p.get(key) is not None]
            if xy:
                ax.plot(*zip(*xy), label=name, marker="." if len(xy) < 40 else None)
        ax.set_xlabel("optimizer step")
        ax.set_title("reward margin" if key == "margin" else key)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    last = [[name, points[-1]["step"], *(_fmt(points[-1].get(k)) for k in keys)]
            for name, points in curves.items()]
    return _svg(fig) + _table(["policy", "last step", *keys], last)


GRPO_PANELS = (("reward_mean", "mean reward of the step's groups"), ("entropy", "entropy"),
               ("kl", "KL to the reference"), ("clip_fraction", "clip fraction"))


def _grpo(points: list[dict]) -> str:
    """The GRPO stage's health per step: reward, and the known failure signs (entropy
    collapse, KL drift, clipping)."""
    from matplotlib.figure import Figure

    if not points:
        return _missing("No GRPO steps (grpo.enabled is false, or the stage has not run).")
    fig = Figure(figsize=(14, 3))
    for ax, (key, title) in zip(fig.subplots(1, len(GRPO_PANELS)), GRPO_PANELS):
        xy = [(p["step"], p[key]) for p in points if p.get(key) is not None]
        if xy:
            ax.plot(*zip(*xy), marker="." if len(xy) < 40 else None)
        ax.set_xlabel("GRPO step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    keys = ("reward_mean", "success", "tied_groups", "resampled_groups", "kl", "entropy")
    last = points[-1]
    return _svg(fig) + _table(["last step", *keys],
                              [[last["step"], *(_fmt(last.get(k)) for k in keys)]])


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _search(stages: list[dict]) -> str:
    rows = [r for r in stages if r["stage"] in ("baseline", "search") and r["stats"]]
    if not rows:
        return _missing("No baseline or search statistics yet.")
    keys = list(dict.fromkeys(k for r in rows for k in r["stats"] if k != CONCORDANCE))
    header = ["statistic"] + [r["stage"] + (f" [{r['shard']}]" if r["shard"] else "")
                              for r in rows]
    return _table(header, [[k] + [_fmt(r["stats"].get(k)) for r in rows] for k in keys])


def _concordance(by_stage: dict[str, dict]) -> str:
    if not by_stage:
        return _missing("No search trees yet.")
    note = ("<p class='note'>pairs of visited sibling actions: how often the critic's scores "
            "order them as search's returns do (Q_mcts; a terminal action's reward). "
            "concordance = concordant / n, n = concordant + discordant; 0.5 is chance, ties "
            "are counted apart; depth is the parent's.</p>")
    tables = [f"<p>stage {escape(stage)}</p>" + _table(CONCORDANCE_COLUMNS, concordance_rows(c))
              for stage, c in by_stage.items()]
    return "".join(tables) + note


def _data(data: dict) -> str:
    rows = [[group, kind, n] for group, counts in data.items() for kind, n in counts.items()]
    return _table(["table", "kind", "rows"], rows) if rows else _missing("No data yet.")


def _stages(stages: list[dict]) -> str:
    if not stages:
        return _missing("No stage has run.")
    rows = [[r["stage"] + (f" [{r['shard']}]" if r["shard"] else ""), r["status"],
             "-" if r["seconds"] is None else f"{r['seconds']:.1f}"] for r in stages]
    return _table(["stage", "status", "seconds"], rows)


def _config(config: dict | None) -> str:
    if not config:
        return _missing("No run config recorded.")
    text = json.dumps(config, indent=1)
    return f"<details><summary>the run's resolved config</summary><pre>{escape(text)}</pre></details>"
