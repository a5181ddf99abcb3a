"""WebShop's reward (Yao et al. 2022, eq. in §3.2 and web_agent_site/engine/goal.py).

    r = r_type * (|U_att ∩ Y_att| + |U_opt ∩ Y_opt| + 1[price <= budget]) / (|U_att| + |U_opt| + 1)

WebShop's r_type is 1 when the bought product matches the goal's query, category path or
title nouns, and falls to 0.5 / 0.1 / 0 as the titles share fewer nouns. Our products carry
their type and category explicitly, so the same ladder reads: same type 1.0, another type
of the same category 0.5 (a related product, e.g. a hoodie for a t-shirt), any other
category 0.1. Unlike WebShop we keep 0.1 rather than 0 for unrelated products, so a wrong
purchase still ranks by how many of the other constraints it meets. Attributes and options
match exactly (WebShop fuzzy-matches free text; ours is canonical).
"""

from __future__ import annotations

from offline_agent.envs.minishop.catalog import Product
from offline_agent.envs.minishop.goals import Goal

SAME_TYPE, SAME_CATEGORY, OTHER = 1.0, 0.5, 0.1


def type_score(goal: Goal, product: Product) -> float:
    if product.type == goal.type:
        return SAME_TYPE
    return SAME_CATEGORY if product.category == goal.category else OTHER


def reward(goal: Goal, product: Product, selected: dict[str, str]) -> tuple[float, dict]:
    """The reward of buying `product` with `selected` options, and its parts (for info/logs)."""
    attributes = sum(a in product.attributes for a in goal.attributes)
    options = sum(selected.get(g) == v for g, v in goal.options.items())
    price_ok = product.price <= goal.price_upper
    r_type = type_score(goal, product)
    total = len(goal.attributes) + len(goal.options) + 1
    value = r_type * (attributes + options + price_ok) / total
    parts = {
        "r_type": r_type,
        "attributes": f"{attributes}/{len(goal.attributes)}",
        "options": f"{options}/{len(goal.options)}",
        "price_ok": price_ok,
    }
    return value, parts
