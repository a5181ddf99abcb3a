"""Action parser: the forms small models write, first action wins, errors say what is wrong."""

from __future__ import annotations

import pytest

from offline_agent.envs.base import MAX_ARGUMENT_CHARS, ActionError
from offline_agent.envs.math import CalculatorMath
from offline_agent.envs.parser import parse_action
from offline_agent.envs.python import PythonTasks
from offline_agent.types import ToolCall


def _tool(name: str, **params: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": t} for k, t in params.items()},
                "required": list(params),
            },
        },
    }


SHOP = [_tool("search", query="string"), _tool("click", target="string"), _tool("buy")]
MATH = CalculatorMath.tools
PY = PythonTasks.tools


@pytest.mark.parametrize(
    "text, tools, expected",
    [
        ("search[red shirt]", SHOP, ToolCall("search", {"query": "red shirt"})),
        ("click[P101]", SHOP, ToolCall("click", {"target": "P101"})),
        ("buy", SHOP, ToolCall("buy", {})),
        ("buy[]", SHOP, ToolCall("buy", {})),
        ("buy()", SHOP, ToolCall("buy", {})),
        ("  Action: buy.\nObservation: ...", SHOP, ToolCall("buy", {})),
        ("Action: search[ cotton socks ]", SHOP, ToolCall("search", {"query": "cotton socks"})),
        ('search["blue jeans"]', SHOP, ToolCall("search", {"query": "blue jeans"})),
        ("Search [men's boots]", SHOP, ToolCall("search", {"query": "men's boots"})),
        ("```\nclick[P7]\n```", SHOP, ToolCall("click", {"target": "P7"})),
        (
            '{"name": "search", "arguments": {"query": "hat"}}',
            SHOP,
            ToolCall("search", {"query": "hat"}),
        ),
        (
            '{"name": "search", "arguments": "{\\"query\\": \\"hat\\"}"}',
            SHOP,
            ToolCall("search", {"query": "hat"}),
        ),
        ('{"name": "buy"}', SHOP, ToolCall("buy", {})),
        (
            '{"type": "function", "function": {"name": "click", "arguments": {"target": "P2"}}}',
            SHOP,
            ToolCall("click", {"target": "P2"}),
        ),
        (
            '<tool_call>\n{"name": "click", "arguments": {"target": "Next"}}\n</tool_call>',
            SHOP,
            ToolCall("click", {"target": "Next"}),
        ),
        ('search(query="red hat")', SHOP, ToolCall("search", {"query": "red hat"})),
        ('click("P3")', SHOP, ToolCall("click", {"target": "P3"})),
        ("calculate[3*4]", MATH, ToolCall("calculate", {"expression": "3*4"})),
        ("calculate[`3*4`]", MATH, ToolCall("calculate", {"expression": "3*4"})),
        (
            "calculate[(2 + 3) * [4][0]]",
            MATH,
            ToolCall("calculate", {"expression": "(2 + 3) * [4][0]"}),
        ),
        ("calculate(3*(4+1))", MATH, ToolCall("calculate", {"expression": "3*(4+1)"})),
        ("answer[12]", MATH, ToolCall("answer", {"value": 12})),
        ("answer[ -2.5 ]", MATH, ToolCall("answer", {"value": -2.5})),
        ("answer[$1,200]", MATH, ToolCall("answer", {"value": 1200})),
        (
            '{"name": "answer", "arguments": {"value": "84"}}',
            MATH,
            ToolCall("answer", {"value": 84}),
        ),
        ("answer(value=7)", MATH, ToolCall("answer", {"value": 7})),
    ],
)
def test_accepted_forms(text, tools, expected):
    assert parse_action(text, tools) == expected


def test_first_action_wins_over_later_ones_and_chatter():
    text = 'I will search first.\nsearch[red shirt] then click[P1]\n{"name": "buy"}'
    assert parse_action(text, SHOP) == ToolCall("search", {"query": "red shirt"})
    text = '{"name": "click", "arguments": {"target": "P9"}} and later search[x]'
    assert parse_action(text, SHOP) == ToolCall("click", {"target": "P9"})
    # a parameterless name inside chatter is not an action; the bracket call is
    assert parse_action("I want to buy it, so click[P4]", SHOP) == ToolCall(
        "click", {"target": "P4"}
    )


def test_multiline_code_with_brackets_inside():
    code = 'def f(s):\n    parts = s.split("]")\n    return [p[::-1] for p in parts][0]'
    text = f"Let me test.\nrun_tests[{code}\n]\nThis should work [I hope]."
    assert parse_action(text, PY) == ToolCall("run_tests", {"code": code})


def test_unbalanced_bracket_in_code_falls_back_to_the_last_bracket():
    code = 'def f(s):\n    # drop a trailing [\n    return s.rstrip("[")'
    call = parse_action(f"submit[{code}]", PY)
    assert call.arguments["code"] == code


def test_code_fence_inside_and_indented_code_are_cleaned():
    text = "submit[```python\n    import re\n    def f(x):\n        return x + 1\n```]"
    assert parse_action(text, PY).arguments["code"] == "import re\ndef f(x):\n    return x + 1"


def test_hostile_text_is_an_action_error():
    """Deeply nested or huge text ends as an ActionError (no RecursionError, no hang; how
    long the scan takes is measured by tests/test_fuzz.py, not asserted on the clock here)."""
    texts = ["{" * 50_000, '{"a": ' * 10_000, "submit[```\n" + " " * 50_000 + "]", "[" * 100_000]
    for text in texts:
        with pytest.raises(ActionError):
            parse_action(text, PY)


@pytest.mark.parametrize(
    "text, tools, message",
    [
        ("", SHOP, "empty action"),
        ("   \n ", SHOP, "empty action"),
        (
            "hello there",
            SHOP,
            "no tool call found; write one of: search[query], click[target], buy",
        ),
        ("fly[away]", SHOP, "unknown tool 'fly'"),
        ("Action: fly(away)", SHOP, "unknown tool 'fly'"),
        ("The first item list[0] is red", SHOP, "no tool call found"),
        ("```python\ndef f(xs):\n    return xs[0]\n```", PY, "no tool call found"),
        (
            '{"name": "fly", "arguments": {}}',
            SHOP,
            "unknown tool 'fly'; available: search, click, buy",
        ),
        ("search[]", SHOP, "search[] is empty"),
        ("search", SHOP, "search needs an argument"),
        ("search[red shirt", SHOP, "missing its closing ']'"),
        ("<tool_call>{not json}</tool_call>", SHOP, "invalid JSON in <tool_call>"),
        (
            '{"name": "search", "arguments": "{oops"}',
            SHOP,
            "arguments of search are not valid JSON",
        ),
        ('{"name": "search", "arguments": [1]}', SHOP, "must be a JSON object"),
        ("answer[twelve]", MATH, "answer.value must be a number, got 'twelve'"),
        ("answer[1e999]", MATH, "must be a finite number"),
        ("answer[" + "9" * 5000 + "]", MATH, "must be a number"),
        ("<tool_call>" + "[" * 100_000, SHOP, "nested too deeply"),
    ],
)
def test_errors_name_the_problem(text, tools, message):
    with pytest.raises(ActionError) as err:
        parse_action(text, tools)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "!!!###",
        "unknown_tool[1]",
        '{"name": "calculate", "arguments": {}}',  # missing argument
        '{"name": "calculate", "arguments": {"expression": "1", "x": 2}}',  # unknown argument
        "calculate[" + "1+" * 3000 + "1]",  # huge argument
        "answer[true]",
        "{" * 50_000,
        "calculate[__import__('os').system('ls')]",
    ],
)
def test_env_act_never_raises_and_flags_invalid(text):
    env = CalculatorMath()
    env.reset(env.tasks("train", 1)[0])
    _, result = env.act(text)
    assert result.invalid and result.observation.startswith("Invalid action:")
    assert env.num_steps == 1 and not result.done


def test_huge_argument_is_refused_by_length():
    env = CalculatorMath()
    env.reset(env.tasks("train", 1)[0])
    _, result = env.act("calculate[" + "1" * (MAX_ARGUMENT_CHARS + 1) + "]")
    assert result.invalid and "too long" in result.observation


def test_python_env_flags_missing_code_without_running_anything():
    env = PythonTasks()
    env.reset(env.tasks("train", 1)[0])
    call, result = env.act('{"name": "submit", "arguments": {}}')
    assert call == ToolCall("submit", {}) and result.invalid
    assert "submit is missing argument(s): code" in result.observation and not result.done
