"""Why a round mined no step pairs, and which setting to change: a run that trains dpo_step
on nothing should say so where the numbers are, not leave the user to read the trees."""

from __future__ import annotations

from offline_agent.mining.config import MineConfig

NO_STEP_PAIRS = "no_step_pairs"  # the mine stage's stats key of `no_step_pairs_why`'s sentence


def no_step_pairs_why(gaps: dict, cfg: MineConfig) -> str:
    """One sentence from `storage.sibling_gaps`' figures (expanded, compared, best_gap): the
    first condition of a step pair that no node met, and what to change."""
    if not gaps["expanded"]:
        return ("the search expanded no node, no tree has a child: raise search.simulations "
                "and check that search.max_depth >= 1")
    if not gaps["compared"]:
        return (f"none of the {gaps['expanded']} expanded nodes has two children that count, "
                f"a child counts when it ends the episode or has mine.min_visits="
                f"{cfg.min_visits} visits: raise search.simulations so that more children are "
                "visited, or lower mine.min_visits (0 counts unvisited children)")
    if gaps["best_gap"] is None:
        return (f"at each of the {gaps['compared']} nodes with two counted children every "
                "child is an invalid action, and an invalid action is never chosen: make the "
                "policy's replies valid with a demonstration or model.constrain=tools")
    if cfg.theta > 1:
        return (f"mine.theta={cfg.theta} is above 1, more than two values in [0, 1] can "
                "differ: lower it (the default is 0.1)")
    return (f"the largest value gap between two sibling actions is {gaps['best_gap']:.3g}, "
            f"below mine.theta={cfg.theta}, so siblings scored alike (every branch solved the "
            "task, or none did): lower mine.theta, or search harder tasks with more "
            "candidates (search.k, search.simulations) so that some branches fail")


# a kind of mined row -> why a round has none of it (the export's left-out configs and the
# train stage's skipped policies say it)
NO_ROWS = {
    "step": "no step pairs were mined",
    "trajectory": "no trajectory pairs were mined, as no train task has both a solved and a "
                  "failed episode",
    "rft": "no episode solved a train task",
    "hindsight": "no failed episode was relabeled: the env's achieved_task() named no task, "
                 "or mine.hindsight is false",
}
