"""The seeded procedural catalogue: products with a type, attributes, options and a price.

WebShop scrapes 1.18M Amazon products; we generate a small catalogue with the same shape
(category > product type, attribute phrases, option groups, price) so that search, item
pages and the reward behave alike, offline and in well under a second. Built once per
process per (seed, size) and shared: it is never part of an episode's state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache

COLORS = ("black", "white", "gray", "navy", "red", "blue", "green", "beige", "pink", "brown")
PACKS = ("1 pack", "2 pack", "3 pack", "4 pack", "6 pack")
SIZES = ("small", "medium", "large", "x-large")

# How an option group is named in an instruction ("in red", "in size m").
OPTION_PHRASES = {
    "color": "in {}",
    "size": "in size {}",
    "capacity": "with {} capacity",
    "scent": "in {} scent",
    "flavor": "in {} flavor",
    "pack": "in a {}",
    "weight": "of {}",
    "age": "for ages {}",
}


@dataclass(frozen=True)
class Category:
    name: str
    types: tuple[tuple[str, int, int], ...]  # (product type, min price, max price)
    materials: tuple[str, ...]
    styles: tuple[str, ...]
    features: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (group, possible values)


CATEGORIES = (
    Category(
        "clothing",
        (("t-shirt", 8, 30), ("hoodie", 20, 60), ("jeans", 25, 80)),
        ("cotton", "polyester", "linen", "wool", "fleece"),
        ("slim fit", "relaxed fit", "classic", "oversized", "vintage"),
        ("machine washable", "wrinkle free", "quick dry", "stretchy", "moisture wicking"),
        (("color", COLORS), ("size", ("xs", "s", "m", "l", "xl", "xxl"))),
    ),
    Category(
        "footwear",
        (("running shoes", 30, 120), ("hiking boots", 50, 150), ("sandals", 15, 60)),
        ("leather", "mesh", "suede", "canvas", "rubber"),
        ("lightweight", "classic", "sporty", "minimalist", "rugged"),
        ("non slip", "waterproof", "arch support", "cushioned", "breathable"),
        (
            ("color", ("black", "white", "brown", "gray", "navy", "tan", "red", "blue")),
            ("size", ("6", "7", "8", "9", "10", "11", "12")),
        ),
    ),
    Category(
        "electronics",
        (("headphones", 20, 200), ("bluetooth speaker", 15, 150), ("power bank", 10, 60)),
        ("aluminum", "plastic", "silicone", "carbon fiber", "metal"),
        ("compact", "portable", "premium", "slim", "rugged"),
        ("noise cancelling", "fast charging", "water resistant", "long battery life", "usb c"),
        (("color", ("black", "white", "silver", "blue", "red", "rose gold")), ("pack", PACKS[:3])),
    ),
    Category(
        "kitchen",
        (("coffee mug", 8, 30), ("frying pan", 20, 90), ("water bottle", 10, 40)),
        ("stainless steel", "ceramic", "glass", "cast iron", "bamboo"),
        ("modern", "rustic", "classic", "minimalist", "farmhouse"),
        ("dishwasher safe", "bpa free", "non stick", "insulated", "leak proof"),
        (("color", COLORS), ("capacity", ("12 oz", "16 oz", "20 oz", "24 oz", "32 oz"))),
    ),
    Category(
        "home",
        (("throw pillow", 10, 45), ("bath towel", 8, 40), ("desk lamp", 15, 80)),
        ("velvet", "cotton", "linen", "bamboo", "microfiber"),
        ("modern", "boho", "farmhouse", "minimalist", "luxury"),
        ("machine washable", "hypoallergenic", "fade resistant", "ultra soft", "eco friendly"),
        (("color", COLORS), ("size", SIZES)),
    ),
    Category(
        "beauty",
        (("face moisturizer", 8, 60), ("shampoo", 6, 35), ("lipstick", 5, 30)),
        ("argan oil", "shea butter", "aloe vera", "coconut oil", "vitamin c"),
        ("natural", "professional", "organic", "luxury", "daily"),
        ("paraben free", "cruelty free", "fragrance free", "long lasting", "sulfate free"),
        (
            ("scent", ("lavender", "rose", "citrus", "vanilla", "unscented", "mint")),
            ("capacity", ("1 oz", "2 oz", "4 oz", "8 oz")),
        ),
    ),
    Category(
        "grocery",
        (("green tea", 5, 25), ("protein bar", 10, 40), ("coffee beans", 8, 35)),
        ("organic", "all natural", "raw", "roasted", "whole grain"),
        ("premium", "classic", "artisan", "family size", "single serve"),
        ("gluten free", "non gmo", "low sugar", "high protein", "kosher"),
        (
            ("flavor", ("original", "vanilla", "chocolate", "honey", "berry", "caramel")),
            ("pack", PACKS),
        ),
    ),
    Category(
        "sports",
        (("yoga mat", 15, 70), ("dumbbell", 15, 90), ("jump rope", 6, 30)),
        ("rubber", "foam", "neoprene", "steel", "cork"),
        ("professional", "compact", "heavy duty", "lightweight", "portable"),
        ("non slip", "sweat resistant", "adjustable", "extra thick", "eco friendly"),
        (("color", COLORS), ("weight", ("2 lb", "5 lb", "10 lb", "15 lb", "20 lb"))),
    ),
    Category(
        "toys",
        (("jigsaw puzzle", 8, 35), ("building blocks", 12, 70), ("plush toy", 8, 40)),
        ("wooden", "plastic", "felt", "cardboard", "foam"),
        ("educational", "classic", "creative", "montessori", "animal"),
        ("non toxic", "bpa free", "washable", "stem learning", "travel friendly"),
        (("color", COLORS), ("age", ("3+", "5+", "8+", "12+"))),
    ),
    Category(
        "office",
        (("notebook", 5, 25), ("gel pens", 5, 30), ("backpack", 20, 90)),
        ("leather", "kraft paper", "canvas", "nylon", "recycled paper"),
        ("minimalist", "professional", "classic", "vintage", "compact"),
        ("refillable", "water resistant", "acid free", "lay flat", "padded"),
        (("color", COLORS), ("pack", PACKS)),
    ),
    Category(
        "pets",
        (("dog collar", 6, 30), ("cat bed", 15, 60), ("dog leash", 8, 35)),
        ("nylon", "leather", "plush", "cotton", "rope"),
        ("classic", "cozy", "heavy duty", "soft", "designer"),
        ("reflective", "machine washable", "adjustable", "chew resistant", "waterproof"),
        (("color", COLORS), ("size", ("xs", "small", "medium", "large", "xl"))),
    ),
    Category(
        "outdoor",
        (("camping tent", 40, 250), ("sleeping bag", 25, 120), ("camping chair", 20, 90)),
        ("nylon", "polyester", "aluminum", "ripstop", "canvas"),
        ("lightweight", "compact", "heavy duty", "portable", "family"),
        ("waterproof", "uv resistant", "foldable", "insulated", "quick setup"),
        (("color", ("green", "blue", "gray", "orange", "black", "red", "tan")), ("size", SIZES)),
    ),
    Category(
        "accessories",
        (("wrist watch", 20, 250), ("sunglasses", 10, 120), ("wallet", 10, 70)),
        ("leather", "stainless steel", "titanium", "canvas", "acetate"),
        ("classic", "vintage", "sporty", "minimalist", "luxury"),
        ("water resistant", "polarized", "rfid blocking", "scratch resistant", "slim profile"),
        (("color", ("black", "brown", "silver", "gold", "tan", "blue", "green")),),
    ),
)

BRANDS = tuple(
    "Acme Aurora Bolt Cedar Cobalt Delta Ember Fjord Granite Harbor Indigo Juniper Kestrel "
    "Lumen Maple Nimbus Orbit Pioneer Quill Ridge Summit Tundra Umber Vista Willow Zephyr".split()
)


@dataclass(frozen=True)
class Product:
    id: str
    category: str
    type: str
    brand: str
    style: str
    material: str
    features: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # (group, values offered), in page order
    price: float

    @property
    def title(self) -> str:
        return f"{self.brand} {self.style} {self.material} {self.type}".title()

    @property
    def attributes(self) -> tuple[str, ...]:
        return (*self.features, self.style, self.material)  # the order instructions use

    def option_group(self, value: str) -> str | None:
        """The group offering `value` (values are unique across a product's groups)."""
        for group, values in self.options:
            if value in values:
                return group
        return None


@dataclass(frozen=True)
class Catalog:
    seed: int
    products: tuple[Product, ...]
    by_id: dict[str, Product]
    test_ids: frozenset[str]  # targets of test tasks; every other product is a train target

    def split_ids(self, split: str) -> list[str]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return [p.id for p in self.products if (p.id in self.test_ids) == (split == "test")]


TEST_FRACTION = 0.2
# Share of products that repeat an earlier product's title (WebShop is full of such near
# twins): results pages then hold look-alikes that differ in price, features and options.
VARIANT_FRACTION = 0.3


@lru_cache(maxsize=8)
def build_catalog(seed: int = 0, num_products: int = 2000) -> Catalog:
    """Generate `num_products` products deterministically from `seed`."""
    if num_products < 1:
        raise ValueError("num_products must be >= 1")
    rng = random.Random(f"minishop-catalog-{seed}")
    width = max(4, len(str(num_products - 1)))
    kinds = [(c, t) for c in CATEGORIES for t in c.types]
    products: list[Product] = []
    for i in range(num_products):
        category, (ptype, lo, hi) = kinds[i % len(kinds)] if i < len(kinds) else rng.choice(kinds)
        brand = rng.choice(BRANDS)
        style, material = rng.choice(category.styles), rng.choice(category.materials)
        if i >= len(kinds) and rng.random() < VARIANT_FRACTION:
            base = rng.choice(products)  # a variant: same title, other features/options/price
            category = next(c for c in CATEGORIES if c.name == base.category)
            ptype, lo, hi = next(t for t in category.types if t[0] == base.type)
            brand, style, material = base.brand, base.style, base.material
        products.append(
            Product(
                id=f"P{i:0{width}d}",
                category=category.name,
                type=ptype,
                brand=brand,
                style=style,
                material=material,
                features=tuple(sorted(rng.sample(category.features, rng.choice((1, 2))))),
                options=tuple(_offer(rng, group, values) for group, values in category.options),
                price=int(rng.uniform(lo, hi)) + 0.99,
            )
        )
    order = list(range(num_products))
    random.Random(f"minishop-split-{seed}").shuffle(order)
    test_ids = frozenset(products[i].id for i in order[: round(num_products * TEST_FRACTION)])
    return Catalog(seed, tuple(products), {p.id: p for p in products}, test_ids)


def _offer(rng: random.Random, group: str, values: tuple[str, ...]) -> tuple[str, tuple[str, ...]]:
    """A product offers a subset of its group's values: a run of sizes, a few colours."""
    k = rng.randint(2, min(5, len(values)))
    if group in ("size", "capacity", "weight", "age", "pack"):  # ordered scales: a contiguous run
        start = rng.randrange(len(values) - k + 1)
        return group, values[start : start + k]
    return group, tuple(sorted(rng.sample(values, k), key=values.index))
