"""The run's health check: the known ways an agent RL run goes wrong, each as one line with its
figure, a threshold and a mark (ok true: green, false: red, None: nothing to judge yet), for
the report's Diagnostics section and report.json's `diagnostics`.

Pure over what the store holds (`diagnose` reads it through Store methods): the test
episodes of every evaluated policy, the GRPO stage's per-step metrics and the train stages'
final records. A line over several policies shows the worst one and lists them all, so one
collapsed policy is not averaged away. Thresholds are rules of thumb, named below with
why; a red mark says "look here", not "the run is wrong".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from offline_agent.evaluation import TEST
from offline_agent.training.grpo.config import GRPOConfig
from pipelines.artifacts import trained_policies
from storage import EvalEpisodeRow, Store

MAX_REWARD_ZERO = 0.5  # over half the episodes earn nothing: the policy rarely gets anywhere
MAX_STEP_LIMIT = 0.2  # episodes cut by env max_steps: the agent does not finish
LOOP_RUN = 4  # the same action this many times in a row is a loop
MAX_LOOPS = 0.1  # share of episodes with a loop
MAX_UNKNOWN_TOOL = 0.05  # share of steps calling a tool the env does not have
MAX_FORMAT = 0.1  # share of steps with no parseable tool call
MAX_INVALID = 0.2  # share of steps the env refused
MAX_TIED_GROUPS = 0.5  # GRPO groups whose rewards all tie carry no gradient
MAX_KL = 0.5  # GRPO's last KL to the reference: the policy drifted far
MIN_ENTROPY_RATIO = 0.5  # GRPO's entropy, last steps over first: below, entropy collapsed
MAX_CLIP = 0.2  # GRPO's mean clip fraction: updates too large for the trust region
MAX_TOOL_SHARE = 0.8  # one tool takes this share of a policy's calls: over-reliance
MIN_CALLS = 10  # fewer valid calls than this: no tool distribution to judge
TREND_STEPS = 3  # GRPO steps averaged at each end of a trend
UNKNOWN_TOOL = "Invalid action: unknown tool"  # Env.act / validate_call's observation


def line(check: str, label: str, figure: str, threshold: str, ok: bool | None,
         value: float | None = None, detail: str = "") -> dict:
    return {"check": check, "label": label, "figure": figure, "threshold": threshold,
            "ok": ok, "value": value, "detail": detail}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


# ---- per episode and per step --------------------------------------------------------------
def longest_run(actions: Sequence[str]) -> tuple[int, str]:
    """The longest run of one action repeated in a row (compared stripped), and the action."""
    best, run, prev = (0, ""), 0, None
    for a in (a.strip() for a in actions):
        run = run + 1 if a == prev else 1
        prev = a
        best = max(best, (run, a), key=lambda b: b[0])
    return best


def is_cut(row: EvalEpisodeRow) -> bool:
    """Ended by the env's step limit (Env._count marks the last step's info)."""
    return bool(row.steps) and bool((row.steps[-1].get("info") or {}).get("truncated"))


def is_unknown_tool(step: dict) -> bool:
    return step.get("invalid", False) and step.get("observation", "").startswith(UNKNOWN_TOOL)


def is_format_failure(step: dict) -> bool:
    """Invalid with no parsed call, and not a call of an unknown tool (that is its own line)."""
    return step.get("invalid", False) and not step.get("tool_call") and not is_unknown_tool(step)


def _rates(runs: dict[str, list[EvalEpisodeRow]], count: Callable[[EvalEpisodeRow], int],
           size: Callable[[EvalEpisodeRow], int]) -> dict[str, tuple[int, int]]:
    """{policy: (sum of count, sum of size)} over its episodes."""
    return {p: (sum(map(count, rows)), sum(map(size, rows))) for p, rows in runs.items()}


def _worst_line(check: str, label: str, rates: dict[str, tuple[int, int]], limit: float,
                unit: str) -> dict:
    """The policy with the highest rate decides the mark; all are listed."""
    judged = {p: (k, n) for p, (k, n) in rates.items() if n}
    threshold = f"<= {_pct(limit)} of {unit}"
    if not judged:
        return line(check, label, "no evaluation episodes yet", threshold, None)
    worst = max(judged, key=lambda p: judged[p][0] / judged[p][1])
    k, n = judged[worst]
    detail = ", ".join(f"{p} {_pct(a / b)} ({a}/{b})" for p, (a, b) in judged.items())
    return line(check, label, f"{_pct(k / n)} ({k} of {n} {unit}, {worst})", threshold,
                k / n <= limit, k / n, detail)


def _one(row: EvalEpisodeRow) -> int:
    return 1


def _steps(row: EvalEpisodeRow) -> int:
    return len(row.steps)


def _reward_zero(row: EvalEpisodeRow) -> int:
    return int(row.reward == 0)


def _loops(row: EvalEpisodeRow) -> int:
    return int(longest_run([s["action"] for s in row.steps])[0] >= LOOP_RUN)


def _unknown_tools(row: EvalEpisodeRow) -> int:
    return sum(map(is_unknown_tool, row.steps))


def _format_failures(row: EvalEpisodeRow) -> int:
    return sum(map(is_format_failure, row.steps))


def _invalid(row: EvalEpisodeRow) -> int:
    return sum(bool(s.get("invalid")) for s in row.steps)


# check, label, counted per episode, out of, threshold, unit
EPISODE_CHECKS = (
    ("reward_zero", "episodes ending with reward 0", _reward_zero, _one, MAX_REWARD_ZERO,
     "episodes"),
    ("step_limit", "episodes cut by the step limit", is_cut, _one, MAX_STEP_LIMIT, "episodes"),
    ("loops", f"episodes repeating one action {LOOP_RUN}+ times in a row", _loops, _one,
     MAX_LOOPS, "episodes"),
    ("unknown_tool", "calls to tools that do not exist", _unknown_tools, _steps,
     MAX_UNKNOWN_TOOL, "steps"),
    ("format", "format failures (no tool call could be parsed)", _format_failures, _steps,
     MAX_FORMAT, "steps"),
    ("invalid", "invalid-action rate", _invalid, _steps, MAX_INVALID, "steps"),
)


def episode_lines(runs: dict[str, list[EvalEpisodeRow]]) -> list[dict]:
    """EPISODE_CHECKS over each policy's test episodes."""
    return [_worst_line(check, label, _rates(runs, count, size), limit, unit)
            for check, label, count, size, limit, unit in EPISODE_CHECKS]


def tool_line(runs: dict[str, list[EvalEpisodeRow]]) -> dict:
    """Each policy's valid calls by tool; the largest single-tool share decides the mark."""
    label = "tool-call distribution (largest share of one tool)"
    threshold = f"<= {_pct(MAX_TOOL_SHARE)} of a policy's valid calls"
    counts = {p: Counter(s["tool_call"]["name"] for r in rows for s in r.steps
                         if s.get("tool_call") and not s.get("invalid"))
              for p, rows in runs.items()}
    detail = "; ".join(f"{p}: {_distribution(c)}" for p, c in counts.items() if c)
    share = {p: c.most_common(1)[0][1] / c.total() for p, c in counts.items()
             if c.total() >= MIN_CALLS}
    if not share:
        return line("tool_share", label, f"fewer than {MIN_CALLS} valid calls per policy",
                    threshold, None, detail=detail)
    worst = max(share, key=share.get)
    tool = counts[worst].most_common(1)[0][0]
    return line("tool_share", label, f"{_pct(share[worst])} {tool} ({worst})", threshold,
                share[worst] <= MAX_TOOL_SHARE, share[worst], detail)


def _distribution(calls: Counter) -> str:
    return ", ".join(f"{tool} {_pct(n / calls.total())}" for tool, n in calls.most_common())


# ---- GRPO ---------------------------------------------------------------------------------
def _ends(points: list[dict], key: str) -> tuple[float, float] | None:
    """Mean of `key` over the first and over the last TREND_STEPS steps that have it."""
    xs = [p[key] for p in points if p.get(key) is not None]
    if not xs:
        return None
    n = min(TREND_STEPS, len(xs))
    return sum(xs[:n]) / n, sum(xs[-n:]) / n


def grpo_lines(points: list[dict], tasks_per_step: int) -> list[dict]:
    """Zero-spread groups, KL trend, entropy trend (collapse), clip fraction; not judged
    (ok None) when the run has no GRPO steps."""
    checks = [("grpo_tied", "GRPO groups with zero reward spread",
               f"<= {_pct(MAX_TIED_GROUPS)} of groups"),
              ("grpo_kl", "GRPO KL to the reference (first -> last steps)", f"last <= {MAX_KL}"),
              ("grpo_entropy", "GRPO entropy (first -> last steps)",
               f"last >= {MIN_ENTROPY_RATIO:g} x first"),
              ("grpo_clip", "GRPO clip fraction (mean over steps)", f"<= {_pct(MAX_CLIP)}")]
    if not points:
        return [line(c, label, "no GRPO steps in this run", t, None) for c, label, t in checks]
    tied = sum(p.get("tied_groups", 0) for p in points) / (len(points) * tasks_per_step)
    kl, entropy = _ends(points, "kl"), _ends(points, "entropy")
    clips = [p["clip_fraction"] for p in points if p.get("clip_fraction") is not None]
    clip = sum(clips) / len(clips) if clips else None
    values = [
        (f"{_pct(tied)} of {len(points) * tasks_per_step} groups", tied <= MAX_TIED_GROUPS, tied),
        _trend(kl, lambda a, b: b <= MAX_KL),
        _trend(entropy, lambda a, b: b >= MIN_ENTROPY_RATIO * a),
        ("not recorded", None, None) if clip is None else (_pct(clip), clip <= MAX_CLIP, clip),
    ]
    return [line(c, label, fig, t, ok, v) for (c, label, t), (fig, ok, v) in zip(checks, values)]


def _trend(ends: tuple[float, float] | None, good: Callable[[float, float], bool]) -> tuple:
    if ends is None:
        return "not recorded", None, None
    first, last = ends
    return f"{first:.4g} -> {last:.4g}", good(first, last), last


# ---- training's mask ------------------------------------------------------------------------
def mask_line(finals: dict[str, dict]) -> dict:
    """Agent tokens over trained tokens of every policy the train stages finished
    (offline_agent/training/mask_check.py); must be 100%."""
    label, threshold = "mask check: trained tokens that are agent tokens", "= 100%"
    counted = {p: (f["agent_tokens"], f["trained_tokens"]) for p, f in finals.items()
               if f.get("trained_tokens")}
    if not counted:
        figure = ("not recorded (trained before this check)" if finals
                  else "no trained policy yet")
        return line("mask", label, figure, threshold, None)
    agent, trained = (sum(x) for x in zip(*counted.values()))
    detail = ", ".join(f"{p} {_pct(a / t)} ({a}/{t})" for p, (a, t) in counted.items())
    return line("mask", label, f"{_pct(agent / trained)} ({agent} of {trained} tokens)",
                threshold, agent == trained, agent / trained, detail)


# ---- from a store ----------------------------------------------------------------------------
def diagnose(store: Store) -> list[dict]:
    """Every line, from what `store` holds (test episodes only: validation ones left out)."""
    runs: dict[str, list[EvalEpisodeRow]] = {}
    for row in store.eval_episodes(split=TEST):
        name = row.policy + ("" if row.mode == "greedy" else f" +{row.mode}")
        runs.setdefault(name, []).append(row)
    runs_cfg = store.runs()
    grpo = (runs_cfg[-1]["config"].get("grpo", {}) if runs_cfg else {})
    tasks_per_step = grpo.get("tasks_per_step", GRPOConfig().tasks_per_step)
    points = [{"step": r.step, **r.data} for r in store.metrics("grpo")]
    return [*episode_lines(runs), tool_line(runs), *grpo_lines(points, tasks_per_step),
            mask_line(trained_policies(store))]
