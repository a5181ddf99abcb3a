"""Summed masked log-probs of many sequences in one forward, each shared prefix computed once.

Sequences come from `offline_agent.chat` (ids and action mask; no second masking path; an
action's ids are those the policy generated where the store has them). A
group of them is packed as a prefix trie flattened into one row: every distinct prefix is one
token of the row, each token attends exactly to its ancestors (a 4D mask) and sits at its
depth (position ids). A token's logits are then the same as in a separate forward of any
sequence through it, so chosen and rejected share their prompt, and all pairs of a step share
the system prompt and demonstration, computed once.

Gradient through a shared prefix: exact. The prefix's activations are one node of the graph
that every sequence through it reads, so backward sums their contributions, the same sum
separate forwards of each sequence would give; nothing is detached.

Only rows that predict an action token go through the LM head (`logits_to_keep`), so prompt
and observation tokens never get logits at all: their gradient is zero by construction. A
sequence enters the trie only up to its last action token (`Encoded.inputs`): what follows
(the episode's last observation) would be computed for no loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from offline_agent.chat import encode_prompt_completion
from offline_agent.types import Message

from . import trie_attention


@dataclass
class Encoded:
    """One training sequence: token ids and its action mask (1 = a token the policy wrote)."""

    ids: list[int]
    mask: list[int]

    @property
    def action_tokens(self) -> int:
        return sum(self.mask)

    @property
    def inputs(self) -> list[int]:
        """The ids a forward needs: those before the last action token. That token is only
        predicted, and what follows it (end of turn, the last observation) feeds no loss. A
        sequence without action tokens (the learned critic's, read at its last token) is
        forwarded whole."""
        actions = [i for i, m in enumerate(self.mask) if m]
        return self.ids[:actions[-1]] if actions else self.ids


def messages(dicts: list[dict]) -> list[Message]:
    """Chat dicts (TRL conversational format) -> Messages; tool_calls are not rendered. An
    assistant turn's generated ids (`token_ids`, absent in older stores) come along: the
    encoding trains on them (offline_agent.chat)."""
    return [Message(d["role"], d["content"], token_ids=d.get("token_ids")) for d in dicts]


def encode_pair(tokenizer, pair: dict) -> tuple[Encoded, Encoded]:
    """(chosen, rejected) of a step or trajectory pair: prompt + completion, masked only on the
    completion's assistant turns (its tool turns are context)."""
    prompt = messages(pair["prompt"])
    out = []
    for side in ("chosen", "rejected"):
        ids, mask = encode_prompt_completion(tokenizer, prompt, messages(pair[side]))
        if not any(mask):
            raise ValueError(f"pair {pair.get('pair_id')}: {side} has no assistant turn to train on")
        out.append(Encoded(ids, mask))
    return out[0], out[1]


def encode_example(tokenizer, example: dict) -> Encoded:
    """An RFT / hindsight example: the whole conversation, masked on the assistant turns after
    its prompt (system, the env's demonstration, the task; `info.prompt_messages`, written by
    mining): the demonstration's actions are context the policy was shown, not its own. An
    example without that count (mined before it was stored) trains every assistant turn."""
    msgs = messages(example["messages"])
    first = (example.get("info") or {}).get("prompt_messages", 0)
    ids, mask = encode_prompt_completion(tokenizer, msgs[:first], msgs[first:])
    if not any(mask):
        raise ValueError(f"example {example.get('example_id')}: no assistant turn to train on")
    return Encoded(ids, mask)


class Trie:
    """Token prefix trie; nodes are numbered in insertion order (a parent before its children)."""

    def __init__(self):
        self.parent: list[int] = []
        self.token: list[int] = []
        self.depth: list[int] = []
        self._children: list[dict[int, int]] = []
        self._roots: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.token)

    def add(self, ids: list[int]) -> list[int]:
        """Insert a sequence; returns its node per position."""
        path, kids, parent = [], self._roots, -1
        for t in ids:
            if t not in kids:
                kids[t] = len(self.token)
                self.parent.append(parent)
                self.token.append(t)
                self.depth.append(len(path))
                self._children.append({})
            parent = kids[t]
            path.append(parent)
            kids = self._children[parent]
        return path


@dataclass
class Packed:
    """A group of sequences as one flattened trie, ready for one forward."""

    ids: torch.Tensor        # (1, L) node tokens
    positions: torch.Tensor  # (1, L) node depths
    allowed: torch.Tensor    # (L, L) bool: row attends to column (its ancestors and itself)
    rows: torch.Tensor       # (T,) node whose logits predict each action token
    targets: torch.Tensor    # (T,) the action token
    owner: torch.Tensor      # (T,) index of the sequence it belongs to
    num_seqs: int


def pack(seqs: list[Encoded]) -> Packed:
    trie, rows, targets, owner = Trie(), [], [], []
    for s, seq in enumerate(seqs):
        if seq.mask and seq.mask[0]:
            raise ValueError("a sequence cannot start with an action token (nothing predicts it)")
        path = trie.add(seq.inputs)
        for i, m in enumerate(seq.mask):
            if m:
                rows.append(path[i - 1])
                targets.append(seq.ids[i])
                owner.append(s)
    return Packed(torch.tensor([trie.token]), torch.tensor([trie.depth]), ancestors(trie),
                  torch.tensor(rows), torch.tensor(targets), torch.tensor(owner), len(seqs))


def ancestors(trie: Trie) -> torch.Tensor:
    """(L, L) bool: node (row) attends to node (column): its ancestors and itself."""
    n = len(trie)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for node, parent in enumerate(trie.parent):  # parents come first: copy their row
        if parent >= 0:
            allowed[node] = allowed[parent]
        allowed[node, node] = True
    return allowed


def groups(items: list[list[Encoded]], budget: int) -> list[list[int]]:
    """Split items (each a list of sequences that go together, e.g. a pair) into consecutive
    groups whose tries hold at most `budget` tokens; an item bigger than that goes alone."""
    out: list[list[int]] = []
    trie = Trie()
    for i, seqs in enumerate(items):
        before = len(trie)
        for seq in seqs:
            trie.add(seq.inputs)
        if not out or (len(trie) > budget and before):
            trie = Trie()
            for seq in seqs:
                trie.add(seq.inputs)
            out.append([])
        out[-1].append(i)
    return out


def token_logps(model, packed: Packed, temperature: float = 1.0, entropy: bool = False,
                masks: tuple[torch.Tensor, torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each packed action token (T,), float32, under the logits divided by
    `temperature` (GRPO's ratio is taken at the sampling temperature), and with `entropy`
    the entropy of each of those distributions (T,) (no grad). `masks`: (allowed, merged),
    each (T, V) bool, renormalise each token's distribution over its allowed tokens, the
    merged ones' mass counted as the token's (masked_logprobs: a constrained decoder's
    distribution).

    One forward over the flattened trie, its attention scoring each query only against the
    keys its block may attend to (trie_attention.py; the model's attention is switched to it,
    SDPA's for any other forward). Only the rows that predict an action
    token reach the LM head; log-softmax is taken in float32.
    """
    device = next(model.parameters()).device
    dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
    keep, where = torch.unique(packed.rows, return_inverse=True)
    trie_attention.use(model)
    logits = model(input_ids=packed.ids.to(device), position_ids=packed.positions.to(device),
                   use_cache=False, logits_to_keep=keep.to(device),
                   trie_plan=trie_attention.plan(packed.allowed, dtype, device)).logits[0].float()
    if temperature != 1.0:
        logits = logits / temperature
    where, targets = where.to(device), packed.targets.to(device)
    if masks is not None:
        return _masked_logps(logits[where], targets, *(m.to(device) for m in masks), entropy)
    norm = logits.logsumexp(-1)
    picked = logits[where, targets] - norm[where]
    spread = None
    if entropy:
        with torch.no_grad():
            logp = logits - norm[:, None]
            spread = -(logp.exp() * logp).sum(-1)[where]
    return picked, spread


def _masked_logps(logits, targets, allowed, merged, entropy: bool):
    """token_logps under masks: (T, V) logits, one row per action token."""
    picked = masked_logprobs(logits, allowed, targets, merged)
    spread = None
    if entropy:
        with torch.no_grad():
            logp = logits.masked_fill(~allowed, float("-inf")).log_softmax(-1)
            spread = -torch.where(allowed, logp.exp() * logp, 0.0).sum(-1)
    return picked, spread


def sequence_logps(model, packed: Packed) -> torch.Tensor:
    """Summed log-prob of each packed sequence's action tokens: shape (num_seqs,), float32."""
    picked, _ = token_logps(model, packed)
    out = torch.zeros(packed.num_seqs, device=picked.device, dtype=torch.float32)
    return out.index_add(0, packed.owner.to(picked.device), picked)


def masked_logprobs(logits: torch.Tensor, allowed: torch.Tensor, tokens: torch.Tensor,
                    merged: torch.Tensor | None = None) -> torch.Tensor:
    """Log-prob of each token under the logits renormalised over its allowed tokens: the
    distribution a grammar-constrained policy samples from (model.constrain: tools), which
    GRPO's ratio and KL both use (docs/training.md). logits (..., V), already divided by the
    sampling temperature; allowed (..., V) bool; tokens (...,). `merged` (..., V) bool: the
    tokens whose draws the decoder turned into the token (constrained.py's `settle`), whose
    mass counts as the token's (None: only the token). A token outside its allowed set
    raises: it could not have been sampled, and its -inf would make the ratio NaN."""
    if allowed.shape != logits.shape:
        raise ValueError(f"allowed {tuple(allowed.shape)} must match logits {tuple(logits.shape)}")
    picked = tokens.unsqueeze(-1)
    if not bool(allowed.gather(-1, picked).all()):
        raise ValueError("a token outside its allowed set: the grammar mask does not match "
                         "the tokens sampled under it")
    logp = logits.float().masked_fill(~allowed, float("-inf")).log_softmax(-1)
    if merged is None:
        return logp.gather(-1, picked).squeeze(-1)
    drawn = (merged & allowed).scatter(-1, picked, True)
    return logp.masked_fill(~drawn, float("-inf")).logsumexp(-1)
