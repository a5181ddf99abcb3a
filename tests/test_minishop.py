"""MiniShop: catalogue, search, pages, WebShop reward, snapshots, hindsight, malformed actions."""

from __future__ import annotations

import re

import pytest

from offline_agent.envs.base import load_env
from offline_agent.envs.minishop import MiniShop
from offline_agent.envs.minishop.catalog import CATEGORIES, build_catalog
from offline_agent.envs.minishop.goals import LEVELS, Goal, resolve_difficulty
from offline_agent.envs.minishop.index import build_index, search_ids
from offline_agent.envs.minishop.pages import RESULTS_PER_PAGE
from offline_agent.types import Task, ToolCall


def search(q):
    return ToolCall("search", {"query": q})


def click(t):
    return ToolCall("click", {"target": t})


BUY = ToolCall("buy", {})


def shown_ids(observation: str) -> list[str]:
    return re.findall(r"^(P\d{4}) ", observation, re.MULTILINE)


def open_product(env: MiniShop, query: str, pid: str) -> list[ToolCall]:
    """Search `query`, page forward until `pid` is listed, open it; returns the actions taken."""
    actions = [search(query)]
    obs = env.step(actions[-1]).observation
    while pid not in shown_ids(obs):
        assert "click[next]" in obs, f"{pid} not found for {query!r}"
        actions.append(click("next"))
        obs = env.step(actions[-1]).observation
    actions.append(click(pid))
    obs = env.step(actions[-1]).observation
    assert obs.startswith(pid)
    return actions


def oracle(env: MiniShop, task: Task) -> tuple[list[ToolCall], float]:
    """The scripted optimal trajectory: search the goal's words, open the target, pick options, buy."""
    env.reset(task)
    goal = Goal.from_data(task.data)
    actions = open_product(env, " ".join((*goal.attributes, goal.type)), goal.target)
    for value in goal.options.values():
        actions.append(click(value))
        assert not env.step(actions[-1]).invalid
    actions.append(BUY)
    result = env.step(BUY)
    assert result.done
    return actions, result.reward


def replay(env: MiniShop, task: Task, actions: list[ToolCall]) -> tuple[list[str], float]:
    observations = [env.reset(task)]
    result = None
    for a in actions:
        result = env.step(a)
        observations.append(result.observation)
    return observations, result.reward


def bought_with(env, task, pid, options=()) -> float:
    """Reward of buying product `pid` with `options` clicked, navigating there through search."""
    env.reset(task)
    product = env.catalog.by_id[pid]
    open_product(env, product.title, pid)
    for value in options:
        assert not env.step(click(value)).invalid
    result = env.step(BUY)
    assert result.done and not result.invalid
    return result.reward


# ---- catalogue, tasks, difficulty ---------------------------------------------------------------


def test_catalogue_is_deterministic_large_and_varied():
    fresh = build_catalog.__wrapped__(0, 2000)  # bypass the process cache
    build_index(fresh.products)
    assert fresh == build_catalog(0, 2000)
    assert fresh.products != build_catalog.__wrapped__(1, 2000).products
    assert len(fresh.products) == 2000 and len({p.id for p in fresh.products}) == 2000
    assert all(re.fullmatch(r"P\d{4}", p.id) for p in fresh.products)
    assert len({p.category for p in fresh.products}) == len(CATEGORIES) >= 10
    assert len({p.type for p in fresh.products}) >= 30
    for p in fresh.products:
        assert p.price > 0 and len(p.attributes) >= 3
        assert all(len(values) >= 2 for _, values in p.options)  # selecting must matter
        values = [v for _, vs in p.options for v in vs]
        assert len(values) == len(set(values))  # a clicked value names one group


def test_tasks_are_deterministic_with_disjoint_split_targets():
    env = MiniShop()
    train, test = env.tasks("train", 600), env.tasks("test", 300)
    assert train == MiniShop().tasks("train", 600)
    assert env.tasks("train", 5) == train[:5]  # a prefix does not depend on n
    assert train[42].id == "minishop-train-00042" and test[0].id == "minishop-test-00000"
    assert not {t.data["target"] for t in train} & {t.data["target"] for t in test}
    assert len({t.data["target"] for t in test}) == 300  # no repeats before the split runs out
    for t in train[:50] + test[:50]:
        goal = Goal.from_data(t.data)
        target = env.catalog.by_id[goal.target]
        assert goal.type in t.instruction and f"{int(goal.price_upper)} dollars" in t.instruction
        assert set(goal.attributes) <= set(target.attributes)
        assert all(v in dict(target.options)[g] for g, v in goal.options.items())
        assert target.price <= goal.price_upper
    with pytest.raises(ValueError):
        env.tasks("dev", 1)


def test_difficulty_levels_ask_for_more():
    def load(level):  # mean constraints named, mean relative budget headroom
        env = MiniShop(difficulty=level)
        goals = [Goal.from_data(t.data) for t in env.tasks("test", 200)]
        named = sum(len(g.attributes) + len(g.options) for g in goals) / len(goals)
        headroom = sum(g.price_upper / env.catalog.by_id[g.target].price for g in goals)
        return named, headroom / len(goals)

    stats = [load(level) for level in sorted(LEVELS)]
    assert [s[0] for s in stats] == sorted(s[0] for s in stats)
    assert stats[0][1] > stats[-1][1]
    assert resolve_difficulty("easy") == LEVELS[1] and resolve_difficulty("hard") == LEVELS[5]
    with pytest.raises(ValueError):
        MiniShop(difficulty=9)
    assert isinstance(load_env("minishop", difficulty="easy"), MiniShop)


# ---- reward -------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", [1, 3, 5])
def test_scripted_optimal_trajectory_earns_one(level):
    env = MiniShop(difficulty=level)
    for task in env.tasks("train", 6) + env.tasks("test", 6):
        actions, reward = oracle(env, task)
        assert reward == 1.0, (task.instruction, actions)


def _hard_task_and_products():
    """A level-5 task (3 attributes, every option named) plus hand-picked wrong products."""
    env = MiniShop(difficulty=5)
    for task in env.tasks("train", 200):
        goal = Goal.from_data(task.data)
        if len(goal.options) != 2:
            continue
        wanted = set(goal.attributes)
        same_type = [
            p
            for p in env.catalog.products
            if p.type == goal.type
            and len(wanted & set(p.attributes)) == 2
            and p.price > goal.price_upper
            and all(g in dict(p.options) for g in goal.options)
        ]
        for p in same_type:
            offered = dict(p.options)
            groups = list(goal.options)
            right, wrong = groups[0], groups[1]
            if goal.options[right] in offered[right] and any(
                v != goal.options[wrong] for v in offered[wrong]
            ):
                bad = next(v for v in offered[wrong] if v != goal.options[wrong])
                return env, task, goal, p, [goal.options[right], bad]
    raise AssertionError("no suitable task found")


def test_wrong_product_of_same_type_earns_webshop_partial_credit():
    env, task, goal, product, options = _hard_task_and_products()
    # r_type 1 * (2 of 3 attributes + 1 of 2 options + price over budget 0) / (3 + 2 + 1)
    assert bought_with(env, task, product.id, options) == pytest.approx(3 / 6)
    # Buying without selecting options: (2 + 0 + 0) / 6
    assert bought_with(env, task, product.id) == pytest.approx(2 / 6)


def test_other_types_earn_the_low_type_score():
    env, task, goal, _, _ = _hard_task_and_products()
    wanted = set(goal.attributes)

    def pick(same_category):
        return next(
            p
            for p in env.catalog.products
            if p.type != goal.type
            and (p.category == goal.category) == same_category
            and not wanted & set(p.attributes)
            and p.price <= goal.price_upper
        )

    # only the price matches: r_type * (0 + 0 + 1) / 6
    assert bought_with(env, task, pick(True).id) == pytest.approx(0.5 * 1 / 6)
    assert bought_with(env, task, pick(False).id) == pytest.approx(0.1 * 1 / 6)


# ---- pages, snapshots, determinism --------------------------------------------------------------


def test_pages_are_compact_and_list_their_actions():
    env = MiniShop()
    task = env.tasks("test", 1)[0]
    assert "search[" in env.reset(task)
    obs = env.step(search("cotton t-shirt")).observation
    ids = shown_ids(obs)
    assert len(ids) == RESULTS_PER_PAGE and "Available actions" in obs and "click[next]" in obs
    assert "click[prev]" not in obs
    assert len(obs.splitlines()) <= RESULTS_PER_PAGE + 2
    obs = env.step(click(ids[0])).observation
    product = env.catalog.by_id[ids[0]]
    assert product.title in obs and f"${product.price:.2f}" in obs and "buy" in obs
    for group, values in product.options:
        assert f"{group}: {', '.join(values)}" in obs
    (g1, v1), (g2, v2) = [(g, vs[-1]) for g, vs in product.options]
    env.step(click(v2))
    obs = env.step(click(v1.upper())).observation  # clicks are case-insensitive
    assert f"Selected: {g1} {v1}, {g2} {v2}" in obs  # in the page's order, not the click order
    assert task.instruction not in obs  # pages never depend on the goal (hindsight relies on it)


def test_available_actions_are_every_click_of_the_page_and_all_valid():
    env = MiniShop()
    env.reset(env.tasks("test", 1)[0])
    assert env.available_actions() == []  # the search page takes free text
    obs = env.step(search("cotton t-shirt")).observation
    listed = env.available_actions()
    assert listed == [f"click[{i}]" for i in shown_ids(obs)] + ["click[next]", "click[back]"]
    env.step(click("next"))
    assert {"click[next]", "click[prev]", "click[back]"} <= set(env.available_actions())
    pid = shown_ids(env.step(click("prev")).observation)[0]
    env.step(click(pid))
    product = env.catalog.by_id[pid]
    values = [f"click[{v}]" for _, vs in product.options for v in vs]
    assert env.available_actions() == values + ["buy", "click[back]"]
    item_page = env.snapshot()
    for text in env.available_actions():
        env.restore(item_page)
        call, result = env.act(text)
        assert call is not None and not result.invalid, (text, result.observation)
    env.restore(item_page)
    env.step(BUY)
    assert env.available_actions() == []  # bought: nothing left to do


def test_same_actions_give_same_observations_and_reward():
    env_a, env_b = MiniShop(), MiniShop()
    task = env_a.tasks("test", 3)[2]
    actions, _ = oracle(env_a, task)
    assert replay(env_a, task, actions) == replay(env_b, task, actions)


def test_snapshot_restore_reproduces_a_branch():
    env = MiniShop()
    task = env.tasks("train", 1)[0]
    env.reset(task)
    first = env.step(search(task.instruction)).observation
    blob = env.snapshot()
    assert len(blob) < 1000  # the catalogue and results are not in the state

    def branch():
        pid = shown_ids(first)[1]
        out = [env.step(click(pid)).observation]
        value = env.catalog.by_id[pid].options[0][1][-1]
        out.append(env.step(click(value)).observation)
        result = env.step(BUY)
        return out + [result.observation], result.reward, env.num_steps

    a = branch()
    env.restore(blob)
    assert env.step(click("next")).observation != first  # another branch meanwhile
    env.restore(blob)
    assert branch() == a


# ---- hindsight ----------------------------------------------------------------------------------


def test_hindsight_task_rewards_the_same_trajectory_with_one():
    env = MiniShop(difficulty=4)
    rewards = []
    for task in env.tasks("train", 8):
        env.reset(task)
        assert env.achieved_task() is None
        actions = [search(task.data["type"])]
        obs = env.step(actions[0]).observation
        pid = next(i for i in shown_ids(obs) if i != task.data["target"])
        actions.append(click(pid))
        env.step(actions[-1])
        product = env.catalog.by_id[pid]
        actions.append(click(product.options[-1][1][-1]))
        env.step(actions[-1])
        assert env.achieved_task() is None  # nothing bought yet
        actions.append(BUY)
        original = env.step(BUY).reward
        achieved = env.achieved_task()
        assert achieved is not None and achieved.id.startswith(task.id)
        goal = Goal.from_data(achieved.data)
        assert goal.target == pid and goal.price_upper >= product.price
        assert (
            product.options[-1][1][-1] in achieved.instruction
            and product.type in achieved.instruction
        )
        assert replay(MiniShop(difficulty=4), achieved, actions)[1] == 1.0
        rewards.append(original)
    assert min(rewards) < 1.0  # relabeling turned real failures into successes


# ---- malformed actions, step limit --------------------------------------------------------------


def test_malformed_actions_never_raise_and_are_flagged():
    env = MiniShop(max_steps=30)
    task = env.tasks("test", 1)[0]
    env.reset(task)

    def all_invalid(calls):
        for call in calls:
            result = env.step(call)
            assert result.invalid and result.observation.startswith("Invalid action"), call
            assert not result.done

    all_invalid([BUY, click("P0001"), search(""), search("   "), search("x" * 5000)])
    obs = env.step(search("cotton t-shirt")).observation
    all_invalid([BUY, click("P9999"), click("prev"), click("red"), ToolCall("checkout", {})])
    long_query = env.step(search("zz " * 600))  # long but allowed: an empty results page
    assert not long_query.invalid and "No results" in long_query.observation
    env.step(search("cotton t-shirt"))
    env.step(click(shown_ids(obs)[0]))
    all_invalid([click("P9999"), click("chartreuse"), click("next"), search("a b c " * 400)])
    for text in ["hello there", "click[]", "{bad json", "search[", "click[" + "z" * 3000 + "]"]:
        _, result = env.act(text)
        assert result.invalid and not result.done, text
    _, result = env.act("click[back]")  # still on the item page: back to the results
    assert not result.invalid and shown_ids(result.observation) == shown_ids(obs)
    assert env.num_steps == 24  # every action counted, valid or not


def test_acting_after_the_purchase_is_invalid():
    env = MiniShop(difficulty=1)
    task = env.tasks("test", 1)[0]
    oracle(env, task)
    for call in [BUY, click("back"), search("more")]:
        assert env.step(call).invalid


def test_max_steps_ends_the_episode_with_zero_reward():
    env = MiniShop(max_steps=3)
    task = env.tasks("test", 1)[0]
    env.reset(task)
    goal = Goal.from_data(task.data)
    results = [env.step(search(goal.type)), env.step(click("next")), env.step(click("back"))]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == 0.0 and results[-1].info["truncated"]


# ---- search -------------------------------------------------------------------------------------


def test_search_finds_the_target_for_its_own_instruction():
    env = MiniShop()
    tasks = env.tasks("test", 200)
    top10 = sum(t.data["target"] in search_ids(0, 2000, t.instruction)[:10] for t in tasks)
    satisfied = 0  # a product that can earn reward 1 is on the first page
    from offline_agent.envs.minishop.reward import reward

    for t in tasks:
        goal = Goal.from_data(t.data)
        first_page = search_ids(0, 2000, t.instruction)[:RESULTS_PER_PAGE]
        satisfied += any(
            reward(goal, env.catalog.by_id[i], goal.options)[0] == 1.0 for i in first_page
        )
    assert top10 / len(tasks) >= 0.8
    assert satisfied / len(tasks) >= 0.9
    assert search_ids(0, 2000, "qwertyuiop") == ()


def test_system_prompt_is_short(tokenizer):
    prompt = MiniShop().system_prompt()
    assert len(tokenizer(prompt)["input_ids"]) < 250
    for form in ("search[", "click[", "buy"):
        assert form in prompt
