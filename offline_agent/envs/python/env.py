"""Python tasks: write a small function; `run_tests` shows the visible examples' results,
`submit` scores hidden tests (reward = fraction passed) and ends the episode.

Model code only ever runs in the sandbox. Expected outputs never enter the sandbox: the
child reports each return value as JSON and the comparison happens here, so code that
returns an object whose __eq__ is always True, or prints fake results, gains nothing.
Train and test hold disjoint problems (split by a hash of the function name).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import random
import re
from dataclasses import dataclass
from itertools import count
from typing import Any

from offline_agent.envs.base import ActionError, Env, StepResult
from offline_agent.envs.python_problems import PROBLEMS, Problem
from offline_agent.envs.sandbox import require_isolation, run_python
from offline_agent.types import Task, ToolCall

DEMO_PROBLEM = "differences"  # a short train problem solved in the demonstration
HIDDEN_RANDOM = 5  # random hidden tests per task, on top of the problem's edge cases
PER_TEST_S = 0.5  # alarm per test call, so one endless case does not zero the others
TEST_BUCKETS = 4  # a problem is held out when hash(name) % TEST_BUCKETS == 0
MARKER = "@@oa-results@@"
REPORT_FIELD_CHARS = 500  # the harness cuts every field of its report to this
_INVALID = object()  # what _loads returns for text that is not (safe) JSON

# Runs in the sandbox after `PAYLOAD = '<json>'`: executes the code, calls the function on
# each argument list, prints one marker line with the JSON-encoded return values.
HARNESS = r"""
import contextlib, io, json, linecache, signal, sys
P = json.loads(PAYLOAD)
def _alarm(*_):
    raise TimeoutError("took longer than %ss" % P["per_test_s"])
def _error(e):
    return ["error", (type(e).__name__ + ": " + str(e))[:200]]
def _value(v):
    try:
        text = json.dumps(v, sort_keys=True)
    except (TypeError, ValueError):
        return ["error", "returned a %s, not a plain value" % type(v).__name__]
    return ["ok", text] if len(text) <= 500 else ["error", "return value too large"]
res = {"error": None, "results": []}
out = io.StringIO()
linecache.cache["solution.py"] = (len(P["code"]), None, P["code"].splitlines(True), "solution.py")
signal.signal(signal.SIGALRM, _alarm)
with contextlib.redirect_stdout(out):
    ns = {"__name__": "solution"}
    signal.setitimer(signal.ITIMER_REAL, 2 * P["per_test_s"])
    try:
        exec(compile(P["code"], "solution.py", "exec"), ns)
    except SyntaxError as e:
        res["error"] = ("SyntaxError: %s (line %s)" % (e.msg, e.lineno))[:200]
    except BaseException as e:
        res["error"] = _error(e)[1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    fn = ns.get(P["name"])
    if res["error"] is None and not callable(fn):
        res["error"] = "NameError: function %r is not defined" % P["name"]
    if res["error"] is None:
        for args in P["cases"]:
            signal.setitimer(signal.ITIMER_REAL, P["per_test_s"])
            try:
                res["results"].append(_value(fn(*args)))
            except BaseException as e:
                res["results"].append(_error(e))
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
res["stdout"] = out.getvalue()[:500]
sys.__stdout__.write("\n" + MARKER + json.dumps(res) + "\n")
"""


@dataclass
class Report:
    """Outcome of running code on test cases."""

    passed: list[bool]
    lines: list[str]  # one PASS/FAIL line per case
    error: str | None  # code-level failure (syntax, missing function, timeout, crash)
    stdout: str


def run_cases(code: str, name: str, cases: list[list], allow_weaker: bool = False) -> Report:
    """Run `code` in the sandbox and compare `name(*args)` with each case's expected value."""
    payload = {
        "code": code,
        "name": name,
        "cases": [args for args, _ in cases],
        "per_test_s": PER_TEST_S,
    }
    script = f"PAYLOAD = {json.dumps(payload)!r}\nMARKER = {MARKER!r}\n{HARNESS}"
    timeout_s = 2 + PER_TEST_S * (len(cases) + 2)  # start-up, module code, every case
    result = run_python(script, timeout_s=timeout_s, allow_weaker=allow_weaker)
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith(MARKER)]
    res = _parse_results(lines[-1][len(MARKER) :], len(cases)) if lines else None
    if res is None:
        if result.timed_out:
            why = f"timed out after {timeout_s:g}s"
        else:
            why = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
        return Report([False] * len(cases), [], f"the program crashed: {why}"[:300], "")
    if res["error"]:
        return Report([False] * len(cases), [], res["error"], res["stdout"])
    passed, report_lines = [], []
    for (args, expected), (kind, text) in zip(cases, res["results"]):
        call = _short(f"{name}({', '.join(map(repr, args))})")
        ok = kind == "ok" and json.loads(text) == expected
        passed.append(ok)
        if ok:
            report_lines.append(f"PASS {call}")
        elif kind == "ok":
            report_lines.append(
                f"FAIL {call}: expected {_short(repr(expected))}, got {_short(repr(json.loads(text)))}"
            )
        else:
            report_lines.append(f"ERROR {call}: {text}")
    return Report(passed, report_lines, None, res["stdout"])


def _parse_results(line: str, n_cases: int) -> dict | None:
    """The harness's report, or None if it is malformed (the code may have forged or broken it)."""
    res = _loads(line)
    if res is _INVALID:
        return None
    if not (
        isinstance(res, dict)
        and (res.get("error") is None or _short_text(res["error"]))
        and _short_text(res.get("stdout"))
        and isinstance(res.get("results"), list)
        and (res["error"] is not None or len(res["results"]) == n_cases)
        and all(_valid_result(r) for r in res["results"])
    ):
        return None
    return res


def _valid_result(r: object) -> bool:
    if not (isinstance(r, list) and len(r) == 2 and r[0] in ("ok", "error") and _short_text(r[1])):
        return False
    return r[0] == "error" or _loads(r[1]) is not _INVALID


def _short_text(value: object) -> bool:
    """A string no longer than the harness ever writes (it cuts every field to 500)."""
    return isinstance(value, str) and len(value) <= REPORT_FIELD_CHARS


def _loads(text: str) -> Any:
    """JSON from the sandbox's report line, or _INVALID where the code broke or forged it
    (not JSON, nested too deeply, an integer of more than 4,300 digits)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _INVALID


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- tasks ------------------------------------------------------------------------------------


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


# ---- env --------------------------------------------------------------------------------------


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
            report = run_cases(code, data["function"], data["visible"], self.allow_weaker_sandbox)
            passed = code if report.passed and all(report.passed) else None
            self.state = {"submitted": False, "passed_code": passed}
            return StepResult(observation=_render(report), info={"passed": sum(report.passed)})
        report = run_cases(code, data["function"], data["hidden"], self.allow_weaker_sandbox)
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
