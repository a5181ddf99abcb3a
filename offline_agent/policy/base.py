"""The policy backend contract: sample completions for rendered prompts, score continuations.

Prompts are strings already rendered with the tokenizer's chat template (see
offline_agent.chat), so every backend sees exactly the same text. The helpers below are the
backend-neutral part of a sample call (prompt ids, per-row seeds and temperatures, the
Completion built from generated ids), shared so the backends agree and none imports another.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from offline_agent.seeding import stable_seed

if TYPE_CHECKING:
    import torch


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
    # per prompt, the tool specs its reply must call (None: free text), each in the form its
    # "syntax" names (Env.call_tools()). A policy loaded with
    # constrain="tools" decodes such a reply under the grammar of one call of these tools
    # (policy/grammar.py); it ends with the call, then end-of-turn or a stop string the grammar
    # keeps out of free text ("\n", "\n\n"). With constrain="none" they are ignored.
    tools: list[list[dict] | None] | None = None


@dataclass
class Completion:
    text: str  # decoded text, cut at the first stop string (the stop string is not included)
    # generated ids that produce `text` (the fewest; a token in which the stop string begins is
    # kept), followed by the eos id when eos ended the turn (not decoded into `text`)
    token_ids: list[int]
    # log-prob of each id under the raw model (temperature 1, no top-p): what an
    # importance ratio needs (the grpo stage recomputes them by a forward, as pi_old)
    logprobs: list[float]
    finish_reason: str = "length"  # "stop" (eos or stop string) | "length"
    # drawn under a tool-call grammar. `logprobs` are still those of the unconstrained model:
    # what DPO and RFT recompute; GRPO's ratio uses the masked one (GrammarMasks.replay)
    constrained: bool = False
    # the ids of `text` that training uses for this action: they decode to exactly `text` (no
    # eos). All of `token_ids` but a final eos, except where the stop string began inside a
    # token: then the tokens before it plus the tokenizer's ids of the rest of `text`. Set by
    # `finish` (every backend); None when no ids decode to `text`
    action_ids: list[int] | None = None

    @property
    def logprob(self) -> float:
        return float(sum(self.logprobs))


@dataclass
class Request:
    """One prompt of a `Policy.serve` call, sampled once, with its own seed and tools (what
    Sampling's per-prompt lists give a prompt in `sample`). `key` is the caller's, returned
    with the request to its `answer`."""

    prompt: str
    seed: int
    tools: list[dict] | None = None
    key: object = None


Answer = Callable[[Request, Completion], list[Request]]


class Policy(Protocol):
    """What search, baselines, eval and GRPO's rollouts need from a generation backend."""

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

    def serve(self, requests: list[Request], sampling: Sampling, answer: Answer) -> None:
        """One completion per request, each handed to `answer` as soon as it is done; the
        requests `answer` returns (an episode's next turn, the next episode) are served the
        same way, until none is left. `sampling` gives the settings all requests share (its
        seed and tools are ignored: each request brings its own). A request's completion is
        the one `sample([r.prompt], 1, sampling with seed [r.seed] and tools [r.tools])`
        gives, whatever is served beside it. A backend without its own way runs
        `serve_in_lockstep`."""
        ...


def serve_in_lockstep(policy: Policy, requests: list[Request], sampling: Sampling,
                      answer: Answer) -> None:
    """Policy.serve by plain sample calls: all pending requests form one call, and the requests
    their answers return form the next."""
    while requests:
        call = replace(sampling, seed=[r.seed for r in requests],
                       tools=[r.tools for r in requests])
        completions = policy.sample([r.prompt for r in requests], 1, call)
        requests = [new for r, (c,) in zip(requests, completions) for new in answer(r, c)]


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Ids of a prompt already rendered with the chat template. Templates write their own BOS,
    so special tokens are not added again. BOS is prepended only where the tokenizer itself
    would add one and the text lacks it."""
    ids = tokenizer(text, add_special_tokens=False).input_ids
    bos = tokenizer.bos_token_id
    if bos is not None and tokenizer("").input_ids[:1] == [bos] and ids[:1] != [bos]:
        ids = [bos] + ids
    if not ids:
        raise ValueError("empty prompt: there is nothing to condition on")
    return ids


def make_completion(tokenizer, ids: list[int], logprobs: list[float], stop: list[str],
                    ended: bool) -> Completion:
    """The Completion for generated `ids`, built the same by every backend. `ended`: the last
    id is eos.

    A final eos token is kept in token_ids/logprobs (the policy chose to end its turn, and the
    action mask trains that token) but is not decoded into the text. With a stop string, the
    text is cut before it, and ids/logprobs are cut to the fewest tokens whose decoding starts
    with that text. When the stop string begins inside a token, that token is kept.
    `action_ids` are the ids training uses for the action: they decode to exactly the text.
    """
    content = ids[:-1] if ended else ids
    text = tokenizer.decode(content, clean_up_tokenization_spaces=False)
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=-1)
    if cut < 0:
        return Completion(text, ids, logprobs, "stop" if ended else "length", action_ids=content)
    text = text[:cut]
    k = next(
        k for k in range(len(ids) + 1)
        if tokenizer.decode(ids[:k], clean_up_tokenization_spaces=False).startswith(text)
    )
    return Completion(text, ids[:k], logprobs[:k], "stop",
                      action_ids=exact_ids(tokenizer, ids[:k], text))


def exact_ids(tokenizer, ids: list[int], text: str) -> list[int] | None:
    """Ids that decode to exactly `text`, a prefix of what `ids` decode to: the longest run of
    whole generated tokens inside `text`, then the tokenizer's own ids of the rest (the part of
    the token in which a stop string began). None if no such ids exist."""
    for j in range(len(ids), -1, -1):
        head = tokenizer.decode(ids[:j], clean_up_tokenization_spaces=False)
        if text.startswith(head):
            rest = text[len(head):]
            out = ids[:j] + (tokenizer(rest, add_special_tokens=False).input_ids if rest else [])
            if tokenizer.decode(out, clean_up_tokenization_spaces=False) == text:
                return out
    return None


def row_seed(seed: int, row: int) -> int:
    """The seed of row `row` (prompt i, sample j -> row i*n + j) in a call seeded with `seed`."""
    return stable_seed(seed, row)


def row_seeds(seed: int | list[int] | None, num_prompts: int, n: int,
              rng: torch.Generator) -> list[int]:
    """Seeds of all rows of a call: from the call's seed, from each prompt's own seed, or
    (seed None) from a call seed drawn from the backend's `rng`."""
    if seed is None:
        import torch  # here, not at the top: importing the contract stays light (config, --help)

        seed = int(torch.randint(2**62, (), generator=rng))
    if isinstance(seed, int):
        return [row_seed(seed, r) for r in range(num_prompts * n)]
    if len(seed) != num_prompts:
        raise ValueError(f"{len(seed)} seeds for {num_prompts} prompts")
    return [row_seed(s, j) for s in seed for j in range(n)]


def row_temperatures(temperature: float | list[float], num_prompts: int, n: int) -> list[float]:
    """Temperature of each row of a call: the call's, or each prompt's own."""
    if isinstance(temperature, (int, float)):
        return [float(temperature)] * (num_prompts * n)
    if len(temperature) != num_prompts:
        raise ValueError(f"{len(temperature)} temperatures for {num_prompts} prompts")
    return [float(t) for t in temperature for _ in range(n)]


def call_rows(tokenizer, prompts: list[str], n: int, sampling: Sampling, rng: torch.Generator
              ) -> tuple[list[list[int]], list[int], list[float]]:
    """The rows of a sample call (prompt i, sample j -> row i*n + j), as every backend runs them:
    each row's prompt ids, seed and temperature."""
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    rows = [ids[i] for i in range(len(prompts)) for _ in range(n)]
    return (rows, row_seeds(sampling.seed, len(prompts), n, rng),
            row_temperatures(sampling.temperature, len(prompts), n))


class Lockstep:
    """A policy served one `sample` call per round (`serve_in_lockstep`): how run_episodes
    played before `Policy.serve`, the baseline that continuous batching is tested and
    benchmarked against."""

    def __init__(self, policy):
        self.policy, self.tokenizer = policy, policy.tokenizer

    def sample(self, prompts, n, sampling):
        return self.policy.sample(prompts, n, sampling)

    def serve(self, requests, sampling, answer):
        serve_in_lockstep(self, requests, sampling, answer)
