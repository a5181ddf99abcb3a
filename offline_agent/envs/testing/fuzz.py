"""Hostile model text for an env's tools: the cases that once crashed `Env.act`, and a
seeded stream of mangled actions. Used by the fuzz test and `offline-agent check-env`.

A policy under RL pressure writes whatever text earns reward; these are the shapes that
broke parsers before: JSON that is not an object, integers past Python's 4,300-digit
str() limit or float range, unclosed quotes and brackets (quadratic scans), deep nesting,
megabyte names and keys echoed back into observations.
"""

from __future__ import annotations

import json
import random

_ALPHABET = "[](){}<>\"'`\\:,;=.-+*/%#@!?_ \n\t0123456789abcxyzXYZ\u00e9\u4e2d\u200b\U0001f600"
_CHATTER = ["", "Action: ", "I will now ", "```\n", "Sure! ", "<tool_call>", "</tool_call>",
            "\n\n", "Result: 84\n", "think: ", "act 2: "]
_VALUES = [
    "", " ", "x", "red shirt", "12*7", "(3 + 4", "1/0", "9**9**9", "-0", "1e309", "NaN", "Infinity",
    "$1,200", "true", "null", "[]", "{}", "'quoted'", '"dq"', "a]b", "a\\]b", "s.split(\"]\")",
    "def f(x):\n    return x", "```python\ndef f(x):\n    return x]\n```", "\u200b", "\x00",
    "1" * 400, "9" * 5000, "0x" + "f" * 400, "'" * 50, "\\" * 51, "[" * 300, "(" * 300,
]
_JSON_VALUES = [None, True, 0, -1, 1.5, 1e308, "", "x", [], {}, [[[]]], {"a": {"b": None}}]


def named_cases(tools: list[dict]) -> list[str]:
    """Every shape that once raised, instantiated for these tools."""
    names = [t["function"]["name"] for t in tools] or ["tool"]
    first = names[0]
    big_int = "1" * 4400  # past str(int)'s 4,300-digit limit
    cases = [
        "", " \n ", "<tool_call>null</tool_call>", "<tool_call>[]</tool_call>",
        "<tool_call>1</tool_call>", '<tool_call>"search"</tool_call>', "<tool_call>",
        "<tool_call>" + "[" * 100_000 + "</tool_call>",
        '{"name": null}', '{"name": ["x"]}', '{"function": {"name": 1}}',
        '{"name": "' + "n" * 1_000_000 + '"}',
        "x" * 1_000_000 + "[y]",
        "[" * 100_000, "{" * 100_000, '{"' * 50_000,
    ]
    for name in names:
        key = _first_param(tools, name) or "arg"
        cases += [
            f'<tool_call>{{"name": "{name}", "arguments": {{"{key}": {big_int}}}}}</tool_call>',
            f'{{"name": "{name}", "arguments": {{"{key}": {big_int}}}}}',
            f'{{"name": "{name}", "arguments": "{{\\"{key}\\": {big_int}}}"}}',
            f'{{"name": "{name}", "arguments": "' + "[" * 5000 + '"}',
            f'{{"name": "{name}", "arguments": {{"' + "k" * 100_000 + '": 1}}',
            f"{name}(0x" + "f" * 4000 + ")",
            f"{name}({'9' * 400})", f"{name}(1{'0' * 309})", f"{name}[1e400]", f"{name}[-1e309]",
            f"{name}({big_int})", f"{name}[{big_int}]",
            f"{name}['''" + "x'" * 10_000, f"{name}['''" + "'" * 1_000_000,
            f"{name}[" + "\"'" * 10_000, f"{name}['" + "\\'" * 9_000,
            f"{name}(" + "(" * 10_000, f"{name}[" + "[" * 50_000,
            f"{name}[" + " " * 50_000, f"{name}(" + "a=1, " * 5000 + ")",
            f"{name}({key}=" + "'" * 3 + "x" * 3000 + "')",
        ]
    cases.append(f"{first}[{'x' * 5000}]")
    return cases


def random_cases(tools: list[dict], n: int, seed: int) -> list[str]:
    """`n` seeded mangled actions: a well-formed call in a random form, then cut, spliced,
    repeated or wrapped in chatter."""
    rng = random.Random(f"fuzz:{seed}")
    names = [t["function"]["name"] for t in tools] or ["tool"]
    return [_mutate(rng, _action(rng, tools, rng.choice(names + ["nope", "Click", "ANSWER"])))
            for _ in range(n)]


def _action(rng: random.Random, tools: list[dict], name: str) -> str:
    key = _first_param(tools, name) or rng.choice(["query", "x", ""])
    value = rng.choice(_VALUES)
    form = rng.randrange(7)
    if form == 0:
        return f"{name}[{value}]"
    if form == 1:
        return f"{name}({value})"
    if form == 2:
        return f"{name}({key}={value!r})"
    if form == 3:
        return name
    if form == 4:
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 80)))
    args = rng.choice([{key: rng.choice(_JSON_VALUES + [value])}, rng.choice(_JSON_VALUES)])
    obj = rng.choice([{"name": name, "arguments": args},
                      {"type": "function", "function": {"name": name, "parameters": args}},
                      {"name": name, "arguments": json.dumps(args)}, rng.choice(_JSON_VALUES)])
    text = json.dumps(obj)
    return f"<tool_call>{text}</tool_call>" if form == 5 else text


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(0, 3)):
        op = rng.randrange(5)
        cut = rng.randint(0, len(text))
        if op == 0:
            text = text[:cut]
        elif op == 1:
            text = text[:cut] + "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 8))) \
                + text[cut:]
        elif op == 2:
            text = text * rng.randint(2, 4)
        elif op == 3:
            text = rng.choice(_CHATTER) + text + rng.choice(_CHATTER)
        else:
            text = text[:cut] + rng.choice(_VALUES) + text[cut:]
    return text


def _first_param(tools: list[dict], name: str) -> str | None:
    for tool in tools:
        if tool["function"]["name"] == name:
            params = tool["function"].get("parameters", {})
            order = list(params.get("required", [])) or list(params.get("properties", {}))
            return order[0] if order else None
    return None
