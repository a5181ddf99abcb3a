"""Token drift of a real GRPO run: are the ids GRPO trains the ids the policy was sampled on?

A real `train_grpo` run on MiniShop (multi-turn episodes, the policy the model being
trained; the embedded SmolLM2-135M, or `--tiny` for a 2-layer random Llama on its tokenizer)
with the hf decoder recording, for every row it decodes, the prompt ids it was fed and the
ids it generated. Each step's trained sequences (grpo/update.py's Batch, one per turn: context +
action, masked on the action, as make_batch builds them) are compared with those, turn by turn: mismatched context
tokens and mismatched action tokens (position by position, a length difference counting as
mismatches). Target 0 and 0 (issue 22, Deliver 3).

Beside it, the same turns encoded the way outcome DPO encodes an episode (the whole
conversation re-rendered with the chat template, each action masked in it: `chat.
encode_prompt_completion`), from the stored ids and from the text alone: what a
re-tokenising GRPO would train (TRL #5224).

    PYTHONPATH=. .venv/bin/python benchmarks/grpo_token_drift.py --steps 2
    PYTHONPATH=. .venv/bin/python benchmarks/grpo_token_drift.py --tiny --steps 2
"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter, defaultdict
from pathlib import Path

import offline_agent.training.grpo.train as grpo_train
from offline_agent.chat import encode_prompt_completion, mask_runs
from offline_agent.envs.base import load_env
from offline_agent.mining.build import Context, episode_messages
from offline_agent.policy.hf import HFPolicy
from offline_agent.training.logprobs import Encoded, messages
from offline_agent.types import Message


class Recording(HFPolicy):
    """HFPolicy that records, per request key (the episode), each row's fed and drawn ids."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows: dict[int, list[tuple[list[int], list[int]]]] = defaultdict(list)

    def _generate(self, rows, sampling, on_done):
        def record(done, completion):
            self.rows[done.tag.key].append((list(done.ids), list(completion.token_ids)))
            return on_done(done, completion)
        return super()._generate(rows, sampling, record)


def differ(a: list[int], b: list[int]) -> int:
    """Tokens that differ position by position, plus the length difference."""
    return sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


def compare(rollouts, fed_of: dict, batch, ctx: Context, tok, tasks: dict,
            counts: Counter) -> None:
    """A batch (make_batch of `rollouts`) against the rows the decoder was fed and drew."""
    seqs = iter(batch.seqs)
    for r in rollouts:
        fed = fed_of[id(r)]
        counts["turns"] += len(r.turns)
        counts["turns not recorded"] += abs(len(r.turns) - len(fed))
        for turn, (prompt, drawn) in zip(r.turns, fed):
            counts["context tokens"] += len(prompt)
            counts["action tokens"] += len(drawn)
            if turn.action:
                seq: Encoded = next(seqs)
                start = seq.mask.index(1)
                counts["trained: context tokens differ"] += differ(seq.ids[:start], prompt)
                counts["trained: action tokens differ"] += differ(seq.ids[start:], drawn)
        reencoded(r, fed, ctx, tok, tasks, counts)


def reencoded(rollout, fed, ctx: Context, tok, tasks: dict, counts: Counter) -> None:
    """The outcome-DPO encoding of the episode (with the stored ids, and from text alone)."""
    traj = rollout.trajectory
    prompt, rest = episode_messages(ctx, tasks[traj.task_id].instruction,
                                    traj.first_observation, traj.steps)
    prompt, rest = messages(prompt), messages(rest)
    for key, completion in (("re-encoded", rest),
                            ("re-encoded, text only", [Message(m.role, m.content) for m in rest])):
        ids, mask = encode_prompt_completion(tok, prompt, completion)
        for (start, end), (context, drawn) in zip(mask_runs(mask), fed):
            action = drawn[:-1] if drawn and drawn[-1] == tok.eos_token_id else drawn
            # the template closes the turn itself: compare the action's own ids
            counts[f"{key}: turns whose context differs"] += ids[:start] != context
            counts[f"{key}: action tokens differ"] += differ(ids[start:end][:len(action)], action)


def instrument(policy: Recording, ctx: Context, tok, tasks: dict, counts: Counter) -> None:
    """Wrap the GRPO loop's sample_groups: each call's rollouts, as make_batch turns them
    into training sequences (all of them: a group that ties is dropped from the update, and
    one of a random model always ties), against the rows the decoder was fed and drew."""
    import torch

    sample = grpo_train.sample_groups

    def sample_and_compare(*a, **k):
        policy.rows.clear()
        out = sample(*a, **k)
        fed_of = {id(r): policy.rows.pop(i, []) for i, r in enumerate(out)}
        batch = grpo_train.make_batch(out, [torch.zeros(len(r.turns)) for r in out])
        compare(out, fed_of, batch, ctx, tok, tasks, counts)
        return out

    grpo_train.sample_groups = sample_and_compare


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a 2-layer random Llama (seconds)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--tasks-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-steps", type=int, default=4, help="MiniShop's step limit")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from offline_agent.envs.testing.grammar_check import tiny_model
    from offline_agent.policy.models import resolve_model
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.grpo.config import GRPOConfig
    from offline_agent.training.model import add_lora

    path = resolve_model("embedded:smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    model = add_lora(tiny_model(tok) if args.tiny else AutoModelForCausalLM.from_pretrained(path),
                     TrainConfig(lora_r=8))
    policy = Recording(model, tok, max_batch=16, seed=0)

    def make_env():
        return load_env("minishop", seed=0, max_steps=args.max_steps)
    env = make_env()
    tasks = env.tasks("train", 16)
    counts: Counter = Counter()
    instrument(policy, Context(env.system_prompt(), env.demonstration()), tok,
               {t.id: t for t in tasks}, counts)
    cfg = GRPOConfig(enabled=True, init="base", steps=args.steps, group_size=args.group_size,
                     tasks_per_step=args.tasks_per_step, max_resample=0, save_every=1000)
    with tempfile.TemporaryDirectory() as out:
        grpo_train.train_grpo(model, policy, make_env, tasks, cfg, Path(out), seed=0,
                              batch_size=16, pack_tokens=3072,
                              max_tokens=env.max_action_tokens * env.max_steps)
    print(f"{'tiny random Llama' if args.tiny else 'embedded SmolLM2-135M'}, MiniShop, "
          f"{args.steps} GRPO steps x {args.tasks_per_step} tasks x G={args.group_size}, "
          f"max_steps {args.max_steps}: {counts['turns']} turns sampled ({counts['context tokens']} "
          f"context, {counts['action tokens']} action tokens sampled)")
    for k, v in counts.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    main()
