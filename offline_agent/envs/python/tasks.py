"""Python tasks from the problem bank: a problem's variant, visible examples and hidden tests,
with expected values computed by its reference solution (our own code, run in-process).

Train and test hold disjoint problems (split by a hash of the function name).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from typing import Any

from offline_agent.envs.python.problems import PROBLEMS, Problem
from offline_agent.types import Task

HIDDEN_RANDOM = 5  # random hidden tests per task, on top of the problem's edge cases
TEST_BUCKETS = 4  # a problem is held out when hash(name) % TEST_BUCKETS == 0


def _plain(value: Any) -> Any:
    """A JSON round trip: tuples become lists, as they do on the way back from the sandbox."""
    return json.loads(json.dumps(value))


def split_of(problem: Problem) -> str:
    digest = int(hashlib.sha256(problem.name.encode()).hexdigest(), 16)
    return "test" if digest % TEST_BUCKETS == 0 else "train"


@functools.cache
def reference(problem_name: str, variant: int) -> Any:
    """The compiled reference function (our own trusted code, run in-process)."""
    problem = next(p for p in PROBLEMS if p.name == problem_name)
    namespace: dict[str, Any] = {}
    exec(problem.source(problem.variants[variant]), namespace)  # noqa: S102 - our own code
    return namespace[problem.name]


def make_task(problem: Problem, round_: int, seed: int) -> Task:
    """Round r uses variant r % len(variants); later rounds draw fresh visible examples."""
    variant = round_ % len(problem.variants)
    rng = random.Random(f"py:{seed}:{problem.name}:{round_}")
    visible = list(problem.visible)
    if round_ >= len(problem.variants):
        visible = visible[:1] + [problem.gen(rng) for _ in range(2)]
    hidden = list(problem.edge) + [problem.gen(rng) for _ in range(HIDDEN_RANDOM)]
    fn = reference(problem.name, variant)

    def case(args: tuple) -> list:
        args = _plain(list(args))  # exactly what the sandbox will receive
        return [args, _plain(fn(*_plain(args)))]  # a fresh copy: a function may mutate its input

    data = {
        "function": problem.name,
        "variant": variant,
        "visible": [case(a) for a in visible],
        "hidden": [case(a) for a in hidden],
    }
    examples = "\n".join(
        f"{problem.name}({', '.join(map(repr, args))}) == {expected!r}"
        for args, expected in data["visible"]
    )
    instruction = (
        f"Write a Python function.\n\n{problem.signature}\n"
        f'    """{problem.describe(problem.variants[variant])}"""\n\nExamples:\n{examples}'
    )
    digest = hashlib.sha256(json.dumps([instruction, data["hidden"]]).encode()).hexdigest()[:10]
    return Task(
        id=f"py-{problem.name}-{digest}",
        env="python",
        instruction=instruction,
        split=split_of(problem),
        data=data,
    )
