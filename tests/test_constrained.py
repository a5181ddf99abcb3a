"""Grammar-constrained tool calls (model.constrain: tools) on a tiny random-init model: every
sampled reply parses and validates, on every built-in env and on a toy env with its own tools
and no grammar code; per-state narrowing; free-text rows unchanged bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from offline_agent.envs.base import ActionError, Env, StepResult, load_env, validate_call
from offline_agent.envs.parser import parse_action
from offline_agent.policy import Sampling
from offline_agent.policy.grammar import prompt_grammars, tool_call_grammar
from offline_agent.policy.hf import HFPolicy
from offline_agent.rollout import action_sampling, run_episodes
from offline_agent.types import Task, ToolCall

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

pytest.importorskip("xgrammar", reason="constrained decoding needs xgrammar (make install)")


def _fn(name: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": name,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


class Bookings(Env):
    """A third-party env: four tools with JSON-schema arguments, no grammar code of its own."""

    name = "bookings"
    max_action_tokens = 128
    tools = [
        _fn("find", {"cuisine": {"type": "string"}, "city": {"type": "string"}}, ["cuisine"]),
        _fn("book", {"restaurant": {"type": "string"}, "party": {"type": "integer"},
                     "time": {"type": "string", "enum": ["18:00", "19:30", "21:00"]},
                     "terrace": {"type": "boolean"}}, ["restaurant", "party", "time"]),
        _fn("tip", {"percent": {"type": "number"}}, ["percent"]),
        _fn("done", {}, []),
    ]

    def tasks(self, split, n):
        return [Task(f"book-{i}", self.name, f"book a table for {i + 2}", split, {})
                for i in range(n)]

    def system_prompt(self):
        return "You book restaurant tables with tools."

    def _reset(self, task):
        self.state = {}
        return "What would you like?"

    def _execute(self, call):
        return StepResult(f"ok: {call.name}", done=call.name == "done")


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return HFPolicy.from_pretrained(tiny_model_dir, constrain="tools")


def _states(env: Env, actions: list[str]) -> list[bytes]:
    """Snapshots along a scripted episode: the states whose replies are sampled."""
    env.reset(env.tasks("test", 1)[0])
    out = [env.snapshot()]
    for text in actions:
        env.act(text)
        out.append(env.snapshot())
    return out


def _minishop_script(env) -> list[str]:
    env.reset(env.tasks("test", 1)[0])
    env.act("search[cotton shirt]")
    first = env.available_actions()[0]  # a product on the results page
    return ["search[cotton shirt]", first]


def _sample_at(policy, env: Env, states: list[bytes], per_state: int, seed: int):
    """Replies sampled at temperature 1 at each state, with the state's call_tools."""
    from offline_agent.chat import history_messages, render_prompt

    prompts, tools = [], []
    for snap in states:
        env.restore(snap)
        messages = history_messages(env.system_prompt(), env.task.instruction, "start", [],
                                    env.demonstration())
        prompts.append(render_prompt(policy.tokenizer, messages))
        tools.append(env.call_tools())
    sampling = action_sampling(env, 1.0, seed, tools)
    return policy.sample(prompts, per_state, sampling)


@pytest.mark.parametrize("env_name", ["minishop", "math", "python", "bookings"])
def test_every_sampled_action_parses_and_validates(policy, env_name):
    env = Bookings() if env_name == "bookings" else load_env(env_name)
    # a random model's calls run to the token budget, where the grammar steers them closed:
    # python's 320-token budget takes ~20 s on 2 cores for 96 rows; the closing is the same at 96
    if env_name == "python":
        env.max_action_tokens = 96
    script = {"minishop": _minishop_script(env) if env_name == "minishop" else [],
              "bookings": ['find[thai]']}.get(env_name, [])
    states = _states(env, script)
    per_state = -(-96 // len(states))  # three full batches of 32: the grammar's every branch
    out = _sample_at(policy, env, states, per_state, seed=7)
    texts = [c.text for cs in out for c in cs]
    assert len(texts) >= 96
    for cs in out:
        for c in cs:
            call = parse_action(c.text, env.tools)  # raises ActionError if it does not parse
            validate_call(call, env.tools)
            assert c.constrained and c.finish_reason == "stop"
            # the turn ended after the call: at end-of-turn or at a stop string, cut off
            assert not any(s in c.text for s in env.stop)
    assert len(set(texts)) > len(texts) // 4, "sampling should vary"


@pytest.mark.parametrize("env_name", ["python", "math"])
def test_a_model_that_ends_its_turn_inside_a_call_gets_the_call_closed(tiny_model_dir, env_name):
    """Where the model would stop (end-of-turn) inside bracket text, the decoder closes the
    call there, as the Python env reads a free reply that stops inside a call: a short valid
    call, not text run on to the token budget (320 tokens in the Python env)."""
    policy = HFPolicy.from_pretrained(tiny_model_dir, constrain="tools")
    bias = torch.zeros(policy.model.get_output_embeddings().weight.shape[0])
    bias[policy.tokenizer.eos_token_id] = 1e4  # end-of-turn is always the model's choice
    policy.model.get_output_embeddings().register_forward_hook(lambda m, i, out: out + bias)
    env = load_env(env_name)
    out = _sample_at(policy, env, _states(env, []), 8, seed=0)[0]
    for c in out:
        validate_call(parse_action(c.text, env.tools), env.tools)
        assert c.token_ids[-1] == policy.tokenizer.eos_token_id
        assert len(c.token_ids) < 40, c.text


@pytest.mark.parametrize("form", ["call", "json"])
def test_toy_env_calls_book_in_its_form_with_schema_types(policy, form):
    """Without a demonstration a tool of several parameters gets call syntax (issue 20; JSON
    before it), and JSON where the env's call_syntax names it."""
    env = Bookings()
    if form == "json":
        env.call_syntax = {"book": "json"}
    out = _sample_at(policy, env, _states(env, []), 60, seed=3)
    calls = [parse_action(c.text, env.tools) for c in out[0]]
    assert {c.name for c in calls} >= {"find", "book", "tip", "done"}
    for c, text in zip(calls, (c.text for c in out[0])):
        if c.name == "book":
            if form == "json":
                assert text.startswith("{") and json.loads(text)["name"] == "book"
            else:
                assert text.startswith("book(") and text.endswith(")")
            assert isinstance(c.arguments["party"], int)
            assert c.arguments["time"] in ("18:00", "19:30", "21:00")
        if c.name == "done":
            assert text == "done"


def test_minishop_narrowing_clicks_only_listed_links(policy):
    env = load_env("minishop")
    states = _states(env, _minishop_script(env))  # search page, results page, product page
    out = _sample_at(policy, env, states, 40, seed=5)
    names = []
    for snap, cs in zip(states, out):
        env.restore(snap)
        listed = env.available_actions()
        for c in cs:
            env.restore(snap)
            call, result = env.act(c.text)
            assert not result.invalid, (c.text, result.observation)
            names.append((snap, call.name))
            if call.name == "click":
                assert f"click[{call.arguments['target']}]" in listed
    assert {n for s, n in names if s == states[0]} == {"search"}  # nothing to click there
    assert "click" in {n for s, n in names if s == states[1]}
    assert "buy" not in {n for s, n in names if s == states[1]}  # no product open


def test_free_text_rows_are_unchanged_bit_for_bit(policy, tiny_model_dir):
    """A constrained policy's calls without tools equal the unconstrained policy's output bit
    for bit (ids and log-probs). Beside constrained rows, a free row draws the same tokens
    (its log-probs agree to float noise: rows that finish earlier change the batch shape)."""
    plain = HFPolicy(policy.model, policy.tokenizer)
    prompts = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
               "<|im_start|>user\nfind a red shirt<|im_end|>\n<|im_start|>assistant\n"]
    env = load_env("math")
    for temperature in (0.0, 1.0):
        free = Sampling(max_new_tokens=12, temperature=temperature, seed=2)
        expected = plain.sample(prompts, 2, free)
        mixed = Sampling(max_new_tokens=48, temperature=temperature, seed=2,
                         tools=[None, env.tools])
        got = policy.sample(prompts, 2, free)
        assert [[(c.token_ids, c.logprobs) for c in cs] for cs in got] == \
               [[(c.token_ids, c.logprobs) for c in cs] for cs in expected]
        both = policy.sample(prompts, 2, mixed)
        row = plain.sample(prompts, 2, Sampling(max_new_tokens=48, temperature=temperature,
                                                seed=2))
        for c, d in zip(both[0], row[0]):
            assert c.token_ids == d.token_ids
            assert c.logprobs == pytest.approx(d.logprobs, abs=1e-4)
        assert not any(c.constrained for c in both[0]) and all(c.constrained for c in both[1])


def test_logprobs_are_of_the_unconstrained_model(policy):
    """Stored log-probs are what DPO/RFT recompute: the raw model's, not the masked ones."""
    env = load_env("math")
    prompt = "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    (c,), = policy.sample([prompt], 1, action_sampling(env, 1.0, 4, [env.tools]))
    ids = policy.tokenizer(prompt, add_special_tokens=False).input_ids
    with torch.no_grad():
        logp = policy.model(torch.tensor([ids + c.token_ids])).logits[0].log_softmax(-1)
    manual = [logp[len(ids) - 1 + i, t].item() for i, t in enumerate(c.token_ids)]
    assert c.logprobs == pytest.approx(manual, abs=1e-4)
    assert sum(manual) < -1.0  # a random model puts little mass on any one call


def test_greedy_rollout_with_constraints_has_no_invalid_actions(policy):
    env = Bookings()
    trajectories = run_episodes(policy, Bookings, env.tasks("test", 3), temperature=0.0)
    assert all(not s.invalid for t in trajectories for s in t.steps)


def test_grammar_text_is_shared_and_cached():
    tools = load_env("minishop").tools
    sampling = Sampling(max_new_tokens=48, stop=["\n"], tools=[tools, None, tools])
    a, b, c = prompt_grammars(sampling, 3)
    assert b is None and a is c  # one build per distinct tool list
    assert a == tool_call_grammar(tools, 48, ("\n",))
    assert 'call2 ::= "buy"' in a.text and '"search["' in a.text
    assert a.horizon == 4  # a free character, "]", end-of-turn, and one to spare


@pytest.mark.parametrize("stop, text, accepted", [
    (("\n\n",), "submit[def f(x):\n    return [x]]", True),
    (("\n\n",), "submit[def f(x):\n    return [x]]\n\n", True),  # the stop string ends it
    (("\n\n",), "submit[def f(x):\n    return x\n]", True),  # a newline before the `]`
    (("\n\n",), "submit[def f(x):\n\n    return x]", False),  # a blank line inside the code
    (("\n\n",), "submit[def f(x):\n    return x]\n\nmore", False),
    (("\n",), "submit[def f(x):\n    return x]", False),  # one line where "\n" is a stop
    (("\n",), "submit[def f(x): return x]\n", True),
    ((), "submit[def f(x):\n\n    return x]", True),
    ((), "submit[def f(x): return x]\n", False),  # nothing may follow the call
])
def test_stop_strings_end_a_call_and_never_occur_inside_it(policy, stop, text, accepted):
    """A reply may end at the env's stop string right after the call (as a free reply does),
    so free text never holds one: the Python env's code has no blank line."""
    grammar = tool_call_grammar(load_env("python").tools, 320, stop)
    assert grammar.stop == stop
    matcher = policy.grammars.xgr.GrammarMatcher(
        policy.grammars.compiler.compile_grammar(grammar.text))
    ok = matcher.accept_string(text) and matcher.is_completed()
    assert ok == accepted


@pytest.mark.parametrize("tools, budget, message", [
    ([], 48, "at least one tool"),
    ([_fn("f", {"xs": {"type": "array"}}, ["xs"])], 48, "has type 'array'"),
    ([_fn("a_long_tool_name", {"q": {"type": "string"}}, ["q"])], 12, r"budget \(12\) is too small"),
    ([_fn("f", {"a": {"type": "string"}, "b": {"type": "integer"}}, ["a"])], 10,
     r"budget \(10\) is too small for a call of 'f': it needs 11 tokens"),  # f(a="x")
    ([{**_fn("f", {"a": {"type": "string"}, "b": {"type": "integer"}}, ["a"]), "syntax": "json"}],
     20, r"budget \(20\) is too small"),
    ([{**_fn("f", {"a": {"type": "string"}}, ["a"]), "syntax": "bare"}], 48, "required parameters"),
    ([{**_fn("f", {"a": {"type": "boolean"}}, ["a"]), "syntax": "bracket"}], 48,
     r"cannot be called as f\[...\]"),
    ([{**_fn("f", {}, []), "syntax": "parens"}], 48, "unknown call syntax 'parens'"),
])
def test_grammar_errors_are_clear(tools, budget, message):
    with pytest.raises(ValueError, match=message):
        tool_call_grammar(tools, budget, ("\n",))


def test_unconstrained_tools_are_ignored(tiny_model_dir):
    """constrain="none" ignores Sampling.tools: the output equals a call without them."""
    plain = HFPolicy.from_pretrained(tiny_model_dir)
    prompt = ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]
    tools = load_env("math").tools
    a = plain.sample(prompt, 2, Sampling(max_new_tokens=8, seed=1))
    b = plain.sample(prompt, 2, Sampling(max_new_tokens=8, seed=1, tools=[tools]))
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]
    assert not any(c.constrained for c in b[0])


def test_parse_errors_still_come_from_the_env():
    """Constraints live in the policy; the env still parses what it is given."""
    env = Bookings()
    env.reset(env.tasks("test", 1)[0])
    call, result = env.act("book a table please")
    assert call is None and result.invalid
    with pytest.raises(ActionError):
        validate_call(ToolCall("book", {"restaurant": "x"}), env.tools)


def test_search_asks_for_each_states_tools_and_grows_only_valid_children(policy):
    """MCTS passes the node's Env.action_tools() with every Sample; with a constrained policy
    no child of any expansion is an invalid action."""
    from offline_agent.search.config import SearchConfig
    from offline_agent.search.mcts import Tree
    from offline_agent.search.searcher import Searcher

    def make_env():
        return load_env("minishop", max_steps=4)

    cfg = SearchConfig(simulations=2, k=2, oversample=2, listed=0, max_depth=3, critic="none",
                       trees_per_batch=2)
    trees = [Tree.new(t, make_env()) for t in make_env().tasks("train", 2)]
    Searcher(policy, make_env, cfg).run(trees, lambda batch: None, progress=False)
    children = [n for t in trees for n in t.nodes if n.parent is not None]
    assert len(children) >= 4 and not any(n.invalid for n in children)


def test_config_accepts_tools_and_names_the_choices():
    from pipelines.config import ConfigError, ModelConfig

    assert ModelConfig(constrain="tools").constrain == "tools"
    with pytest.raises(ConfigError, match="none, tools"):
        ModelConfig(constrain="json")
