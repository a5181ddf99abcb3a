"""The policy backend contract: sample completions for rendered prompts, score continuations.

Prompts are strings already rendered with the tokenizer's chat template (see
offline_agent.chat), so every backend sees exactly the same text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass
class Sampling:
    """Decoding settings for one `sample` call."""

    max_new_tokens: int = 48
    # 0 means greedy; a list gives each prompt its own temperature, so one call can serve
    # greedy and sampled requests together (search's proposals and rollouts)
    temperature: float | list[float] = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)  # cut the text at the first stop string
    # seeds this call (same seed + inputs -> same outputs on CPU); a list gives each prompt
    # its own seed, so a prompt's samples do not depend on the other prompts of the call
    seed: int | list[int] | None = None
    # per prompt, the tool specs its reply must call (None: free text). A policy loaded with
    # constrain="tools" decodes such a reply under the grammar of one call of these tools
    # (policy/grammar.py); the stop strings then do not cut it (the call ends itself, then the
    # turn). With constrain="none" they are ignored.
    tools: list[list[dict] | None] | None = None


@dataclass
class Completion:
    text: str  # decoded text, cut at the first stop string (the stop string is not included)
    # generated ids that produce `text` (the fewest; a token in which the stop string begins is
    # kept), followed by the eos id when eos ended the turn (not decoded into `text`)
    token_ids: list[int]
    # log-prob of each id under the raw model (temperature 1, no top-p), as GRPO needs
    logprobs: list[float]
    finish_reason: str = "length"  # "stop" (eos or stop string) | "length"
    # drawn under a tool-call grammar. `logprobs` are still those of the unconstrained model:
    # what DPO and RFT recompute; an importance ratio (GRPO) would need the masked distribution
    constrained: bool = False
    # the ids of `text` that training uses for this action: they decode to exactly `text` (no
    # eos). All of `token_ids` but a final eos, except where the stop string began inside a
    # token: then the tokens before it plus the tokenizer's ids of the rest of `text`. Set by
    # `finish` (every backend); None when no ids decode to `text`
    action_ids: list[int] | None = None

    @property
    def logprob(self) -> float:
        return float(sum(self.logprobs))


class Policy(Protocol):
    """What search, eval and GRPO need from a generation backend."""

    tokenizer: object

    def sample(self, prompts: list[str], n: int, sampling: Sampling) -> list[list[Completion]]:
        """n completions for each prompt, batched into as few forward passes as possible."""
        ...

    def score(self, prompt: str, continuations: list[str]) -> list[float]:
        """Summed log-prob of each continuation given the prompt, in one batched forward."""
        ...

    def choice_logprobs(self, prompts: list[str], choices: list[list[str]]) -> list[list[float]]:
        """score() for many prompts at once: [[log p(c | prompt) for c in cs] for each prompt]."""
        ...
