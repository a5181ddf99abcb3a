"""The mask check (offline_agent/training/mask_check.py) recounts trained tokens from the
encoded sequences: all of them are agent tokens for the real encodings, and a mask that
strays onto the prompt or an observation is caught."""

from __future__ import annotations

from dataclasses import replace

from offline_agent.training.logprobs import encode_example, encode_pair
from offline_agent.training.mask_check import agent_tokens, count_agent_tokens, trained_turns
from tests.test_training import step_pair, trajectory_pair


def test_every_trained_token_of_real_encodings_is_an_agent_token(tokenizer):
    pairs = [step_pair(1), trajectory_pair()]
    items = [list(encode_pair(tokenizer, p)) for p in pairs]
    trained = sum(s.action_tokens for seqs in items for s in seqs)
    assert trained > 0 and count_agent_tokens(tokenizer, "dpo_step", pairs, items) == trained
    pair = trajectory_pair()
    example = {"messages": pair["prompt"] + pair["chosen"], "info": {"prompt_messages": 2}}
    seq = encode_example(tokenizer, example)
    assert trained_turns("rft", example) == [["search[blue power bank]", "click[P0001]", "buy"]]
    assert count_agent_tokens(tokenizer, "rft", [example], [[seq]]) == seq.action_tokens


def test_a_mask_on_the_prompt_or_a_turn_not_trained_is_caught(tokenizer):
    chosen, _ = encode_pair(tokenizer, step_pair(1))
    turns = trained_turns("dpo_step", step_pair(1))[0]
    assert agent_tokens(tokenizer, chosen, turns) == chosen.action_tokens
    strayed = replace(chosen, mask=[1] * 3 + chosen.mask[3:])  # the prompt's first tokens
    assert agent_tokens(tokenizer, strayed, turns) == chosen.action_tokens  # the stray run fails
    assert strayed.action_tokens == chosen.action_tokens + 3
    widened = replace(chosen, mask=chosen.mask[1:] + [0])  # one token earlier: run off by one
    assert agent_tokens(tokenizer, widened, turns) == 0
    # the earlier action in the prompt is an agent's, but not one this sequence trains on
    assert agent_tokens(tokenizer, chosen, ["search[power bank]"]) == 0


def test_generated_ids_that_are_not_the_tokenizers_split_still_count(tokenizer):
    """A turn trained on the ids the policy generated (one token per letter here) decodes to
    its text, so all of it counts as the agent's."""
    pair = step_pair(1)
    text = pair["chosen"][0]["content"]
    pair["chosen"][0]["token_ids"] = [i for ch in text
                                      for i in tokenizer(ch, add_special_tokens=False).input_ids]
    items = [list(encode_pair(tokenizer, pair))]
    trained = sum(s.action_tokens for s in items[0])
    assert items[0][0].action_tokens == len(pair["chosen"][0]["token_ids"]) + 1
    assert count_agent_tokens(tokenizer, "dpo_step", [pair], items) == trained
