"""Goals and instructions: what the shopper wants, generated from a target product.

As in WebShop, a goal names a product type, a few of the target's attributes, one value per
chosen option group and a price bound; any product meeting all of them earns reward 1, so
the target is one of possibly several right answers. The difficulty level sets how much
the instruction asks for, which is what makes a random or careless purchase fall short.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from offline_agent.envs.minishop.catalog import OPTION_PHRASES, Product


@dataclass(frozen=True)
class Difficulty:
    attributes: int  # attributes named in the instruction (each one a product must have)
    option_rate: float  # chance that each of the target's option groups is named (must be clicked)
    price_slack: float  # budget = next $10 >= price * (1 + slack); less slack, more over budget


# Ordered by what small models find hard (figures: docs/environments.md#minishop): naming an
# option is the steepest step (they rarely select one), a tight budget the next; more
# attributes make the search query more specific, which helps rather than hurts.
LEVELS = {
    1: Difficulty(attributes=1, option_rate=0.0, price_slack=1.0),
    2: Difficulty(attributes=1, option_rate=0.0, price_slack=0.0),
    3: Difficulty(attributes=2, option_rate=0.3, price_slack=0.25),
    4: Difficulty(attributes=2, option_rate=0.6, price_slack=0.1),
    5: Difficulty(attributes=3, option_rate=1.0, price_slack=0.0),
}
LEVEL_NAMES = {"easy": 1, "medium": 3, "hard": 5}


def resolve_difficulty(difficulty: str | int) -> Difficulty:
    level = LEVEL_NAMES.get(difficulty, difficulty) if isinstance(difficulty, str) else difficulty
    if level not in LEVELS:
        raise ValueError(
            f"difficulty must be one of {sorted(LEVELS)} or {sorted(LEVEL_NAMES)}, "
            f"got {difficulty!r}"
        )
    return LEVELS[level]


@dataclass(frozen=True)
class Goal:
    target: str  # the product the goal was drawn from (one of possibly several answers)
    category: str
    type: str
    attributes: tuple[str, ...]
    options: dict[str, str] = field(default_factory=dict)  # group -> wanted value
    price_upper: float = 0.0

    def to_data(self) -> dict:
        """JSON-friendly form stored in Task.data."""
        return {
            "target": self.target,
            "category": self.category,
            "type": self.type,
            "attributes": list(self.attributes),
            "options": dict(self.options),
            "price_upper": self.price_upper,
        }

    @classmethod
    def from_data(cls, data: dict) -> Goal:
        return cls(
            target=data["target"],
            category=data["category"],
            type=data["type"],
            attributes=tuple(data["attributes"]),
            options=dict(data["options"]),
            price_upper=float(data["price_upper"]),
        )


def budget(price: float, slack: float) -> float:
    """Round dollars, as WebShop's price bounds are: the next multiple of 10 >= price·(1+slack)."""
    return float(math.ceil(price * (1 + slack) / 10) * 10)


def draw_goal(product: Product, level: Difficulty, rng: random.Random) -> Goal:
    """A goal the product satisfies: some of its attributes, one value per some option groups."""
    attributes = rng.sample(product.attributes, min(level.attributes, len(product.attributes)))
    named = [(g, values) for g, values in product.options if rng.random() < level.option_rate]
    return Goal(
        target=product.id,
        category=product.category,
        type=product.type,
        attributes=tuple(a for a in product.attributes if a in attributes),
        options={g: rng.choice(values) for g, values in named},
        price_upper=budget(product.price, level.price_slack),
    )


def achieved_goal(product: Product, selected: dict[str, str], n_attributes: int) -> Goal:
    """Hindsight: the goal that buying `product` with `selected` options fully satisfies."""
    rng = random.Random(f"minishop-achieved-{product.id}")
    attributes = rng.sample(product.attributes, min(n_attributes, len(product.attributes)))
    return Goal(
        target=product.id,
        category=product.category,
        type=product.type,
        attributes=tuple(a for a in product.attributes if a in attributes),
        options=dict(selected),
        price_upper=budget(product.price, 0.0),
    )


OPENERS = ("i need", "i am looking for", "i want", "find me")
PRICE_PHRASES = ("under {} dollars", "and price lower than {} dollars")


def instruction(goal: Goal, rng: random.Random) -> str:
    """Render a goal as a WebShop-style lowercase instruction, wording drawn from `rng`."""
    words = " ".join((*goal.attributes, goal.type))
    article = "" if goal.type.endswith("s") else ("an " if words[0] in "aeiou" else "a ")
    wants = " and ".join(OPTION_PHRASES[g].format(v) for g, v in goal.options.items())
    price = rng.choice(PRICE_PHRASES).format(int(goal.price_upper))
    return f"{rng.choice(OPENERS)} {article}{words}{' ' + wants if wants else ''}, {price}"
