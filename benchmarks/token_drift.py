"""Token drift: do the ids training uses for an action equal the ids the policy generated?

The embedded model samples actions at MiniShop states (benchmarks/minishop_pairs.py) the way
search expands a node: the env's stop strings and token budget, temperature 1 and greedy.
For each action, the ids the policy generated (Completion.token_ids) are compared with the
action's masked span in `chat.encode_prompt_completion(prompt, [assistant: text])`, and the
ids it generated from with the same encoding's prompt part.

An action cut at a stop string (MiniShop stops at "\\n") ends without the end-of-turn token;
training appends `<|im_end|>` (the template closes the turn), so for those the comparison is
of the content ids (the span minus its end-of-turn token), and such actions are counted.

    .venv/bin/python benchmarks/token_drift.py --states 40 --samples 8
"""

from __future__ import annotations

import argparse
from collections import Counter

from minishop_pairs import step_pairs

from offline_agent.chat import encode_prompt_completion, render_prompt
from offline_agent.envs.base import load_env
from offline_agent.policy import DEFAULT_MODEL, load_policy
from offline_agent.policy.base import Sampling, encode_prompt
from offline_agent.training.logprobs import messages
from offline_agent.types import Message


def compare(tok, prompt: list[Message], completion, eos: set[int]) -> str:
    """'same', or how the training ids of this action differ from the generated ones."""
    ids, mask = encode_prompt_completion(tok, prompt, [Message("assistant", completion.text)])
    start = mask.index(1)
    span = [t for t, m in zip(ids, mask) if m]
    if ids[:start] != encode_prompt(tok, render_prompt(tok, prompt)):
        return "prompt ids differ"
    generated = list(completion.token_ids)
    ended = bool(generated) and generated[-1] in eos
    if not ended:
        span = span[:-1]  # training's end-of-turn token; the policy stopped at a stop string
    return "same" if span == generated else "action ids differ"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULT_MODEL)
    ap.add_argument("--states", type=int, default=40)
    ap.add_argument("--samples", type=int, default=8)
    args = ap.parse_args()
    env = load_env("minishop")
    policy = load_policy(args.model, device="cpu")
    tok = policy.tokenizer
    eos = policy.eos
    prompts = [messages(p["prompt"]) for p in step_pairs(args.states)]
    rendered = [render_prompt(tok, p) for p in prompts]
    outcome, ends, examples = Counter(), Counter(), []
    for temperature, n in ((0.0, 1), (1.0, args.samples)):
        sampling = Sampling(max_new_tokens=env.max_action_tokens, temperature=temperature,
                            stop=list(env.stop), seed=0)
        for prompt, completions in zip(prompts, policy.sample(rendered, n, sampling)):
            for c in completions:
                result = compare(tok, prompt, c, eos)
                outcome[result] += 1
                ends["eos" if c.token_ids and c.token_ids[-1] in eos
                     else c.finish_reason] += 1
                if result != "same" and len(examples) < 5:
                    examples.append((c.text, c.token_ids))
    total = sum(outcome.values())
    print(f"{total} actions ({args.states} MiniShop states, greedy + {args.samples} samples at "
          f"temperature 1, stop {env.stop!r}) on {args.model}")
    print(f"mismatch rate: {1 - outcome['same'] / total:.4f} ({total - outcome['same']}/{total}); "
          f"{dict(outcome)}")
    print(f"how actions ended: {dict(ends)} (stop-string endings: training adds <|im_end|>)")
    for text, ids in examples:
        print(f"  differs: {text!r} generated {ids}")


if __name__ == "__main__":
    main()
