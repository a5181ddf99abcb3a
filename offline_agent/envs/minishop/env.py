"""MiniShop: the WebShop-style Env. Search, open a product, pick options, buy.

The catalogue and search index are shared per process (see catalog.py, index.py); an
episode's state is only which page is open, so snapshots are a few hundred bytes.
Pages never mention the goal, and the reward is computed from `task.data` at `buy`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.envs.minishop import pages
from offline_agent.envs.minishop.catalog import Product, build_catalog
from offline_agent.envs.minishop.goals import (
    Goal,
    achieved_goal,
    draw_goal,
    instruction,
    resolve_difficulty,
)
from offline_agent.envs.minishop.index import catalog_index, search_ids
from offline_agent.envs.minishop.reward import reward
from offline_agent.types import Task, ToolCall

DEFAULT_DIFFICULTY = 3

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the store; shows a page of matching products.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "words to search"}},
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "click",
            "description": (
                "Click a product id on a results page, an option value (e.g. a color or size) "
                "on a product page, or back / next / prev."
            ),
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string", "description": "what to click"}},
                "required": ["target"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "buy",
            "description": "Buy the open product with the selected options; ends the episode.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]

SYSTEM_PROMPT = """\
You shop in an online store for the item the user asks for. Write exactly one action per reply:
search[words] - search the store
click[id] - open a product from the results, e.g. click[P0042]
click[value] - on a product page, select an option such as a color or size
click[back], click[next] - go back, or to the next results page
buy - buy the open product with the selected options (ends the task)

Example:
User: i want a gray wool scarf, under 30 dollars
You: search[gray wool scarf]
Store: P0042 Ridge Classic Wool Scarf $24.99
P0913 Acme Vintage Cotton Scarf $31.99
You: click[P0042]
Store: P0042 Ridge Classic Wool Scarf, $24.99
color: gray, red
You: click[gray]
Store: Selected: color gray
You: buy"""


@dataclass(frozen=True)
class ShopState:
    """Which page is open. Everything else (catalogue, search results) is derived from it."""

    page: str = "search"  # search | results | item | done
    query: str = ""
    results_page: int = 1
    item: str = ""  # product id on the item and done pages
    selected: tuple[tuple[str, str], ...] = ()  # (option group, value), in the product's order


class MiniShop(Env):
    name = "minishop"
    tools = TOOLS
    ending_tools = ("buy",)  # verifier-free search never runs it (Env.ending_tools)
    stop = ["\n"]  # the model likes to write a fake "Store: ..." line after its action
    state_type = ShopState  # snapshots rebuild it from JSON (tuples stay tuples)

    def __init__(
        self,
        max_steps: int = 10,
        seed: int = 0,
        num_products: int = 2000,
        difficulty: str | int = DEFAULT_DIFFICULTY,
    ):
        super().__init__(max_steps=max_steps, seed=seed)
        self.num_products = num_products
        self.difficulty = resolve_difficulty(difficulty)
        self.catalog = build_catalog(seed, num_products)
        catalog_index(seed, num_products)  # build now, not on the first search
        self.state = ShopState()

    # ---- tasks ------------------------------------------------------------------------------
    def tasks(self, split: str, n: int) -> list[Task]:
        """Targets cycle through a seeded shuffle of the split's products (no repeats until
        the split is used up); train and test targets are disjoint."""
        ids = self.catalog.split_ids(split)
        random.Random(f"minishop-tasks-{self.seed}-{split}").shuffle(ids)
        out = []
        for i in range(n):
            rng = random.Random(f"minishop-task-{self.seed}-{split}-{i}")
            goal = draw_goal(self.catalog.by_id[ids[i % len(ids)]], self.difficulty, rng)
            out.append(self._task(f"minishop-{split}-{i:05d}", split, goal, rng))
        return out

    def _task(self, task_id: str, split: str, goal: Goal, rng: random.Random) -> Task:
        return Task(task_id, self.name, instruction(goal, rng), split, goal.to_data())

    def system_prompt(self) -> str:
        return SYSTEM_PROMPT

    def demo_episode(self) -> tuple[Task, list[str]]:
        """One scripted easy episode (search the goal's words, open the target, buy).
        Without it a 135M model repeats its first action and never buys; a demo that also
        clicks options did worse, so the demo buys a goal that names none (figures:
        docs/environments.md#minishop)."""
        shop = MiniShop(seed=self.seed, num_products=self.num_products, difficulty=1)
        for task in shop.tasks("train", 50):
            goal = Goal.from_data(task.data)
            actions = [f"search[{' '.join((*goal.attributes, goal.type))}]",
                       f"click[{goal.target}]", "buy"]
            shop.reset(task)
            if [shop.act(text)[1].reward for text in actions][-1] == 1.0:
                return task, actions
        raise RuntimeError("no scripted MiniShop demo episode succeeded")

    # ---- episode ----------------------------------------------------------------------------
    def _reset(self, task: Task) -> str:
        self.state = ShopState()
        return pages.search_page()

    def _execute(self, call: ToolCall) -> StepResult:
        if self.state.page == "done":
            raise ActionError("the episode is over: the product was bought")
        if call.name == "search":
            return self._search(call.arguments["query"])
        if call.name == "click":
            return self._click(call.arguments["target"])
        return self._buy()

    def _search(self, query: str) -> StepResult:
        query = " ".join(query.split())
        if not query:
            raise ActionError("search needs some words, e.g. search[red cotton t-shirt]")
        self.state = ShopState(page="results", query=query)
        return StepResult(self._results())

    def _click(self, target: str) -> StepResult:
        key = target.strip().strip("\"'[]<> ").lower()
        if self.state.page == "search":
            raise ActionError("nothing to click on the search page; use search[words]")
        if self.state.page == "results":
            return StepResult(self._click_results(key, target))
        return StepResult(self._click_item(key, target))

    def _click_results(self, key: str, target: str) -> str:
        s = self.state
        if key == "back":
            self.state = ShopState()
            return pages.search_page()
        if key in ("next", "prev"):
            step = 1 if key == "next" else -1
            if not 1 <= s.results_page + step <= self._n_pages():
                raise ActionError(f"there is no {key} page")
            self.state = replace(s, results_page=s.results_page + step)
            return self._results()
        ids = [p.id for p in self._shown()]
        if key.upper() not in ids:
            listed = ", ".join(ids) or "none"
            raise ActionError(
                f"{target!r} is not a product on this page (shown: {listed}); "
                "click one of those ids, or next / prev / back"
            )
        self.state = replace(s, page="item", item=key.upper(), selected=())
        return pages.item_page(self.catalog.by_id[key.upper()], {})

    def _click_item(self, key: str, target: str) -> str:
        product = self.catalog.by_id[self.state.item]
        if key == "back":
            self.state = replace(self.state, page="results", item="", selected=())
            return self._results()
        group = product.option_group(key)
        if group is None:
            values = ", ".join(v for _, vs in product.options for v in vs)
            raise ActionError(
                f"{target!r} is not an option of {product.id} (options: {values}); "
                "to purchase use buy, to leave use click[back]"
            )
        selected = dict(self.state.selected) | {group: key}
        ordered = tuple((g, selected[g]) for g, _ in product.options if g in selected)
        self.state = replace(self.state, selected=ordered)
        return pages.item_page(product, dict(ordered))

    def _buy(self) -> StepResult:
        if self.state.page != "item":
            raise ActionError("buy works only on a product page; open one with click[id] first")
        product = self.catalog.by_id[self.state.item]
        selected = dict(self.state.selected)
        self.state = replace(self.state, page="done")
        value, parts = reward(Goal.from_data(self.task.data), product, selected)
        info = {"bought": product.id, "selected": selected, "reward_parts": parts}
        return StepResult(pages.bought_page(product, selected), value, True, info=info)

    def available_actions(self) -> list[str]:
        """Every click the open page allows and buy; [] on the search page (free text)."""
        s = self.state
        if s.page == "results":
            moves = [m for m, ok in (("next", s.results_page < self._n_pages()),
                                     ("prev", s.results_page > 1)) if ok]
            return [f"click[{x}]" for x in ([p.id for p in self._shown()] + moves + ["back"])]
        if s.page == "item":
            product = self.catalog.by_id[s.item]
            return [f"click[{v}]" for _, vs in product.options for v in vs] + ["buy", "click[back]"]
        return []

    def action_tools(self) -> list[dict]:
        """Search on every page; click only what the open page lists (`available_actions`);
        buy only on a product page."""
        listed = self.available_actions()
        targets = [a[len("click["):-1] for a in listed if a.startswith("click[")]
        tools = [TOOLS[0]]
        if targets:
            click = TOOLS[1]["function"]
            target = {**click["parameters"]["properties"]["target"], "enum": targets}
            params = {**click["parameters"], "properties": {"target": target}}
            tools.append({"type": "function", "function": {**click, "parameters": params}})
        if "buy" in listed:
            tools.append(TOOLS[2])
        return tools

    # ---- hindsight --------------------------------------------------------------------------
    def achieved_task(self) -> Task | None:
        """After a buy: the task whose goal is the bought product with the options chosen,
        naming as many of its attributes as the original goal did."""
        if self.state.page != "done":
            return None
        product = self.catalog.by_id[self.state.item]
        wanted = len(self.task.data["attributes"])
        goal = achieved_goal(product, dict(self.state.selected), wanted)
        rng = random.Random(f"minishop-achieved-{product.id}-{self.state.selected}")
        return self._task(f"{self.task.id}-achieved-{product.id}", self.task.split, goal, rng)

    # ---- derived views ----------------------------------------------------------------------
    def _hits(self) -> tuple[str, ...]:
        return search_ids(self.seed, self.num_products, self.state.query)

    def _n_pages(self) -> int:
        return math.ceil(len(self._hits()) / pages.RESULTS_PER_PAGE)

    def _shown(self) -> list[Product]:
        start = (self.state.results_page - 1) * pages.RESULTS_PER_PAGE
        return [self.catalog.by_id[i] for i in self._hits()[start : start + pages.RESULTS_PER_PAGE]]

    def _results(self) -> str:
        s = self.state
        return pages.results_page(s.query, self._shown(), s.results_page, self._n_pages())
