"""check-env's checks of constrained decoding (`model.constrain: tools`) on an env's tools:
the demonstration's actions are sentences of the grammar built at their states, and a tiny
random-init model sampling under that grammar writes only calls that parse, each in the form
the env's demonstration uses (`Env.tool_syntax`). A demonstration the grammar refuses is a
contradiction the user should hear about before a long run, not after it.

The tiny model is a 2-layer random Llama on the embedded model's tokenizer, built in-process
(seconds): what it writes is any sentence of the grammar, so it finds the calls a real model
might write that the parser would read otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from offline_agent.chat import history_messages, render_prompt
from offline_agent.envs.base import ActionError, Env, validate_call
from offline_agent.envs.parser import parse_form
from offline_agent.policy.constrained import import_xgrammar
from offline_agent.policy.grammar import tool_call_grammar
from offline_agent.policy.models import DEFAULT_MODEL, resolve_model
from offline_agent.types import ToolCall

from .outcome import CheckFailed, CheckSkipped


def check_demo_grammar(make_env: Callable[[], Env]) -> str:
    """Each of the demonstration's actions is a sentence of the grammar of its state's
    `call_tools()` (the env's budget and stop strings included)."""
    env = make_env()
    episode = env.demo_episode()
    if episode is None:
        raise CheckSkipped("no demo_episode()")
    xgr = _xgrammar()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(_tokenizer()))
    task, actions = episode
    env.reset(task)
    for text in actions:
        try:
            grammar = tool_call_grammar(env.call_tools(), env.max_action_tokens, tuple(env.stop))
        except ValueError as e:
            raise CheckFailed(f"before {text[:40]!r}: {e}") from None
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar.text))
        if not (matcher.accept_string(text) and matcher.is_completed()):
            raise CheckFailed(f"the grammar of constrain=tools refuses the demonstration's "
                              f"action {text[:60]!r} (forms {env.tool_syntax()}): set "
                              f"call_syntax or write the action in the form shown")
        env.act(text)
    return f"{len(actions)} actions are sentences of the grammar ({_forms(env)})"


def check_constrained_sampling(make_env: Callable[[], Env], samples: int = 32,
                               seed: int = 0) -> str:
    """`samples` replies of a tiny random model under the grammar, at the start state and
    after each demonstration action: every one parses, in its tool's form, into a valid call
    of the state's `action_tools()`."""
    _xgrammar()
    from offline_agent.policy.hf import HFPolicy
    from offline_agent.rollout import action_sampling

    tokenizer = _tokenizer()
    policy = HFPolicy(tiny_model(tokenizer, seed), tokenizer, constrain="tools")
    env = make_env()
    prompts, tools = _states(env, policy.tokenizer)
    per_state = -(-samples // len(prompts))
    try:
        out = policy.sample(prompts, per_state, action_sampling(env, 1.0, seed, tools))
    except ValueError as e:  # the grammar cannot be built: a budget too small, a bad schema
        raise CheckFailed(str(e)) from None
    syntax = env.tool_syntax()
    for completion, state_tools in ((c, t) for cs, t in zip(out, tools) for c in cs):
        try:
            call, form = parse_form(completion.text, env.tools)
            validate_call(call, state_tools)
            _check_enums(call, state_tools)
        except Exception as e:  # noqa: BLE001 - ActionError or worse: the check's finding
            raise CheckFailed(f"a constrained reply is not a valid call of its state's tools: "
                              f"{completion.text[:60]!r} ({e})") from None
        if form != syntax[call.name]:
            raise CheckFailed(f"a constrained reply {completion.text[:60]!r} is in {form} "
                              f"form, not the {syntax[call.name]} form of {call.name}")
    n = sum(len(cs) for cs in out)
    return f"{n} sampled replies at {len(prompts)} states are valid calls, each in its tool's form"


def _check_enums(call: ToolCall, tools: list[dict]) -> None:
    """validate_call checks types; a state's narrowed `enum`s are checked here."""
    spec = next(t["function"] for t in tools if t["function"]["name"] == call.name)
    for key, value in call.arguments.items():
        allowed = spec["parameters"]["properties"][key].get("enum")
        if allowed is not None and value not in allowed:
            raise ActionError(f"{call.name}.{key} = {value!r} is not one of the state's {allowed}")


PROMPT_OBSERVATION_CHARS = 500  # of each observation in the check's prompts


def _states(env: Env, tokenizer) -> tuple[list[str], list[list[dict]]]:
    """Prompts (the history so far) and call tools at the first state and after each
    demonstration action.

    The prompts feed a random model, so what they say does not matter, only that the grammar
    holds whatever comes before: observations are cut and the demonstration left out, which
    keeps the check seconds long where an env's observations are long."""
    from offline_agent.rollout import make_step

    episode = env.demo_episode()
    task, actions = episode if episode else (env.tasks("train", 1)[0], [])
    first, steps = env.reset(task)[:PROMPT_OBSERVATION_CHARS], []
    prompts, tools = [], []
    for text in [*actions[:-1], None]:
        prompts.append(render_prompt(tokenizer, history_messages(
            env.system_prompt(), task.instruction, first, steps)))
        tools.append(env.call_tools())
        if text is None:
            break
        step = make_step(text, *env.act(text))
        steps.append(replace(step, observation=step.observation[:PROMPT_OBSERVATION_CHARS]))
        if steps[-1].done:
            break
    return prompts, tools


def _forms(env: Env) -> str:
    return ", ".join(f"{name} {form}" for name, form in env.tool_syntax().items())


def _xgrammar():
    try:
        return import_xgrammar()
    except ImportError as e:
        raise CheckSkipped(str(e)) from None


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(DEFAULT_MODEL))


def tiny_model(tokenizer, seed: int = 0):
    """A 2-layer random Llama on `tokenizer`: this check's model, and the test suite's
    (tests/conftest.py tiny_model_dir)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True,
                         initializer_range=0.2)  # varied replies, not one token repeated
    return LlamaForCausalLM(config).eval()
