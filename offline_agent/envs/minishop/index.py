"""BM25 over product text, pure Python, index precomputed once per catalogue.

WebShop searches with Pyserini BM25 over product text; this is the same ranking function
over title, category, attributes and option values, so a query copied from the
instruction tends to surface matching products, and vaguer queries surface distractors.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache

from offline_agent.envs.minishop.catalog import Catalog, Product, build_catalog

K1 = 1.2
B = 0.75
MAX_RESULTS = 50  # WebShop also keeps the top 50

# Instruction filler that would otherwise match option values or add noise.
STOPWORDS = frozenset(
    "i im am a an the in of for to and or with that is me my find need want looking "
    "please buy get some size under lower than price dollars dollar".split()
)


def tokenize(text: str) -> list[str]:
    """Lowercase alphanumeric words, plural 's' stripped, so 'Shoes' finds 'shoe'."""
    words = re.findall(r"[a-z0-9]+", text.lower())
    return [_stem(w) for w in words if w not in STOPWORDS]


def _stem(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def product_text(p: Product) -> str:
    values = " ".join(v for _, vs in p.options for v in vs)
    return f"{p.title} {p.category} {' '.join(p.features)} {values}"


@dataclass(frozen=True)
class SearchIndex:
    postings: dict[str, tuple[tuple[int, int], ...]]  # term -> ((doc, term frequency), ...)
    doc_len: tuple[int, ...]
    avg_len: float

    def search(self, query: str, limit: int = MAX_RESULTS) -> list[int]:
        """Indices of the best-scoring documents; ties broken by catalogue order."""
        n = len(self.doc_len)
        scores: dict[int, float] = defaultdict(float)
        for term in set(tokenize(query)):
            docs = self.postings.get(term, ())
            if not docs:
                continue
            idf = math.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
            for doc, tf in docs:
                norm = K1 * (1 - B + B * self.doc_len[doc] / self.avg_len)
                scores[doc] += idf * tf * (K1 + 1) / (tf + norm)
        return sorted(scores, key=lambda d: (-scores[d], d))[:limit]


def build_index(products: tuple[Product, ...]) -> SearchIndex:
    postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
    lengths = []
    for i, p in enumerate(products):
        counts = Counter(tokenize(product_text(p)))
        lengths.append(sum(counts.values()))
        for term, tf in counts.items():
            postings[term].append((i, tf))
    return SearchIndex(
        {t: tuple(d) for t, d in postings.items()}, tuple(lengths), sum(lengths) / len(lengths)
    )


@lru_cache(maxsize=8)
def catalog_index(seed: int, num_products: int) -> SearchIndex:
    return build_index(build_catalog(seed, num_products).products)


@lru_cache(maxsize=4096)
def search_ids(seed: int, num_products: int, query: str) -> tuple[str, ...]:
    """Product ids for `query`, memoised: search trees re-issue the same queries a lot."""
    catalog: Catalog = build_catalog(seed, num_products)
    hits = catalog_index(seed, num_products).search(query)
    return tuple(catalog.products[i].id for i in hits)
