"""Calculator math: generated arithmetic word problems (problems.py), a safe calculator
(calculator.py) and an exact verifier.
"""

from __future__ import annotations

import hashlib
import math

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.envs.math.calculator import MAX_MAGNITUDE, evaluate, format_number, is_correct
from offline_agent.envs.math.problems import LEVELS, make_problem, split_of
from offline_agent.types import Task, ToolCall

DEMO_OPERATOR = "+"  # the demonstration solves a problem with this operation (see demo_episode)
MAX_MISSES = 20_000  # consecutive duplicate/other-split draws before giving up


def _tool(name: str, description: str, param: str, kind: str, param_doc: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {param: {"type": kind, "description": param_doc}},
                "required": [param],
            },
        },
    }


class CalculatorMath(Env):
    """Word problems; `calculate` is free, `answer` ends the episode with reward 1 or 0."""

    name = "math"
    tools = [
        _tool(
            "calculate",
            "Evaluate an arithmetic expression.",
            "expression",
            "string",
            "numbers, + - * / // % ** and parentheses, e.g. (12 + 3) * 4",
        ),
        _tool(
            "answer",
            "Give the final numeric answer; ends the episode.",
            "value",
            "number",
            "the answer as a number",
        ),
    ]
    ending_tools = ("answer",)  # verifier-free search never runs it (Env.ending_tools)

    def __init__(self, max_steps: int = 10, seed: int = 0, levels: tuple[int, ...] = (1, 2, 3)):
        super().__init__(max_steps=max_steps, seed=seed)
        unknown = [lv for lv in levels if lv not in LEVELS]
        if unknown or not levels:
            raise ValueError(
                f"unknown math level(s) {unknown or levels}; choose from {sorted(LEVELS)}"
            )
        self.levels = tuple(levels)

    def tasks(self, split: str, n: int) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}: use 'train' or 'test'")
        out: list[Task] = []
        seen: set[str] = set()
        misses, i = 0, -1
        while len(out) < n:
            i += 1
            level = self.levels[i % len(self.levels)]
            question, expression = make_problem(self.seed, i, level)
            if split_of(question) != split or question in seen:
                misses += 1
                if misses > MAX_MISSES:  # the templates of these levels are used up
                    raise ValueError(
                        f"only {len(out)} distinct {split} problems at levels {self.levels}"
                    )
                continue
            misses = 0
            seen.add(question)
            digest = hashlib.sha256(question.encode()).hexdigest()[:12]
            out.append(
                Task(
                    id=f"math-{digest}",
                    env=self.name,
                    instruction=question,
                    split=split,
                    data={"expression": expression, "answer": evaluate(expression), "level": level},
                )
            )
        return out

    def system_prompt(self) -> str:
        return (
            "You solve math word problems with tools. Reply with exactly one action per turn:\n"
            "calculate[expression] - evaluate arithmetic (+ - * / and parentheses)\n"
            "answer[number] - give the final answer; this ends the episode\n"
            "\n"
            "Example:\n"
            "Question: A box holds 12 pens. How many pens are in 7 boxes?\n"
            "calculate[12*7]\n"
            "Result: 84\n"
            "answer[84]"
        )

    def demo_episode(self) -> tuple[Task, list[str]]:
        """A level-1 addition problem of the train split: calculate, then answer the result.
        Without it a 135M model restates the question; it copies the demo's operator, so a
        multiplication demo made it multiply everything (figures: docs/environments.md)."""
        tasks = CalculatorMath(seed=self.seed, levels=(1,)).tasks("train", 20)
        task = next(t for t in tasks if DEMO_OPERATOR in t.data["expression"])
        expression = task.data["expression"]
        return task, [f"calculate[{expression}]", f"answer[{format_number(evaluate(expression))}]"]

    def _reset(self, task: Task) -> str:
        self.state = {"answered": None}
        return "Use calculate[...] for arithmetic, then answer[...] with the final number."

    def _execute(self, call: ToolCall) -> StepResult:
        if self.state["answered"] is not None:
            raise ActionError("the episode is over: an answer was already given")
        if call.name == "calculate":
            return StepResult(
                observation=f"Result: {format_number(evaluate(call.arguments['expression']))}"
            )
        value = call.arguments["value"]
        if isinstance(value, bool):
            raise ActionError("answer.value must be a number, not true/false")
        if abs(value) > MAX_MAGNITUDE or not math.isfinite(value):  # isfinite(10**400) raises
            raise ActionError(f"answer.value is out of range (limit {MAX_MAGNITUDE:g})")
        self.state = {"answered": value}
        correct = is_correct(value, self.task.data["answer"])
        return StepResult(
            observation=f"Answer {format_number(value)} is {'correct' if correct else 'wrong'}.",
            reward=1.0 if correct else 0.0,
            done=True,
            info={"correct": correct},
        )
