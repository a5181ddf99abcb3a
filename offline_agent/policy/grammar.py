"""Tool specs -> an EBNF grammar of exactly one tool call, in the syntax the env parser reads.

Pure text in, text out: both backends compile the same string (hf with xgrammar's matcher,
vLLM with its structured outputs), so what one accepts the other accepts.

Each tool is called in its form (the spec's "syntax", one of `call_forms.FORMS`, which
`Env.call_tools` sets from the env's demonstration; without it `call_forms.default_form`), so the
parser reads back exactly what was written:
  buy                                          bare: a tool without required parameters
  search[red shirt]   answer[84]              bracket: one string / number / integer parameter
  book(id="R012", day="friday", people=2)      call: Python literals, keys in schema order
  {"name": "book", "arguments": {...}}          json (and the same in <tool_call> tags: tag)
Argument values follow the JSON schema: types, `enum`s (how an env narrows a state's choices),
required keys; optional keys may be left out. A quoted string holds no quote, backslash or
`]`, so no value holds its form's separators (`", day="`). Free text is printable ASCII; bracket text starts with a character the parser
does not strip (so it is never empty) and may hold brackets (`xs[0]`): the call ends at a `]`
the policy follows with end-of-turn or with one of the env's stop strings, as an unconstrained
reply ends. So free text never holds a stop string: with "\n" no newline, with "\n\n" no blank
line (the two the envs use; `ENDINGS`). Other stop strings do not end a constrained reply.

Free text is unbounded in the grammar: xgrammar precomputes the token masks of a repeated
rule, but counts a bounded repetition at run time (a 49k-vocabulary scan, ~50 ms, per row and
step). The token budget is kept by the decoder instead: `horizon` is how many tokens, one
character each, the longest shortest way to finish a call takes from any point of it, and a
keyed call's `Closing` the tighter bound once its head is written; a row that has that many
tokens left is steered to close (policy/constrained.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from offline_agent.call_forms import (
    BRACKET_TYPES,
    FORMS,
    MAX_ARGUMENT_CHARS,
    bracketable,
    default_form,
)

from .base import Sampling

DIGITS, DECIMALS = 15, 6  # the parser refuses numbers longer than 40 characters
SCALAR_TYPES = (*BRACKET_TYPES, "boolean")
# the shortest value of each type in characters, and the most it may need to finish
SHORTEST = {"string": 3, "number": 2, "integer": 2, "boolean": 5}
# what ends a value, in the order a closing row prefers them: `]` is text inside bracket
# text and `"` inside quoted strings, so quoted strings leave `]` out; `)` ends call syntax
# and follows `}` so that bracket text closes as it always did
CLOSERS = ']"}),'
ENDINGS = ("\n", "\n\n")  # stop strings free text can leave out, so they may end a call


@dataclass(frozen=True)
class Closing:
    """How far a keyed call (call syntax, JSON, tag) is from its end, in characters (end-of-turn
    included), once its reply starts with `head`: `needs[2j]` from anywhere in member j,
    `needs[2j + 1]` once member j's value began. j counts the commas, and a value began when
    the member's key separator (`=`, or `:`) was written, both outside quoted values and past
    the `skip` commas and `skip_seps` separators the head holds (JSON's). Quoted values hold
    no quote, so counting is exact; `needs` never rises, so a row that was not closing one
    step ago has the tokens to close from where it is."""

    head: str
    needs: tuple[int, ...]
    skip: int = 0
    skip_seps: int = 0

    def need(self, commas: int, seps: int) -> int:
        j = max(commas - self.skip, 0)
        began = seps - self.skip_seps > j
        return self.needs[min(2 * j + began, len(self.needs) - 1)]


@dataclass(frozen=True)
class CallGrammar:
    text: str  # EBNF, xgrammar's dialect
    horizon: int  # tokens that always suffice to finish the call from any point, end-of-turn included
    stop: tuple[str, ...] = ()  # stop strings that may follow the call and end the reply there
    max_chars: int = MAX_ARGUMENT_CHARS  # longest reply text: the env refuses longer arguments
    # per keyed tool: the tighter horizon once its call has begun (a 4-argument call's worst
    # case from its first member would otherwise steer it closed from its third token)
    closings: tuple[Closing, ...] = ()


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
    closings: list[Closing] = []
    shapes = [_call(t, i, endings, rules, closings) for i, t in enumerate(tools)]
    horizon = 1 + max(closing for _, _, closing in shapes)
    for tool, (_, least, closing) in zip(tools, shapes):  # closing starts past the fixed text
        if least + 1 + closing > budget:
            raise ValueError(f"the token budget ({budget}) is too small for a call of "
                             f"{tool['function']['name']!r}: it needs {least + 1 + closing} "
                             f"tokens (its fixed text, then its steered close, one character "
                             f"a token); raise the env's max_action_tokens")
    root = f"root ::= ({' | '.join(r for r, _, _ in shapes)})"
    if endings:
        root += f" ({' | '.join(_lit(s) for s in endings)})?"
    return CallGrammar("\n".join([root, *rules]) + "\n", horizon, endings,
                       closings=tuple(closings))


def _call(tool: dict, i: int, endings: tuple[str, ...], rules: list[str],
          closings: list[Closing]) -> tuple[str, int, int]:
    """One tool's call in its form (the tool's "syntax", `Env.tool_syntax`; without one,
    `call_forms.default_form`): (rule name, characters before its free parts, characters that
    finish it from inside); its rules are appended to `rules`."""
    spec = tool["function"]
    name, props = spec["name"], spec.get("parameters", {}).get("properties", {})
    for key, schema in props.items():
        if "enum" not in schema and schema.get("type") not in SCALAR_TYPES:
            raise ValueError(f"constrain=tools supports string, number, integer, boolean and "
                             f"enum parameters; {name}.{key} has type {schema.get('type')!r}")
    form, rule = tool.get("syntax") or default_form(spec), f"call{i}"
    if form == "bare":
        if spec.get("parameters", {}).get("required"):
            raise ValueError(f"{name} has required parameters: it cannot be called by its bare name")
        rules.append(f"{rule} ::= {_lit(name)}")
        return rule, len(name), 0
    if form == "bracket":
        schema = next(iter(props.values()), None)
        if len(props) != 1 or not bracketable(schema):
            raise ValueError(f"{name} cannot be called as {name}[...]: bracket text fills one "
                             f"string, number, integer or enum parameter")
        value = _value(schema, f"{rule}v", rules, form, endings=endings)
        rules.append(f"{rule} ::= {_lit(name + '[')} {value} {_lit(']')}")
        return rule, len(name) + 1, _finish(schema, form) + 1
    if form not in ("call", "json", "tag"):
        raise ValueError(f"unknown call syntax {form!r} for {name}: use one of {FORMS}")
    return _keyed_call(spec, rule, rules, form, closings)


def _finish(schema: dict, form: str) -> int:
    """Most characters that finish a value of this schema from inside it."""
    if "enum" in schema:
        return max(len(_enum_text(v, form)) for v in schema["enum"])
    return SHORTEST[schema["type"]] - (1 if form == "bracket" and schema["type"] == "string" else 0)


def _keyed_call(spec: dict, rule: str, rules: list[str], form: str,
                closings: list[Closing]) -> tuple[str, int, int]:
    """`name(key="v", n=2)`, `{"name": "x", "arguments": {...}}` or the same JSON in
    `<tool_call>` tags: required keys in schema order, optional ones may be left out; members
    separated by `, ` or `,` (as a demonstration may write them)."""
    params = spec.get("parameters", {})
    props, required = params.get("properties", {}), set(params.get("required", []))
    name = spec["name"]
    head, tail, key_text = {
        "call": (f"{name}(", ")", "{}="),
        "json": (f'{{"name": {json.dumps(name)}, "arguments": {{', "}}", '"{}": '),
        "tag": (f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {{', "}}</tool_call>",
                '"{}": '),
    }[form]
    keys = list(props)
    # {rule}o{j}f / {rule}o{j}m: the members from key j on, as the first one or after a comma
    rules += [f'{rule}o{len(keys)}f ::= ""', f'{rule}o{len(keys)}m ::= ""']
    for j in reversed(range(len(keys))):
        value = _value(props[keys[j]], f"{rule}v{j}", rules, form)
        member = f"{_lit(key_text.format(keys[j]))} {value}"
        first, more = f"{member} {rule}o{j + 1}m", f'"," " "? {member} {rule}o{j + 1}m'
        if keys[j] not in required:
            first, more = f"{first} | {rule}o{j + 1}f", f"{more} | {rule}o{j + 1}m"
        rules += [f"{rule}o{j}f ::= {first}", f"{rule}o{j}m ::= {more}"]
    rules.append(f"{rule} ::= {_lit(head)} {rule}o0f {_lit(tail)}")
    needs = [n + len(tail) for n in _closing(props, required, key_text, form)] or [len(tail)]
    needs = [1 + max(needs[i:]) for i in range(len(needs))]  # never rising; end-of-turn
    sep = "=" if form == "call" else ":"
    closings.append(Closing(head, tuple(needs), head.count(","), head.count(sep)))
    return rule, len(head), needs[0] - 1


def _closing(props: dict, required: set[str], key_text: str, form: str) -> list[int]:
    """For each member j, the most characters that finish the members from anywhere in it,
    then from inside its value: the rest of member j, then the members up to the last
    required one (a closing row writes `)` or `}` where it may, but a `,` before a required
    key lets the model write the optional keys before it)."""
    keys = list(props)
    cost = [2 + len(key_text.format(k)) + _finish(props[k], form) for k in keys]
    last = max((j for j, k in enumerate(keys) if k in required), default=-1)
    out = []
    for j, k in enumerate(keys):
        rest = sum(cost[j + 1:last + 1])
        out += [cost[j] + rest, _finish(props[k], form) + rest]
    return out


def _value(schema: dict, rule: str, rules: list[str], form: str,
           endings: tuple[str, ...] = ()) -> str:
    """The EBNF of one argument value: bracket text, a Python literal (call syntax) or JSON."""
    if "enum" in schema:
        if not schema["enum"]:
            raise ValueError(f"an enum without values in a tool schema ({rule})")
        return "(" + " | ".join(_lit(_enum_text(v, form)) for v in schema["enum"]) + ")"
    kind = schema["type"]
    if form == "bracket" and kind in ("integer", "number"):
        return f'"-"? [0-9]{{1,{DIGITS}}}' + (
            f' ("." [0-9]{{1,{DECIMALS}}})?' if kind == "number" else "")
    if kind in ("integer", "number"):  # no leading zeros: Python and JSON refuse them
        whole = f'"-"? ("0" | [1-9] [0-9]{{0,{DIGITS - 1}}})'
        return whole + (f' ("." [0-9]{{1,{DECIMALS}}})?' if kind == "number" else "")
    if kind == "boolean":
        return '("True" | "False")' if form == "call" else '("true" | "false")'
    if form != "bracket":  # printable ASCII but quote, backslash and `]` (see CLOSERS): no
        # escapes, so a value never holds its form's separators (`", key=`, `", "`)
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


def _enum_text(value, form: str) -> str:
    """An enum value as its form writes it: as is in brackets, a Python literal in call
    syntax (`"R012"`, `True`), JSON otherwise."""
    if form == "bracket":
        return str(value)
    if form == "call" and (isinstance(value, bool) or value is None):
        return repr(value)
    return json.dumps(value)


def _lit(text: str) -> str:
    """An EBNF string literal."""
    return json.dumps(text)
