"""What changed, shown on episodes: for each trained policy, a few test tasks it solved where
base failed, and a few base solved where it failed, each with both episodes as transcripts
(action, observation, reward per step). Pure over stored rows; report.py calls it.

Tasks are taken in task order (the first PER_SIDE of each side), so a re-rendered report
shows the same ones; the counts say how many there were in all.
"""

from __future__ import annotations

from collections.abc import Sequence

from offline_agent.evaluation import BASE, MODE
from storage import EvalEpisodeRow

PER_SIDE = 3  # episodes shown per policy and side
OBSERVATION_CHARS = 1500  # an observation is cut to this many characters (pages are long)


def transcript(row: EvalEpisodeRow) -> dict:
    """One episode as the report shows it: each step's action, observation, reward and
    whether it was invalid; the episode's reward and success."""
    steps = [{"action": s["action"], "observation": _cut(s["observation"]),
              "reward": s.get("reward", 0.0), "invalid": bool(s.get("invalid"))}
             for s in row.steps]
    return {"reward": row.reward, "success": row.success, "steps": steps}


def _cut(text: str) -> str:
    if len(text) <= OBSERVATION_CHARS:
        return text
    return text[:OBSERVATION_CHARS] + f" [... {len(text) - OBSERVATION_CHARS} more characters]"


def transcripts(rows: Sequence[EvalEpisodeRow], instructions: dict[str, str]) -> dict[str, dict]:
    """{policy: {"wins": [...], "losses": [...], "n_wins", "n_losses"}} for every greedy
    policy but base, over the tasks both played; wins: the policy solved it and base did
    not; each shown task holds its instruction and both episodes."""
    runs: dict[str, dict[str, EvalEpisodeRow]] = {}
    for row in rows:
        if row.mode == MODE:
            runs.setdefault(row.policy, {})[row.task_id] = row
    base = runs.pop(BASE, {})
    out = {}
    for policy, mine in runs.items():
        common = sorted(mine.keys() & base.keys())
        sides = {"wins": [t for t in common if mine[t].success and not base[t].success],
                 "losses": [t for t in common if base[t].success and not mine[t].success]}
        out[policy] = {f"n_{side}": len(tasks) for side, tasks in sides.items()}
        for side, tasks in sides.items():
            out[policy][side] = [{"task_id": t, "instruction": instructions.get(t, ""),
                                  "policy": transcript(mine[t]), "base": transcript(base[t])}
                                 for t in tasks[:PER_SIDE]]
    return out
