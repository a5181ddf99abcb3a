"""The mask check: how many of the tokens a policy trains on are its own (agent) tokens.

Training must put loss only on what the agent wrote: its replies and the end-of-turn token
that stopped them, never on the prompt, the env's observations or the demonstration. The
mask comes from offline_agent.chat; this recounts it another way, from the finished
sequence: each trained run of tokens must decode to one of the row's trained assistant
turns followed by one end-of-turn token. The report's Diagnostics shows agent / trained
tokens, which must be 100%.
"""

from __future__ import annotations

from offline_agent.chat import mask_runs

from .logprobs import Encoded


def trained_turns(policy: str, row: dict) -> list[list[str]]:
    """Per sequence encode_pair / encode_example make of `row`, the assistant contents it
    trains on: RFT the turns after info.prompt_messages; DPO the chosen, then the rejected."""
    if policy == "rft":
        first = (row.get("info") or {}).get("prompt_messages", 0)
        sides = [row["messages"][first:]]
    else:
        sides = [row["chosen"], row["rejected"]]
    return [[m["content"] for m in side if m["role"] == "assistant"] for side in sides]


def agent_tokens(tokenizer, seq: Encoded, turns: list[str]) -> int:
    """Trained tokens of `seq` inside a run that is one of `turns` (compared without outer
    whitespace, which templates may trim) plus one added end-of-turn token."""
    added = tokenizer.added_tokens_decoder
    wanted = {t.strip() for t in turns}
    ok = 0
    for start, end in mask_runs(seq.mask):
        text = tokenizer.decode(seq.ids[start:end - 1], clean_up_tokenization_spaces=False)
        if seq.ids[end - 1] in added and text.strip() in wanted:
            ok += end - start
    return ok


def count_agent_tokens(tokenizer, policy: str, rows: list[dict],
                       items: list[list[Encoded]]) -> int:
    """agent_tokens summed over every sequence of `items` (encoded from `rows` in order)."""
    return sum(agent_tokens(tokenizer, seq, turns)
               for row, seqs in zip(rows, items)
               for seq, turns in zip(seqs, trained_turns(policy, row)))
