"""Constrained calls in the env's own syntax (issue 20): a toy env whose demonstration writes
call syntax (`book(id="R012", day="friday", time="19:00", people=2)`) and has no grammar code
gets calls in that form, each argument a value; the built-in envs keep their grammars."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline_agent.envs.base import Env, StepResult, load_env, validate_call
from offline_agent.envs.parser import parse_form
from offline_agent.envs.testing.grammar_check import check_demo_grammar
from offline_agent.policy.grammar import tool_call_grammar
from offline_agent.policy.hf import HFPolicy
from offline_agent.types import Task
from tests.test_constrained import _fn, _sample_at, _states

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (make install)")

GOLDEN = Path(__file__).parent / "fixtures" / "builtin_grammars.json"
RESTAURANTS = {"R012": ("thai", "north"), "R017": ("thai", "south"), "R020": ("pizza", "north")}
S = {"type": "string"}


class Reservations(Env):
    """Four tools with JSON-schema arguments, a call-syntax demonstration, the default budget
    (48 tokens), no grammar code; ids narrowed per state to those `find` showed."""

    name = "reservations"
    tools = [
        _fn("find", {"cuisine": S, "area": S}, ["cuisine", "area"]),
        _fn("open", {"id": S}, ["id"]),
        _fn("book", {"id": S, "day": S, "time": S, "people": {"type": "integer"}},
            ["id", "day", "time", "people"]),
        _fn("done", {}, []),
    ]

    def tasks(self, split, n):
        return [Task(f"{split}-{i}", self.name, "book thai in the north for 2 on friday 19:00",
                     split, {}) for i in range(n)]

    def system_prompt(self):
        return "You book restaurant tables with tools."

    def demo_episode(self):
        return self.tasks("train", 1)[0], ['find(cuisine="thai", area="north")',
                                            'open(id="R012")',
                                            'book(id="R012", day="friday", time="19:00", people=2)']

    def _reset(self, task):
        self.state = {"shown": [], "booked": False}
        return "What would you like?"

    def action_tools(self):
        """After a find, `open` and `book` take only the ids it showed (an enum per state)."""
        if not self.state["shown"]:
            return [self.tools[0], self.tools[3]]
        narrowed = []
        for tool in self.tools:
            fn = tool["function"]
            props = {k: ({**v, "enum": self.state["shown"]} if k == "id" else v)
                     for k, v in fn["parameters"]["properties"].items()}
            narrowed.append({**tool, "function": {
                **fn, "parameters": {**fn["parameters"], "properties": props}}})
        return narrowed

    def _execute(self, call):
        args = call.arguments
        if call.name == "find":
            self.state["shown"] = [r for r, place in RESTAURANTS.items()
                                   if place == (args["cuisine"], args["area"])]
            return StepResult(f"found: {', '.join(self.state['shown']) or 'nothing'}")
        if call.name == "book":
            ok = (args["id"], args["day"], args["time"], args["people"]) == \
                ("R012", "friday", "19:00", 2)
            return StepResult("booked" if ok else "booked the wrong table", float(ok), True)
        return StepResult(f"opened {args.get('id')}", done=call.name == "done")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy.from_pretrained(tiny_model_dir, constrain="tools")


def test_the_demonstrated_syntax_is_detected_per_tool():
    env = Reservations()
    assert env.tool_syntax() == {"find": "call", "open": "call", "book": "call", "done": "call"}
    env.reset(env.tasks("test", 1)[0])
    assert [(t["function"]["name"], t["syntax"]) for t in env.call_tools()] == \
        [("find", "call"), ("done", "call")]


def test_without_a_demonstration_several_parameters_get_call_syntax():
    class Plain(Reservations):
        def demo_episode(self):
            return None

    assert Plain().tool_syntax() == {"find": "call", "open": "bracket", "book": "call",
                                     "done": "bare"}


def test_call_syntax_overrides_detection_and_names_bad_forms():
    class Chosen(Reservations):
        call_syntax = {"open": "json"}

    assert Chosen().tool_syntax()["open"] == "json"
    Chosen.call_syntax = {"open": "parens"}
    with pytest.raises(ValueError, match=r"call_syntax\['open'\] is 'parens'"):
        Chosen().tool_syntax()


def test_constrained_samples_are_calls_with_values_as_arguments(policy):
    """>= 200 samples of a random model at the demonstration's states: all parse, all in call
    syntax, every string argument a value (no quote in it, so no `", day="`), ids narrowed."""
    env = Reservations()
    states = _states(env, env.demo_episode()[1][:2])[:3]
    out = _sample_at(policy, env, states, 70, seed=11)
    texts = [c.text for cs in out for c in cs]
    assert len(texts) >= 200
    names = set()
    for snap, completions in zip(states, out):
        env.restore(snap)
        narrowed = env.action_tools()
        for c in completions:
            call, form = parse_form(c.text, env.tools)
            assert form == "call" and c.finish_reason == "stop", c.text
            assert c.text.startswith(f"{call.name}(") and c.text.endswith(")"), c.text
            validate_call(call, narrowed)
            for value in call.arguments.values():
                assert not (isinstance(value, str) and ('"' in value or "\\" in value)), c.text
            if "id" in call.arguments:
                assert call.arguments["id"] in env.state["shown"]
            names.add(call.name)
    assert names == {"find", "open", "book", "done"}
    assert len(set(texts)) > len(texts) // 4, "sampling should vary"


def test_the_default_budget_fits_a_four_argument_call(tokenizer):
    """48 tokens hold the grammar's longest steered close of `book` (one character a token),
    and the demonstrated call is far shorter under the embedded tokenizer."""
    env = Reservations()
    env.reset(env.tasks("train", 1)[0])
    env.act('find(cuisine="thai", area="north")')
    grammar = tool_call_grammar(env.call_tools(), 48, tuple(env.stop))
    assert grammar.horizon <= 48 - len("book(")
    book = env.demo_episode()[1][-1]
    assert len(tokenizer(book, add_special_tokens=False).input_ids) == 26  # and end-of-turn


def test_a_four_argument_call_is_written_without_a_forced_close(tokenizer):
    """The demonstrated `book(...)` call, fed token by token under the 48-token default, never
    has its row steered to close: each row's horizon is its own call's remaining bound (with
    one bound for any call, the row closed after `book(id="R0`, and a 135M model then wrote
    `day="}"`: every booking invalid)."""
    from offline_agent.policy.constrained import GrammarMasks

    env = Reservations()
    env.reset(env.tasks("train", 1)[0])
    env.act('find(cuisine="thai", area="north")')
    grammar = tool_call_grammar(env.call_tools(), 48, tuple(env.stop))
    masks = GrammarMasks(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    (row,) = masks.rows([grammar])
    book = env.demo_episode()[1][-1]
    ids = tokenizer(book, add_special_tokens=False).input_ids
    needs = []
    for used, token in enumerate(ids):
        needs.append(row.horizon())
        assert 48 - used > needs[-1], (used, tokenizer.decode(ids[:used]))
        masks.advance(row, token)
    assert needs == sorted(needs, reverse=True) and needs[0] > needs[-1]  # it only falls
    assert row.matcher.accept_token(tokenizer.eos_token_id)  # the call is complete


def test_a_call_that_cannot_fit_says_how_many_tokens_it_needs():
    tools = [{**Reservations.tools[2], "syntax": "call"}]
    with pytest.raises(ValueError, match=r"budget \(30\) is too small for a call of 'book': "
                                         r"it needs 45 tokens"):
        tool_call_grammar(tools, 30, ())


@pytest.mark.parametrize("name", ["minishop", "math", "python", "reservations"])
def test_the_demonstrations_actions_are_sentences_of_the_grammar(name):
    def make_env():
        return Reservations() if name == "reservations" else load_env(name)

    assert "are sentences of the grammar" in check_demo_grammar(make_env)


@pytest.mark.parametrize("form, actions", [
    ("call", ['find(cuisine="thai",area="north")', 'open(id="R012")',
              'book(id="R012",day="friday",time="19:00",people=2)']),
    ("json", ['{"name": "find", "arguments": {"cuisine": "thai", "area": "north"}}',
              '{"name": "open", "arguments": {"id": "R012"}}',
              '{"name": "book", "arguments": {"id": "R012", "day": "friday", "time": "19:00", '
              '"people": 2}}']),
    ("tag", ['<tool_call>{"name": "find", "arguments": {"cuisine": "thai", "area": "north"}}'
             '</tool_call>', '<tool_call>{"name": "open", "arguments": {"id": "R012"}}</tool_call>',
             '<tool_call>{"name": "book", "arguments": {"id": "R012", "day": "friday", '
             '"time": "19:00", "people": 2}}</tool_call>']),
])
def test_each_demonstrated_form_is_detected_and_accepted(form, actions):
    class Shown(Reservations):
        max_action_tokens = 128  # JSON's fixed text is long

        def demo_episode(self):
            return self.tasks("train", 1)[0], actions

    assert set(Shown().tool_syntax().values()) == {form}
    assert "are sentences of the grammar" in check_demo_grammar(Shown)


@pytest.mark.parametrize("key", sorted(json.loads(GOLDEN.read_text())))
def test_builtin_grammars_are_unchanged(key):
    """The grammars of MiniShop, math and Python, as captured before call syntax existed:
    their demonstrations use brackets, so their figures stay valid."""
    name, label = key.split("/")
    env = load_env(name)
    env.reset(env.tasks("test", 1)[0])
    if label in ("results", "item"):
        env.act("search[cotton shirt]")
    if label == "item":
        env.act(env.available_actions()[0])
    grammar = tool_call_grammar(env.call_tools(), env.max_action_tokens, tuple(env.stop))
    want = json.loads(GOLDEN.read_text())[key]
    assert (grammar.text, grammar.horizon, list(grammar.stop)) == \
        (want["text"], want["horizon"], want["stop"])


def test_a_demonstration_action_that_does_not_parse_shows_no_form():
    """Detection skips it (check-env reports it) instead of failing every constrained run."""
    from offline_agent.envs.base import Env, StepResult
    from offline_agent.types import Task

    class Garbled(Env):
        name = "garbled"
        tools = [{"type": "function", "function": {
            "name": "pick", "description": "pick two", "parameters": {
                "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
                "required": ["a", "b"]}}}]

        def tasks(self, split, n):
            return [Task(f"g-{split}-{i}", self.name, "pick", split) for i in range(n)]

        def system_prompt(self):
            return "pick(a=..., b=...)"

        def _reset(self, task):
            self.state = {}
            return "go"

        def _execute(self, call):
            return StepResult("ok", 1.0, True)

        def demo_episode(self):
            return self.tasks("train", 1)[0], ["I will pick now", 'pick(a="x", b="y")']

    assert Garbled().tool_syntax() == {"pick": "call"}
