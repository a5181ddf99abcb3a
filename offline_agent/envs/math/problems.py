"""Generated arithmetic word problems: level 1 is one operation, level 2 two, level 3 several
with parentheses, percentages and division. A problem is a function of (seed, index, level);
the split is decided by a hash of the question text, so train and test never share a
question whatever the seed.
"""

from __future__ import annotations

import hashlib
import random

from offline_agent.envs.math.calculator import evaluate

TEST_FRACTION = 5  # one question in 5 (by hash) is held out

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Emma", "Finn", "Gita", "Hugo", "Iris", "Jon", "Kemi", "Leo"]
ITEMS = ["apples", "pencils", "stickers", "marbles", "cookies", "books", "shells", "cards"]


def _level1(r: random.Random) -> tuple[str, str]:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    a, b = r.randint(5, 99), r.randint(2, 60)
    kind = r.randrange(4)
    if kind == 0:
        return (
            f"{n} has {a} {item} and gets {b} more. How many {item} does {n} have now?",
            f"{a} + {b}",
        )
    if kind == 1:
        a += b
        return f"{n} had {a} {item} and gave away {b}. How many {item} are left?", f"{a} - {b}"
    if kind == 2:
        a, b = r.randint(3, 25), r.randint(3, 25)
        return f"A box holds {a} {item}. How many {item} are in {b} boxes?", f"{a} * {b}"
    each, k = r.randint(2, 30), r.randint(2, 12)
    return (
        f"{n} shares {each * k} {item} equally among {k} friends. How many {item} does each friend get?",
        f"{each * k} / {k}",
    )


def _level2(r: random.Random) -> tuple[str, str]:
    n, item = r.choice(NAMES), r.choice(ITEMS)
    kind = r.randrange(3)
    if kind == 0:
        a, b = r.randint(3, 15), r.randint(4, 24)
        c = r.randint(1, a * b - 1)
        return (
            (
                f"{n} buys {a} bags of {item} with {b} in each bag and then gives away {c}. "
                f"How many {item} does {n} have left?"
            ),
            f"{a} * {b} - {c}",
        )
    if kind == 1:
        k = r.randint(2, 9)
        total = k * r.randint(3, 20)
        a = r.randint(1, total - 1)
        return (
            (
                f"{n} has {a} {item}, buys {total - a} more, and splits them equally into {k} bags. "
                f"How many {item} go in each bag?"
            ),
            f"({a} + {total - a}) / {k}",
        )
    price, tickets = r.randint(3, 40), r.randint(2, 9)
    bill = r.choice([b for b in (50, 100, 200, 500) if b > price * tickets])
    return (
        (
            f"A ticket costs ${price}. {n} buys {tickets} tickets and pays with a ${bill} bill. "
            f"How many dollars of change does {n} get?"
        ),
        f"{bill} - {price} * {tickets}",
    )


def _level3(r: random.Random) -> tuple[str, str]:
    n = r.choice(NAMES)
    kind = r.randrange(3)
    if kind == 0:
        price, off, people = (
            20 * r.randint(2, 15),
            r.choice([10, 20, 25, 30, 40, 50]),
            r.randint(2, 5),
        )
        return (
            (
                f"A bike costs ${price}. It is on sale for {off}% off, and {n} splits the sale price "
                f"equally with {people - 1} friends. How many dollars does each person pay?"
            ),
            f"{price} * (100 - {off}) / 100 / {people}",
        )
    if kind == 1:
        wage, hours, days, rent = (
            r.randint(8, 30),
            r.randint(2, 8),
            r.randint(3, 7),
            r.choice([10, 20, 25, 40]),
        )
        return (
            (
                f"{n} earns ${wage} per hour, works {hours} hours a day for {days} days, and then spends "
                f"{rent}% of the money on rent. How many dollars are left?"
            ),
            f"{wage} * {hours} * {days} * (100 - {rent}) / 100",
        )
    group = r.randint(2, 6)
    walk = r.choice([10, 20, 25, 50])
    students = 20 * group * r.randint(1, 5)
    return (
        (
            f"A school has {students} students. {walk}% of them walk to school and the rest ride "
            f"buses that each carry {group} students. How many buses are needed?"
        ),
        f"{students} * (100 - {walk}) / 100 / {group}",
    )


LEVELS = {1: _level1, 2: _level2, 3: _level3}


def make_problem(seed: int, index: int, level: int) -> tuple[str, str]:
    """(question, expression) for one (seed, index, level); the answer is evaluate(expression)."""
    r = random.Random(f"math:{seed}:{index}:{level}")
    while True:  # keep answers exact to the cent, so copying the calculator's output is right
        question, expression = LEVELS[level](r)
        cents = evaluate(expression) * 100
        if abs(cents - round(cents)) < 1e-9:
            return question, expression


def split_of(question: str) -> str:
    digest = int(hashlib.sha256(question.encode()).hexdigest(), 16)
    return "test" if digest % TEST_FRACTION == 0 else "train"
