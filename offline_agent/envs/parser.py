"""Model text -> ToolCall, tolerant of the forms small models actually write.

Accepted, wherever they start in the text (the earliest one wins, chatter is ignored):
  search[red shirt]   buy[]   calculate[3*4]       bracket: text -> first required parameter
  buy                                              a bare name alone on the first line
  {"name": "search", "arguments": {"query": "x"}}  JSON (arguments may be a JSON string)
  <tool_call>{...}</tool_call>                     Qwen/Hermes chat-template calls
  search(query="x")   search("x")   calculate(3*4) call syntax
Tool names match case-insensitively; number-typed parameters given as text are converted.
Anything else raises ActionError with a message meant to be shown to the model.

`parse_form` also says which of the FORMS (offline_agent/call_forms.py) a call was written in: an env's demonstration tells
constrained decoding which form to write per tool (`Env.tool_syntax`, policy/grammar.py).
"""

from __future__ import annotations

import ast
import itertools
import json
import math
import re
import textwrap
from typing import Any

from offline_agent.call_forms import FORMS
from offline_agent.envs.errors import ActionError, NoToolCall, short
from offline_agent.types import ToolCall

_LABEL = re.compile(r"^\s*(?:action|act)\s*\d*\s*:\s*", re.IGNORECASE)
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_LEADING_CALL = re.compile(r"\s*([A-Za-z_]\w*)[\[(]")  # text that starts like name[...]
# bounds on the JSON search, so hostile text costs milliseconds: the first few candidates,
# each read from a window far longer than any call with arguments below the length cap
_JSON_TRIES, _JSON_WINDOW = 16, 20_000
_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL | re.IGNORECASE)

Found = tuple[int, "ToolCall | ActionError"]  # (position in text, call or the reason it is bad)


def parse_action(text: str, tools: list[dict]) -> ToolCall:
    """The first tool call in `text`, with arguments converted to the schema's types."""
    return parse_form(text, tools)[0]


def parse_form(text: str, tools: list[dict]) -> tuple[ToolCall, str]:
    """parse_action's call, and which of FORMS it was written in."""
    specs = {t["function"]["name"].lower(): t["function"] for t in tools}
    if not text or not text.strip():
        raise NoToolCall(f"empty action; write one of: {_usage(specs)}")
    finders = (_find_tag, _find_json, _find_bracket, _find_paren, _find_bare)
    found = [
        (*f, form)
        for form, finder in zip(FORMS, finders)
        if (f := finder(text, specs)) is not None
    ]
    if not found:
        unknown = _LEADING_CALL.match(_LABEL.sub("", text))
        if unknown:
            raise ActionError(
                f"unknown tool {short(unknown.group(1))!r}; available: {_available(specs)}"
            )
        raise NoToolCall(f"no tool call found; write one of: {_usage(specs)}")
    _, result, form = min(found, key=lambda f: f[0])
    if isinstance(result, ActionError):
        raise result
    return _coerce(result, specs[result.name.lower()]), form


# ---- finders: each returns the earliest match of its form, or None ---------------------------


def _find_tag(text: str, specs: dict) -> Found | None:
    m = _TAG.search(text)
    if m is None:
        return None
    try:
        obj = json.loads(m.group(1).strip())
    except json.JSONDecodeError as e:
        return m.start(), ActionError(f"invalid JSON in <tool_call>: {e.msg} at char {e.pos}")
    except ValueError as e:  # an integer of more than 4,300 digits
        return m.start(), ActionError(f"invalid JSON in <tool_call>: {short(str(e), 80)}")
    except RecursionError:
        return m.start(), ActionError("JSON in <tool_call> is nested too deeply")
    return m.start(), _from_json(obj, specs)


def _find_json(text: str, specs: dict) -> Found | None:
    decoder = json.JSONDecoder()
    starts = itertools.islice(re.finditer(r'\{\s*"', text), _JSON_TRIES)  # objects with a key
    for m in starts:
        try:
            obj, _ = decoder.raw_decode(text[m.start() : m.start() + _JSON_WINDOW])
        except (ValueError, RecursionError):  # JSONDecodeError, or an over-long integer
            continue
        if isinstance(obj, dict) and ("name" in obj or isinstance(obj.get("function"), dict)):
            return m.start(), _from_json(obj, specs)
    return None


def _find_bracket(text: str, specs: dict) -> Found | None:
    m = re.search(rf"(?<![\w.])({_names(specs)})[ \t]*\[", text, re.IGNORECASE)
    if m is None:
        return None
    spec = specs[m.group(1).lower()]
    end = _closing(text, m.end() - 1, "[", "]")
    if end is None:
        return m.start(), ActionError(f"{spec['name']}[ is missing its closing ']'")
    return m.start(), _from_text(spec, text[m.end() : end])


def _find_paren(text: str, specs: dict) -> Found | None:
    m = re.search(rf"(?<![\w.])({_names(specs)})\(", text, re.IGNORECASE)
    if m is None:
        return None
    spec = specs[m.group(1).lower()]
    end = _closing(text, m.end() - 1, "(", ")")
    if end is None:
        return m.start(), ActionError(f"{spec['name']}( is missing its closing ')'")
    inner = text[m.end() : end]
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    except (SyntaxError, ValueError, TypeError, RecursionError):  # calculate(3*4): text as is
        return m.start(), _from_text(spec, inner)
    order = _required(spec) or list(_properties(spec))
    if len(args) > len(order):
        return m.start(), ActionError(
            f"{spec['name']} takes {len(order)} argument(s), got {len(args)}"
        )
    return m.start(), ToolCall(spec["name"], {**dict(zip(order, args)), **kwargs})


def _find_bare(text: str, specs: dict) -> Found | None:
    """A tool name alone on the first non-empty line ("buy", "Action: buy.")."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("```")]
    if not lines:
        return None
    word = _LABEL.sub("", lines[0]).strip().strip("`'\".").strip().lower()
    spec = specs.get(word)
    if spec is None:
        return None
    pos = text.index(lines[0])
    if _required(spec):
        return pos, ActionError(f"{spec['name']} needs an argument: write {_usage({word: spec})}")
    return pos, ToolCall(spec["name"], {})


# ---- builders ---------------------------------------------------------------------------------


def _from_json(obj: Any, specs: dict) -> ToolCall | ActionError:
    if not isinstance(obj, dict):
        return ActionError(f"a tool call must be a JSON object, got {type(obj).__name__}")
    if isinstance(obj.get("function"), dict):  # OpenAI style {"type": "function", "function": ...}
        obj = obj["function"]
    name = obj.get("name")
    if not isinstance(name, str) or name.lower() not in specs:
        shown = short(name) if isinstance(name, str) else type(name).__name__
        return ActionError(f"unknown tool {shown!r}; available: {_available(specs)}")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ActionError(f"arguments of {name} are not valid JSON: {e.msg}")
        except ValueError as e:  # an integer of more than 4,300 digits
            return ActionError(f"arguments of {name} are not valid JSON: {short(str(e), 80)}")
        except RecursionError:
            return ActionError(f"arguments of {name} are nested too deeply")
    if not isinstance(args, dict):
        return ActionError(f"arguments of {name} must be a JSON object, got {type(args).__name__}")
    return ToolCall(specs[name.lower()]["name"], args)


def _from_text(spec: dict, raw: str) -> ToolCall | ActionError:
    """Bracket text goes to the first required parameter (or nowhere for a parameterless tool)."""
    props = _properties(spec)
    if not props:
        return ToolCall(spec["name"], {})
    key = (_required(spec) or list(props))[0]
    value = _clean(raw)
    if not value:
        return ActionError(f"{spec['name']}[] is empty: put the {key} inside the brackets")
    return ToolCall(spec["name"], {key: value})


def _clean(raw: str) -> str:
    """Strip whitespace, code fences and one pair of quotes; dedent multi-line (code) text."""
    stripped = raw.strip()
    if stripped.startswith("```") and stripped.endswith("```") and "\n" in stripped:
        raw = stripped[3:-3].split("\n", 1)[1]  # drop the fences and the language tag
    if "\n" in raw.strip():
        return textwrap.dedent(raw.strip("\n")).rstrip()
    value = raw.strip().strip("`").strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1].strip()
    return value


def _coerce(call: ToolCall, spec: dict) -> ToolCall:
    """Text given for a number/integer parameter becomes a number ("84", "$1,200", "2.5")."""
    props = _properties(spec)
    args = dict(call.arguments)
    for key, value in args.items():
        kind = props.get(key, {}).get("type")
        if kind in ("number", "integer") and isinstance(value, str):
            text = value.strip().lstrip("$").replace(",", "")
            if len(text) > 40 or not _NUMBER.fullmatch(text):
                raise ActionError(f"{call.name}.{key} must be a number, got {value[:40]!r}")
            if text.lstrip("+-").isdigit():
                args[key] = int(text)
                continue
            number = float(text)
            if not math.isfinite(number) or (kind == "integer" and not number.is_integer()):
                raise ActionError(f"{call.name}.{key} must be a finite {kind}, got {value[:40]!r}")
            args[key] = int(number) if kind == "integer" else number
    return ToolCall(call.name, args)


# ---- helpers ----------------------------------------------------------------------------------


def _closing(text: str, open_idx: int, open_ch: str, close_ch: str) -> int | None:
    """Index of the bracket closing text[open_idx].

    Depth counting that skips quoted strings closed on the same line (so code such as
    s.split("]") works, while an apostrophe in "men's" stays a letter); if the brackets
    never balance, the last close_ch in the text. Linear: once a quote finds no partner
    before the end of its line, no later quote of that kind on the line can, so they are
    letters without another scan.
    """
    depth, i = 0, open_idx
    unclosed = {"'": -1, '"': -1}  # quote -> end of the line on which it finds no partner
    while i < len(text):
        ch = text[i]
        if ch in unclosed and i >= unclosed[ch]:
            j = _string_end(text, i)
            if j is not None:
                i = j + 1
                continue
            line_end = text.find("\n", i)
            unclosed[ch] = len(text) if line_end == -1 else line_end
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    last = text.rfind(close_ch, open_idx + 1)
    return last if last != -1 else None


def _string_end(text: str, start: int) -> int | None:
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != "\n":
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i
        i += 1
    return None


def _available(specs: dict) -> str:
    return ", ".join(s["name"] for s in specs.values())


def _names(specs: dict) -> str:
    return "|".join(re.escape(name) for name in sorted(specs, key=len, reverse=True))


def _properties(spec: dict) -> dict:
    return spec.get("parameters", {}).get("properties", {})


def _required(spec: dict) -> list[str]:
    return list(spec.get("parameters", {}).get("required", []))


def _usage(specs: dict) -> str:
    forms = []
    for spec in specs.values():
        params = _required(spec) or list(_properties(spec))
        forms.append(f"{spec['name']}[{params[0]}]" if params else spec["name"])
    return ", ".join(forms)
