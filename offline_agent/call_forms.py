"""The forms a tool call is written in, shared by the env parser that reads them
(envs/parser.py) and the grammar that makes a policy write them (policy/grammar.py), so
neither package imports the other for it.

  <tool_call>{...}</tool_call>    tag          {"name": ..., "arguments": {...}}  json
  search[red shirt]               bracket      book(id="R012", people=2)          call
  buy                             bare
"""

from __future__ import annotations

# the call forms, as constrained decoding names them: `<tool_call>` tags, JSON, `name[text]`,
# `name(key="v", n=2)` (or positional `name("v")`), a bare name
FORMS = ("tag", "json", "bracket", "call", "bare")
BRACKET_TYPES = ("string", "number", "integer")  # what bracket text reads back as written
MAX_ARGUMENT_CHARS = 2000  # longer arguments are refused as invalid actions


def default_form(spec: dict) -> str:
    """The form of a tool no demonstration shows: its bare name without parameters, bracket
    text for one parameter that bracket text reads back as written, else call syntax."""
    props = spec.get("parameters", {}).get("properties", {})
    if not props:
        return "bare"
    return "bracket" if len(props) == 1 and bracketable(next(iter(props.values()))) else "call"


def bracketable(schema: dict) -> bool:
    """Bracket text reads this parameter's values back as written (it strips whitespace)."""
    if "enum" in schema:
        return all(isinstance(v, str) and v == v.strip() and v for v in schema["enum"])
    return schema.get("type") in BRACKET_TYPES
