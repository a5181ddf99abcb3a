"""Tool specs -> an EBNF grammar of exactly one tool call, in the syntax the env parser reads.

Pure text in, text out: both backends compile the same string (hf with xgrammar's matcher,
vLLM with its structured outputs), so what one accepts the other accepts.

The call forms are those the envs' prompts and demonstrations show and `envs/parser.py` reads:
  buy                                          a tool without parameters: its bare name
  search[red shirt]   answer[84]              one string / number / integer parameter
  {"name": "book", "arguments": {...}}          anything else: JSON, keys in schema order
Argument values follow the JSON schema: types, `enum`s (how an env narrows a state's choices),
required keys. Free text is printable ASCII; bracket text starts with a character the parser
does not strip (so it is never empty) and may hold brackets (`xs[0]`): the call ends at a `]`
the policy follows with end-of-turn or with one of the env's stop strings, as an unconstrained
reply ends. So free text never holds a stop string: with "\n" no newline, with "\n\n" no blank
line (the two the envs use; `ENDINGS`). Other stop strings do not end a constrained reply.

Free text is unbounded in the grammar: xgrammar precomputes the token masks of a repeated
rule, but counts a bounded repetition at run time (a 49k-vocabulary scan, ~50 ms, per row and
step). The token budget is kept by the decoder instead: `horizon` is how many tokens, one
character each, the longest shortest way to finish a call takes from any point of it, so a row
that has that many tokens left is steered to close (policy/constrained.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from offline_agent.envs.base import MAX_ARGUMENT_CHARS

from .base import Sampling

DIGITS, DECIMALS = 15, 6  # the parser refuses numbers longer than 40 characters
BRACKET_TYPES = ("string", "number", "integer")
SCALAR_TYPES = (*BRACKET_TYPES, "boolean")
# the shortest value of each type in characters, and the most it may need to finish
SHORTEST = {"string": 3, "number": 2, "integer": 2, "boolean": 5}
# what ends a value, in the order a closing row prefers them: `]` is text inside bracket
# text and `"` inside JSON strings, so JSON strings leave `]` out
CLOSERS = ']"},'
ENDINGS = ("\n", "\n\n")  # stop strings free text can leave out, so they may end a call


@dataclass(frozen=True)
class CallGrammar:
    text: str  # EBNF, xgrammar's dialect
    horizon: int  # tokens that always suffice to finish the call from any point, end-of-turn included
    stop: tuple[str, ...] = ()  # stop strings that may follow the call and end the reply there
    max_chars: int = MAX_ARGUMENT_CHARS  # longest reply text: the env refuses longer arguments


def prompt_grammars(sampling: Sampling, num_prompts: int) -> list[CallGrammar | None]:
    """The grammar of each prompt's reply (None: free text), as both backends use them. The
    cache keys on what changes between states (the tools, narrowed or not), so a grammar is
    built once per distinct state, never per token."""
    if sampling.tools is None:
        return [None] * num_prompts
    if len(sampling.tools) != num_prompts:
        raise ValueError(f"{len(sampling.tools)} tool lists for {num_prompts} prompts")
    stop = tuple(sampling.stop)
    return [None if t is None else _cached(json.dumps(t), sampling.max_new_tokens, stop)
            for t in sampling.tools]


@functools.lru_cache(maxsize=4096)
def _cached(tools: str, budget: int, stop: tuple[str, ...]) -> CallGrammar:
    return tool_call_grammar(json.loads(tools), budget, stop)


def tool_call_grammar(tools: list[dict], budget: int, stop: tuple[str, ...]) -> CallGrammar:
    """The grammar whose sentences are one call of one of `tools`, then optionally one of the
    `stop` strings in ENDINGS.

    budget: tokens the reply may take, end-of-turn included; a call that cannot fit is an
    error. stop: the env's stop strings; bracket text holds none of those in ENDINGS (in
    MiniShop, "\n", it stays on one line; in the Python env, "\n\n", code has no blank line).
    """
    if not tools:
        raise ValueError("constrained decoding needs at least one tool to call")
    endings = tuple(s for s in ENDINGS if s in stop)
    rules: list[str] = []
    shapes = [_call(t["function"], i, endings, rules) for i, t in enumerate(tools)]
    horizon = 1 + max(closing for _, _, closing in shapes)
    for tool, (_, least, _) in zip(tools, shapes):  # closing must start past the fixed text
        if least + horizon > budget:
            raise ValueError(f"the token budget ({budget}) is too small for a call of "
                             f"{tool['function']['name']!r}: raise the env's max_action_tokens")
    root = f"root ::= ({' | '.join(r for r, _, _ in shapes)})"
    if endings:
        root += f" ({' | '.join(_lit(s) for s in endings)})?"
    return CallGrammar("\n".join([root, *rules]) + "\n", horizon, endings)


def _call(spec: dict, i: int, endings: tuple[str, ...], rules: list[str]) -> tuple[str, int, int]:
    """One tool's call: (rule name, characters before its free parts, characters that finish
    it from inside); its rules are appended to `rules`."""
    name, props = spec["name"], spec.get("parameters", {}).get("properties", {})
    for key, schema in props.items():
        if "enum" not in schema and schema.get("type") not in SCALAR_TYPES:
            raise ValueError(f"constrain=tools supports string, number, integer, boolean and "
                             f"enum parameters; {name}.{key} has type {schema.get('type')!r}")
    rule = f"call{i}"
    if not props:
        rules.append(f"{rule} ::= {_lit(name)}")
        return rule, len(name), 0
    schema = next(iter(props.values()))
    if len(props) == 1 and _bracketable(schema):
        value = _value(schema, f"{rule}v", rules, bracket=True, endings=endings)
        rules.append(f"{rule} ::= {_lit(name + '[')} {value} {_lit(']')}")
        return rule, len(name) + 1, _finish(schema, bracket=True) + 1
    return _json_call(spec, rule, rules)


def _bracketable(schema: dict) -> bool:
    if "enum" in schema:
        return all(isinstance(v, str) and v == v.strip() and v for v in schema["enum"])
    return schema.get("type") in BRACKET_TYPES


def _finish(schema: dict, bracket: bool) -> int:
    """Most characters that finish a value of this schema from inside it."""
    if "enum" in schema:
        return max(len(v if bracket else json.dumps(v)) for v in schema["enum"])
    return SHORTEST[schema["type"]] - (1 if bracket and schema["type"] == "string" else 0)


def _json_call(spec: dict, rule: str, rules: list[str]) -> tuple[str, int, int]:
    """`{"name": "x", "arguments": {...}}`: required keys in schema order, optional ones may
    be left out."""
    params = spec.get("parameters", {})
    props, required = params.get("properties", {}), set(params.get("required", []))
    head = f'{{"name": {json.dumps(spec["name"])}, "arguments": {{'
    keys = list(props)
    # {rule}o{j}f / {rule}o{j}m: the members from key j on, as the first one or after a comma
    rules += [f'{rule}o{len(keys)}f ::= ""', f'{rule}o{len(keys)}m ::= ""']
    for j in reversed(range(len(keys))):
        value = _value(props[keys[j]], f"{rule}v{j}", rules, bracket=False)
        member = f"{_lit(json.dumps(keys[j]) + ': ')} {value}"
        first, more = f"{member} {rule}o{j + 1}m", f"{_lit(', ')} {member} {rule}o{j + 1}m"
        if keys[j] not in required:
            first, more = f"{first} | {rule}o{j + 1}f", f"{more} | {rule}o{j + 1}m"
        rules += [f"{rule}o{j}f ::= {first}", f"{rule}o{j}m ::= {more}"]
    rules.append(f"{rule} ::= {_lit(head)} {rule}o0f {_lit('}}')}")
    # from inside any member: finish its value, then the other members with shortest values
    members = sum(len(json.dumps(k)) + 4 + _finish(props[k], bracket=False) for k in keys)
    closing = max(_finish(s, bracket=False) for s in props.values()) + members + 2
    return rule, len(head), closing


def _value(schema: dict, rule: str, rules: list[str], bracket: bool,
           endings: tuple[str, ...] = ()) -> str:
    """The EBNF of one argument value, as bracket text or as JSON."""
    if "enum" in schema:
        values = schema["enum"] if bracket else [json.dumps(v) for v in schema["enum"]]
        if not values:
            raise ValueError(f"an enum without values in a tool schema ({rule})")
        return "(" + " | ".join(_lit(str(v)) for v in values) + ")"
    kind = schema["type"]
    if kind == "integer":
        return f'"-"? [0-9]{{1,{DIGITS}}}'
    if kind == "number":
        return f'"-"? [0-9]{{1,{DIGITS}}} ("." [0-9]{{1,{DECIMALS}}})?'
    if kind == "boolean":
        return '("true" | "false")'
    if not bracket:  # printable ASCII but quote, backslash and `]` (see CLOSERS): no escapes
        rules.append(f'{rule} ::= [ !#-\\[] | "^" | [_-~]')
        return f'"\\"" {rule} {rule}* "\\""'
    # the repeated item is one flat alternation: xgrammar compiles a repeated bare character
    # class into one state per character (seconds), and a repeated rule that refers to another
    # rule costs a vocabulary scan per step (~30 ms); a flat alternation costs microseconds
    chars = ['[ -Z\\\\^-~\\t]', '"["', '"]"']  # one character, not a newline
    last = ""
    if "\n\n" in endings and "\n" not in endings:  # no blank line: a newline, then a character
        chars += ['"\\n" ' + c for c in chars]
        last = ' "\\n"?'  # or the `]` that ends the call
    elif "\n" not in endings:
        chars.append('"\\n"')
    rules.append(f"{rule}c ::= {' | '.join(chars)}")
    rules.append(f"{rule} ::= [!#-&(-Z\\\\^-_a-~] {rule}c*{last}")
    return rule


def _lit(text: str) -> str:
    """An EBNF string literal."""
    return json.dumps(text)
