"""Python tasks: write a small function; `run_tests` shows the visible examples' results,
`submit` scores hidden tests (reward = fraction passed) and ends the episode.

Model code only ever runs in the sandbox (harness.py grades it); the tasks come from the
problem bank (tasks.py, problems.py).
"""

from __future__ import annotations

import ast
import re
from itertools import count

from offline_agent.envs.base import ActionError, Env, EnvFailure, StepResult
from offline_agent.envs.python.harness import Report, run_cases
from offline_agent.envs.python.problems import PROBLEMS
from offline_agent.envs.python.tasks import make_task, split_of
from offline_agent.sandbox import SandboxError, require_isolation
from offline_agent.types import Task, ToolCall

DEMO_PROBLEM = "differences"  # a short train problem solved in the demonstration


def _code_tool(name: str, description: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {"type": "string", "description": "the full function definition"}
                },
                "required": ["code"],
            },
        },
    }


class PythonTasks(Env):
    """Function-writing problems scored by hidden unit tests run in the sandbox."""

    name = "python"
    # A reply ends at a blank line, so code must not hold one (the prompt says so). A stop
    # string that starts with "]" would cut the action's own closing bracket off the text.
    stop = ["\n\n"]
    max_action_tokens = 320
    tools = [
        _code_tool("run_tests", "Run the code on the example tests and show the results."),
        _code_tool(
            "submit", "Submit the final code; hidden tests give the score; ends the episode."
        ),
    ]
    ending_tools = ("submit",)  # verifier-free search never runs it (Env.ending_tools)

    def __init__(self, max_steps: int = 10, seed: int = 0, allow_weaker_sandbox: bool = False):
        """`allow_weaker_sandbox`: run code even where a sandbox layer is missing (else a
        machine without one fails here, before any search, with the missing layers named)."""
        super().__init__(max_steps=max_steps, seed=seed)
        require_isolation(allow_weaker_sandbox)
        self.allow_weaker_sandbox = allow_weaker_sandbox

    def tasks(self, split: str, n: int) -> list[Task]:
        problems = [p for p in PROBLEMS if split_of(p) == split]
        if not problems:
            raise ValueError(f"unknown split {split!r}: use 'train' or 'test'")
        out: list[Task] = []
        for round_ in count():
            for problem in problems:
                if len(out) == n:
                    return out
                out.append(make_task(problem, round_, self.seed))

    def system_prompt(self) -> str:
        return (
            "You write Python functions. Reply with exactly one action per turn:\n"
            "run_tests[code] - run your code on the examples and see which pass\n"
            "submit[code] - submit your final code; hidden tests decide the score and the episode ends\n"
            "Put the whole function definition inside the brackets, with no blank lines.\n"
            "\n"
            "Example:\n"
            "Task: def double(x: int) -> int, return x times 2; double(3) == 6\n"
            "run_tests[def double(x):\n"
            "    return x * 2]\n"
            "Result: 1/1 tests passed\n"
            "submit[def double(x):\n"
            "    return x * 2]"
        )

    def demo_episode(self) -> tuple[Task, list[str]]:
        """A short train problem: run_tests with the reference code, then submit it.
        Without it the 135M model writes a fenced function and no tool name (0 valid of 4).
        Its code ends in a list comprehension, so the action ends in "]]": the model writes
        such code often, and after a demo ending in ")]" it left out the tool's own "]"."""
        problem = next(p for p in PROBLEMS if p.name == DEMO_PROBLEM)
        code = f"{problem.signature}\n{problem.solution}"
        return make_task(problem, 0, self.seed), [f"run_tests[{code}]", f"submit[{code}]"]

    def act(self, text: str) -> tuple[ToolCall | None, StepResult]:
        return super().act(close_call(text[: self.max_parse_chars]))

    def available_actions(self) -> list[str]:
        """Submitting the code the last run_tests passed in full: MiniShop's `buy`. Search adds
        it to the children and tries it on snapshots (`search.listed`, `search.finish`), so a
        rollout that got the examples right but then wrote other code still shows its worth."""
        passed = self.state.get("passed_code")
        return [] if self.state["submitted"] or passed is None else [f"submit[{passed}]"]

    def _reset(self, task: Task) -> str:
        self.state = {"submitted": False, "passed_code": None}
        return "Check your code with run_tests[...], then submit[...] it."

    def _execute(self, call: ToolCall) -> StepResult:
        if self.state["submitted"]:
            raise ActionError("the episode is over: the code was already submitted")
        data, code = self.task.data, restore_bracket(call.arguments["code"])
        if call.name == "run_tests":
            report = self._grade(code, data["visible"])
            passed = code if report.passed and all(report.passed) else None
            self.state = {"submitted": False, "passed_code": passed}
            return StepResult(observation=_render(report), info={"passed": sum(report.passed)})
        report = self._grade(code, data["hidden"])
        self.state = {"submitted": True, "passed_code": None}
        passed, total = sum(report.passed), len(report.passed)
        observation = f"Submitted: {passed}/{total} hidden tests passed."
        if report.error:
            observation += f"\nError: {report.error}"
        return StepResult(
            observation=observation,
            reward=passed / total,
            done=True,
            info={"passed": passed, "total": total},
        )

    def _grade(self, code: str, cases: list[list]) -> Report:
        """`run_cases` on this task's function; a sandbox that cannot run is the env's own
        failure (EnvFailure, which `act` raises), never an invalid step of the model."""
        try:
            return run_cases(code, self.task.data["function"], cases, self.allow_weaker_sandbox)
        except SandboxError as e:
            raise EnvFailure(f"python env: the sandbox cannot run the code: {e}") from e


_OPEN_CALL = re.compile(r"(?<![\w.])(run_tests|submit)[ \t]*\[", re.IGNORECASE)


def close_call(text: str) -> str:
    """`text` with a "]" appended if it opens a code action that no "]" follows.

    A reply ends where its action does (a blank line or end of turn), and the 135M model
    often stops right after the code (`submit[def f(x):\n    return x + 1`, then end of
    turn): read the end of the reply as the end of the call, not as an invalid action."""
    m = _OPEN_CALL.search(text)
    if m is not None and "]" not in text[m.end():]:
        return text + "]"
    return text


def restore_bracket(code: str) -> str:
    """`code` with a "]" appended if only that makes it valid Python.

    Small models end code such as `return [x for x in xs]` with one "]" for both the list
    and the action (`submit[...]`); the parser then closes the action at that last "]" and
    the code loses it. Parsing only (no execution) of at most MAX_ARGUMENT_CHARS chars."""
    if _parses(code) or not _parses(code + "]"):
        return code
    return code + "]"


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return False
    return True


def _render(report: Report) -> str:
    if report.error:
        text = f"Error: {report.error}"
    else:
        text = f"{sum(report.passed)}/{len(report.passed)} tests passed\n" + "\n".join(report.lines)
    if report.stdout.strip():
        text += f"\nPrinted output:\n{report.stdout.strip()[:300]}"
    return text
