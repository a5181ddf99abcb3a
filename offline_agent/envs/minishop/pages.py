"""Pages as compact text. Every observation token costs prefill time on a 2-core CPU, so
pages carry only what a shopper needs to act, and each ends with the actions it allows.
They never mention the goal, so the same actions give the same pages under any task
(which is what lets hindsight relabel a trajectory without replaying it).
"""

from __future__ import annotations

from offline_agent.envs.minishop.catalog import Product

RESULTS_PER_PAGE = 5
QUERY_ECHO_CHARS = 60


def search_page() -> str:
    return "Search page.\nAction format: search[words]\nAction:"


def results_page(query: str, products: list[Product], page: int, n_pages: int) -> str:
    echo = query if len(query) <= QUERY_ECHO_CHARS else query[: QUERY_ECHO_CHARS - 3] + "..."
    if not products:
        return f'No results for "{echo}".\nAvailable actions: search[other words], click[back]'
    lines = [f'Results for "{echo}" (page {page} of {n_pages}):']
    lines += [f"{p.id} {p.title} ${p.price:.2f}" for p in products]
    moves = [m for m, ok in (("click[next]", page < n_pages), ("click[prev]", page > 1)) if ok]
    first = f"click[{products[0].id}] or another id"
    lines.append("Available actions: " + ", ".join([first, *moves, "click[back]", "search[words]"]))
    return "\n".join(lines)


def item_page(product: Product, selected: dict[str, str]) -> str:
    lines = [f"{product.id} {product.title}", f"Price: ${product.price:.2f}"]
    lines.append("Attributes: " + ", ".join(product.attributes))
    lines += [f"{group}: {', '.join(values)}" for group, values in product.options]
    chosen = ", ".join(f"{g} {v}" for g, v in selected.items()) or "none"
    lines.append(f"Selected: {chosen}")
    first = f"click[{product.options[0][1][0]}] or another option, " if product.options else ""
    lines.append(f"Available actions: {first}buy, click[back], search[words]")
    return "\n".join(lines)


def bought_page(product: Product, selected: dict[str, str]) -> str:
    chosen = ", ".join(f"{g} {v}" for g, v in selected.items()) or "no options"
    return f"You bought {product.id} {product.title} (${product.price:.2f}) with {chosen}. Done."
