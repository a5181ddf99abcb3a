"""One GRPO update: the rollouts of a step -> advantages -> num_iterations optimizer updates.

The sequences are the rollouts' turns as sampled (rollouts.py): context ids + the
sampled ids, masked on the sampled ids only, so prompt and tool tokens never count. They
are packed into prefix tries (logprobs.py): an episode's turns share their prefix, computed
once. pi_old is one no-grad forward per batch of rollouts, so the first update's ratio is
exactly 1; each update accumulates the gradients of every packed forward before its
optimizer step, normalised by the whole step's count (grpo.step_normaliser).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

from offline_agent.policy.constrained import TokenMask

from ..logprobs import Encoded, groups, pack, token_logps
from .config import GRPOConfig
from .objective import (
    EpisodeSteps,
    combined_advantages,
    episode_advantages,
    shaped_rewards,
    step_advantages,
    step_normaliser,
    token_loss,
)
from .rollouts import Rollout


@dataclass
class Batch:
    """A step's trainable turns: one sequence per turn with at least one sampled id."""

    seqs: list[Encoded]
    episode: list[int]        # the rollout (episode) each sequence belongs to
    advantage: list[float]    # its turn's advantage
    num_episodes: int
    masks: list[list[TokenMask] | None]  # per sequence, its action ids' masks (Turn.masks)


def rewards(rollouts: list[Rollout], cfg: GRPOConfig) -> torch.Tensor:
    """Each rollout's shaped reward (grpo.shaped_rewards over outcome, invalid actions, steps)."""
    trajs = [r.trajectory for r in rollouts]
    return shaped_rewards(torch.tensor([t.reward for t in trajs]),
                          torch.tensor([sum(s.invalid for s in t.steps) for t in trajs]),
                          torch.tensor([len(t.steps) for t in trajs]), cfg)


def turn_advantages(rollouts: list[Rollout], reward: torch.Tensor,
                    cfg: GRPOConfig) -> list[torch.Tensor]:
    """Per rollout, (turns,): its episode advantage, plus step_weight times its state-grouped
    step advantage with step_groups (GiGPO's A = A_episode + omega * A_step)."""
    group = torch.tensor([r.group for r in rollouts])
    episode = episode_advantages(reward, group, cfg.scale_rewards)
    if not cfg.step_groups:
        return [episode[i].expand(len(r.turns)) for i, r in enumerate(rollouts)]
    steps = []
    for r, total in zip(rollouts, reward.tolist()):  # the shaped outcome on the last step
        per_step = [s.reward for s in r.trajectory.steps]
        per_step[-1] = total
        steps.append(EpisodeSteps(r.group, [t.state for t in r.turns], per_step))
    return combined_advantages(episode, step_advantages(steps, cfg.gamma), cfg.step_weight)


def make_batch(rollouts: list[Rollout], advantages: list[torch.Tensor]) -> Batch:
    seqs, episode, advantage, masks = [], [], [], []
    for i, (r, adv) in enumerate(zip(rollouts, advantages)):
        for turn, a in zip(r.turns, adv.tolist()):
            if not turn.action:  # an empty reply: nothing sampled, nothing to train
                continue
            seqs.append(Encoded(turn.context + turn.action,
                                [0] * len(turn.context) + [1] * len(turn.action)))
            episode.append(i)
            advantage.append(a)
            masks.append(turn.masks)
    return Batch(seqs, episode, advantage, len(rollouts), masks)


def chunk_masks(seqs: list[Encoded], masks: list[list[TokenMask] | None], vocab_size: int):
    """(allowed, merged), each (T, V) bool over a pack's action tokens in pack order (its
    sequences in order, each's action ids in order), for token_logps; None when no sequence
    of the pack was drawn constrained. A free sequence's tokens allow everything."""
    if all(m is None for m in masks):
        return None
    free = (torch.ones(vocab_size, dtype=torch.bool), torch.zeros(vocab_size, dtype=torch.bool))
    rows = []
    for seq, seq_masks in zip(seqs, masks):
        if seq_masks is not None and len(seq_masks) != seq.action_tokens:
            raise ValueError(f"{len(seq_masks)} masks for {seq.action_tokens} action tokens")
        rows += ([m.unpack(vocab_size) for m in seq_masks] if seq_masks is not None
                 else [free] * seq.action_tokens)
    return torch.stack([a for a, _ in rows]), torch.stack([m for _, m in rows])


def by_episode(values: torch.Tensor, row: torch.Tensor, num_rows: int) -> torch.Tensor:
    """Flat per-token values (T,) -> (num_rows, longest) with row `row[i]` holding its tokens
    in order, 0 after them; autograd flows through."""
    rows, order = torch.sort(row, stable=True)
    counts = torch.bincount(row, minlength=num_rows)
    starts = counts.cumsum(0) - counts
    col = torch.arange(len(row), device=row.device) - starts[rows]
    out = values.new_zeros(num_rows, max(int(counts.max()) if len(row) else 0, 1))
    return out.index_put((rows, col), values[order])


def _forward(model, packed, rows, cfg: GRPOConfig, masks=None, entropy: bool = False):
    """Per-episode token log-probs of one pack; `masks()`: its chunk_masks, built per
    forward (unpacked, they take T x V bools each)."""
    logps, spread = token_logps(model, packed, cfg.temperature, entropy, masks and masks())
    return by_episode(logps, rows, int(rows.max()) + 1), spread


def _chunks(batch: Batch, pack_tokens: int, vocab: int):
    """The batch's sequences in packs of at most pack_tokens trie tokens, an episode's turns
    in one pack: (sequence indices per pack, the packs, per pack None or a function that
    builds its grammar masks, chunk_masks)."""
    turns: dict[int, list[int]] = {}  # episode -> its sequences, in order
    for i, e in enumerate(batch.episode):
        turns.setdefault(e, []).append(i)
    items = list(turns.values())
    chunks = [[s for g in grp for s in items[g]] for grp in
              groups([[batch.seqs[s] for s in it] for it in items], pack_tokens)]
    packs = [pack([batch.seqs[s] for s in c]) for c in chunks]
    grammar = [None if all(batch.masks[s] is None for s in c) else functools.partial(
        chunk_masks, [batch.seqs[s] for s in c], [batch.masks[s] for s in c], vocab)
        for c in chunks]
    return chunks, packs, grammar


def update(model, optimizer, batch: Batch, cfg: GRPOConfig, pack_tokens: int,
           max_tokens: int) -> dict:
    """num_iterations optimizer updates on one batch of rollouts; returns their metrics
    (ratio, clip fraction, KL, entropy: means over agent tokens)."""
    began = time.perf_counter()
    chunks, packs, grammar = _chunks(batch, pack_tokens,
                                     model.get_output_embeddings().weight.shape[0])
    episode, advantage = torch.tensor(batch.episode), torch.tensor(batch.advantage)
    # per token: its row (the episode, renumbered within the chunk) and its advantage
    rows = [torch.unique(episode[c], return_inverse=True)[1][p.owner] for c, p in zip(chunks, packs)]
    advs = [by_episode(advantage[c][p.owner], r, int(r.max()) + 1) for c, p, r in zip(chunks, packs, rows)]
    masks = [by_episode(torch.ones(len(r)), r, int(r.max()) + 1) for r in rows]
    with torch.no_grad():  # pi_old (and the reference): one forward per batch of rollouts
        old = [_forward(model, p, r, cfg, g)[0] for p, r, g in zip(packs, rows, grammar)]
        ref = [None] * len(packs)
        if cfg.beta > 0:
            with model.disable_adapter():
                ref = [_forward(model, p, r, cfg, g)[0] for p, r, g in zip(packs, rows, grammar)]
    tokens = [0] * batch.num_episodes
    for seq, e in zip(batch.seqs, batch.episode):
        tokens[e] += seq.action_tokens
    normaliser = step_normaliser(cfg.loss_type, tokens, max_tokens)
    sums = {"loss": 0.0, "clip_fraction": 0.0, "kl": 0.0, "ratio": 0.0, "entropy": 0.0}
    for it in range(cfg.num_iterations):
        for i, p in enumerate(packs):
            new, spread = _forward(model, p, rows[i], cfg, grammar[i], entropy=it == 0)
            out = token_loss(new, old[i], masks[i], advs[i], epsilon=cfg.epsilon,
                             epsilon_high=cfg.epsilon_high, loss_type=cfg.loss_type,
                             normaliser=normaliser, beta=cfg.beta, logp_ref=ref[i])
            out.loss.backward()
            if it == cfg.num_iterations - 1:  # the metrics of the last update
                sums["loss"] += float(out.loss.detach())
                for k in ("clip_fraction", "kl", "ratio"):
                    sums[k] += float(getattr(out, k)) * out.tokens
            if spread is not None:
                sums["entropy"] += float(spread.sum())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    n = max(sum(tokens), 1)
    seconds = time.perf_counter() - began
    return {"loss": sums["loss"], **{k: sums[k] / n for k in ("clip_fraction", "kl", "ratio",
                                                               "entropy")},
            "agent_tokens": sum(tokens), "update_seconds": seconds,
            "update_tokens_per_s": sum(len(s.ids) for s in batch.seqs) * cfg.num_iterations
            / max(seconds, 1e-9)}
