"""A stage's headline: its few figures that say how it went, in one line, for
`offline-agent status` (`--verbose` prints the whole stats dict instead).

Each stage writes its own stats dict (pipelines/stages/); `headline` knows the keys that
matter of each and falls back to the dict's top-level numbers and words for any other.
"""

from __future__ import annotations

from offline_agent.mining.advice import NO_STEP_PAIRS
from pipelines.artifacts import CONCORDANCE, HELD_OUT


def headline(stage: str, stats: dict | None) -> str:
    """One line for a stage's stats ('' for none); `stage` may carry its round (train@2)."""
    stats = stats or {}
    if "error" in stats:
        return str(stats["error"]).splitlines()[0][:200] if stats["error"] else ""
    if "skipped" in stats:
        return f"skipped: {stats['skipped']}"
    show = _BY_STAGE.get(stage.partition("@")[0], _scalars)
    try:
        return show(stats)
    except (KeyError, TypeError, ValueError):  # stats of an older version: show what is there
        return _scalars(stats)


def notes(stage: str, stats: dict | None) -> list[str]:
    """Lines a person must read under the headline: what a stage found missing, and why."""
    why = (stats or {}).get(NO_STEP_PAIRS)
    return [f"no step pairs: {why}"] if why else []


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _tasks(s: dict) -> str:
    counts = ", ".join(f"{s[k]} {k}" for k in ("train", "test", "val") if k in s)
    return f"{s['env']}: {counts} tasks"


def _baseline(s: dict) -> str:
    return (f"greedy on {s['greedy_n_tasks']} train tasks: success "
            f"{_pct(s['greedy_success_rate'])}, invalid {_pct(s['greedy_invalid_rate'])}, "
            f"{s['greedy_mean_steps']:.1f} steps")


def _search(s: dict) -> str:
    line = (f"solved {s['tasks_solved_by_search']}/{s['trees']} train tasks (greedy "
            f"{s['tasks_solved_greedy']}); {_n(s.get('nodes', 0), 'node')}, "
            f"{_n(s.get('simulations', 0), 'simulation')}")
    if s.get("trees_resumed"):
        line += f", {_n(s['trees_resumed'], 'tree')} resumed"
    return line + _concordance(s.get(CONCORDANCE))


def _concordance(c: dict | None) -> str:
    """The critic's concordance with Q, where it was measured on any pair."""
    if not c or not c["overall"]["n"]:
        return ""
    o = c["overall"]
    return f"; critic concordance {o['concordance']:.3f} (n {o['n']})"


def _critic(s: dict) -> str:
    return f"fitted on {s['trees']} trees" + _concordance(s.get(CONCORDANCE))


def _mine(s: dict) -> str:
    return (f"step pairs {s['step_pairs']}, trajectory pairs {s['trajectory_pairs']}, rft "
            f"{s['rft_examples']}, hindsight {s['hindsight_examples']}")


def export_rows(counts: dict[str, int], rft_hindsight: bool) -> str:
    """`pairs 3, trajectory_pairs 3, rft 8 (6 solved + 2 hindsight), hindsight 2`: the rft
    count says it holds the hindsight rows too, so it reads right next to the mine stage's
    rft_examples."""
    parts = []
    for config, n in counts.items():
        h = counts["hindsight"] if config == "rft" and rft_hindsight else 0
        parts.append(f"{config} {n}" + (f" ({n - h} solved + {h} hindsight)" if h else ""))
    return ", ".join(parts)


def _export(s: dict) -> str:
    counts = {k: s[k] for k in ("pairs", "trajectory_pairs", "rft", "hindsight")}
    return f"{export_rows(counts, s.get('rft_hindsight', False))} -> {s['folder']}"


def _train(s: dict) -> str:
    return "; ".join(f"{p} {_trained(v)}" for p, v in s.items())


def _trained(v: dict) -> str:
    if "skipped" in v:
        return "skipped (" + v["skipped"].removeprefix("no training data: ") + ")"
    held = v.get(HELD_OUT) or {}
    acc = f", held-out acc {_pct(held['pair_accuracy'])} of {held['n']}" if held.get("n") else ""
    return f"{_n(v['step'], 'step')} on {v['items']} rows, loss {v['loss']:.3g}{acc}{_chosen(v)}"


def _chosen(v: dict) -> str:
    """The checkpoint train.select / grpo.select: val took and its validation score, so runs
    that differ in one setting compare from `status` alone."""
    sel = v.get("selected")
    if not sel:
        return ""
    best = next(c for c in sel["candidates"] if c["step"] == sel["step"])
    return (f", val {_pct(best['success_rate'])} of {best['n_tasks']} at step {sel['step']} "
            f"of {sel['last_step']}")


def _grpo(s: dict) -> str:
    reward = s.get("reward_mean")
    return (_n(s["step"], "step") + (f", reward {reward:.3f}" if reward is not None else "")
            + _chosen(s))


def _eval(s: dict) -> str:
    n = max(v["n_tasks"] for v in s.values())
    return (f"success on {n} test tasks: "
            + ", ".join(f"{p} {_pct(v['success_rate'])}" for p, v in s.items()))


def _mcts(s: dict) -> str:
    rows = {k: v for k, v in s.items() if isinstance(v, dict)}
    n = max(v["n_tasks"] for v in rows.values())
    return (f"search at inference on {n} test tasks ({s['critic']} critic): "
            + ", ".join(f"{p} {_pct(v['success_rate'])}" for p, v in rows.items()))


def _report(s: dict) -> str:
    return f"{s['policies']} policies -> {s['html']}"


def _scalars(s: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in s.items() if isinstance(v, (int, float, str)))[:160]


_BY_STAGE = {"tasks": _tasks, "baseline": _baseline, "search": _search, "critic": _critic,
             "mine": _mine, "export": _export, "train": _train, "grpo": _grpo, "eval": _eval,
             "mcts": _mcts, "report": _report}
