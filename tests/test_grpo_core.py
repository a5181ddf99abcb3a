"""GRPO's pure core against values computed by hand: advantages (episode groups, state-grouped
steps), shaping, zero-signal groups, the clipped loss for each loss_type with its gradients,
and log-probs under a grammar's mask."""

from __future__ import annotations

import math

import pytest
import torch

from offline_agent.training.grpo.config import GRPOConfig
from offline_agent.training.grpo.objective import (
    EpisodeSteps,
    combined_advantages,
    discounted_returns,
    episode_advantages,
    shaped_rewards,
    state_hash,
    step_advantages,
    step_normaliser,
    tied_groups,
    token_loss,
)
from offline_agent.training.logprobs import masked_logprobs

S3 = 1 / math.sqrt(3)
CLIP = {"epsilon": 0.2, "epsilon_high": 0.28}


def close(got: torch.Tensor, want: list) -> None:
    assert got.shape == torch.tensor(want).shape
    assert got.flatten().tolist() == pytest.approx(torch.tensor(want).flatten().tolist(), abs=1e-6)


# --- episode advantages -------------------------------------------------------------------

# group 0: [1, 0, 0]; group 1 ties at 0.5; group 2 is a group of one
REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.5, 0.5, 1.0])
GROUP = torch.tensor([0, 0, 0, 1, 1, 2])


def test_episode_advantages_group():
    # group 0: mean 1/3, deviations (2/3, -1/3, -1/3), unbiased var (4/9 + 1/9 + 1/9) / 2 = 1/3
    close(episode_advantages(REWARDS, GROUP, "group"), [2 * S3, -S3, -S3, 0, 0, 0])


def test_episode_advantages_batch_and_none():
    # batch: mean 0.5, deviations (.5, -.5, -.5, 0, 0, .5): unbiased var 1 / 5
    b = math.sqrt(5)
    close(episode_advantages(REWARDS, GROUP, "batch"), [(2 / 3) * b, -(1 / 3) * b,
                                                        -(1 / 3) * b, 0, 0, 0])
    close(episode_advantages(REWARDS, GROUP, "none"), [2 / 3, -1 / 3, -1 / 3, 0, 0, 0])


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_ties_groups_of_one_and_empty_give_zero_never_nan(scale):
    # 0.1 three times: the float mean is not exactly 0.1, a tie must still give exactly 0
    rewards = torch.tensor([0.1, 0.1, 0.1, 7.0], dtype=torch.float64)
    assert rewards[:3].mean() != rewards[0]
    tied = episode_advantages(rewards, torch.tensor([0, 0, 0, 1]), scale)
    assert tied.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert episode_advantages(torch.tensor([3.0]), torch.tensor([0]), scale).tolist() == [0.0]
    assert episode_advantages(torch.zeros(0), torch.zeros(0, dtype=torch.long), scale).numel() == 0


def test_unknown_scale_raises():
    with pytest.raises(ValueError, match="scale_rewards"):
        episode_advantages(REWARDS, GROUP, "std")


def test_tied_groups_counts_zero_signal_groups():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.3])
    tied = tied_groups(rewards, torch.tensor([0, 0, 1, 1, 2, 2, 3]))
    assert tied.tolist() == [True, False, True, True]
    assert int(tied.sum()) == 3


# --- shaping ------------------------------------------------------------------------------

def test_shaping_caps_so_the_outcome_dominates():
    cfg = GRPOConfig(format_weight=0.1, format_cap=0.25, length_penalty=0.05, step_budget=3,
                     length_cap=0.1)
    # format: (0, min(0.5, .25), .1); length past 3 steps: (0, min(5 x .05, .1), .05)
    got = shaped_rewards(torch.tensor([1.0, 1.0, 0.0]), torch.tensor([0, 5, 1]),
                         torch.tensor([2, 8, 4]), cfg)
    close(got, [1.0, 0.65, -0.15])
    close(shaped_rewards(torch.tensor([1.0]), torch.tensor([9]), torch.tensor([9]),
                         GRPOConfig()), [1.0])  # default weights 0: shaping off


# --- step groups --------------------------------------------------------------------------

def snapshot(page: str, cart: list[str], num_steps: int) -> dict:
    return {"task": {"goal": "a blue power bank"}, "num_steps": num_steps,
            "state": {"page": page, "cart": cart}}


def test_state_hash_is_the_exact_state_without_the_step_count():
    a = snapshot("results", [], 1)
    same_later = {"state": {"cart": [], "page": "results"}, "num_steps": 4,
                  "task": {"goal": "a blue power bank"}}
    assert state_hash(a) == state_hash(same_later)  # key order and num_steps do not count
    assert state_hash(a) != state_hash(snapshot("results", ["P0001"], 1))  # another cart


def test_discounted_returns():
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]
    assert discounted_returns([], 0.9) == []


def test_step_advantages_on_a_hand_built_group():
    s0, s1, s2, s3 = (state_hash(snapshot(p, [], 0)) for p in ("home", "results", "item", "buy"))
    episodes = [EpisodeSteps(0, [s0, s1], [0.0, 1.0]),        # returns (.5, 1)
                EpisodeSteps(0, [s0, s2], [0.0, 0.0]),        # returns (0, 0)
                EpisodeSteps(0, [s0, s1, s3], [0.0, 0.0, 1.0]),  # returns (.25, .5, 1)
                EpisodeSteps(1, [s0], [1.0])]                 # another task: its own group
    steps = step_advantages(episodes, gamma=0.5)
    # (0, s0): returns (.5, 0, .25), mean .25, unbiased std .25 -> (1, -1, 0)
    # (0, s1): returns (1, .5), mean .75, unbiased std sqrt(.125) -> (+-1/sqrt 2)
    # (0, s2), (0, s3), (1, s0): one member each -> 0
    h = 1 / math.sqrt(2)
    for got, want in zip(steps, [[1, h], [-1, 0], [0, -h, 0], [0]], strict=True):
        close(got, want)
    # episode outcomes (1, 0, 1 | 1): (1/sqrt 3, -2/sqrt 3, 1/sqrt 3 | 0)
    episode = episode_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 0, 1]),
                                 "group")
    total = combined_advantages(episode, steps, step_weight=0.5)
    for got, want in zip(total, [[S3 + 0.5, S3 + h / 2], [-2 * S3 - 0.5, -2 * S3],
                                 [S3, S3 - h / 2, S3], [0]], strict=True):
        close(got, want)


def test_step_advantages_edge_cases():
    assert [s.numel() for s in step_advantages([EpisodeSteps(0, [], [])], 0.9)] == [0]
    tie = step_advantages([EpisodeSteps(0, ["x"], [1.0]), EpisodeSteps(0, ["x"], [1.0])], 0.9)
    assert [s.tolist() for s in tie] == [[0.0], [0.0]]
    with pytest.raises(ValueError, match="one state per step"):
        step_advantages([EpisodeSteps(0, ["x"], [0.0, 1.0])], 0.9)



# --- the loss -----------------------------------------------------------------------------

BAD = float("inf")


def two_sequences():
    """A: agent tokens with ratios 1.5 and 0.9, then a masked token holding garbage; B: one
    agent token with ratio 0.5, then two padding tokens. Advantages +1 (A), -0.5 (B)."""
    old = torch.tensor([[-1.0, -1.0, BAD], [-2.0, float("nan"), 0.0]])
    new = torch.tensor([[-1 + math.log(1.5), -1 + math.log(0.9), BAD],
                        [-2 + math.log(0.5), -BAD, float("nan")]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    return new, old, mask, torch.tensor([1.0, -0.5])


# per agent token: A1 ratio 1.5 > 1.28 with A > 0: clipped, -1.28; A2 ratio 0.9: -0.9;
# B1 ratio 0.5 < 0.8 with A < 0: min(-0.25, -0.4) = -0.4 (clipped), loss +0.4
@pytest.mark.parametrize("loss_type,want", [
    ("grpo", ((-1.28 - 0.9) / 2 + 0.4) / 2),  # per-sequence means, then over 2 sequences
    ("dapo", (-1.28 - 0.9 + 0.4) / 3),        # sum over the 3 agent tokens of the step
    ("dr_grpo", (-1.28 - 0.9 + 0.4) / 8),     # sum over max_tokens 4 x 2 sequences
])
def test_loss_by_hand_for_each_loss_type(loss_type, want):
    new, old, mask, adv = two_sequences()
    norm = step_normaliser(loss_type, mask.sum(-1).tolist(), max_tokens=4)
    out = token_loss(new, old, mask, adv, loss_type=loss_type, normaliser=norm, **CLIP)
    assert out.loss.item() == pytest.approx(want, abs=1e-6)
    assert out.clip_fraction.item() == pytest.approx(2 / 3)  # A1 and B1
    assert out.ratio.item() == pytest.approx((1.5 + 0.9 + 0.5) / 3)
    assert out.kl.item() == 0 and out.tokens == 3
    out.loss.backward()
    grad = new.grad
    assert torch.isfinite(grad).all()
    # clipped tokens (A1 above 1 + epsilon_high with A > 0, B1 below 1 - epsilon with A < 0)
    # and masked tokens have exactly 0 gradient; A2: d/dnew of -rho A / n = -0.9 / n
    a2 = {"grpo": -0.9 / 2 / 2, "dapo": -0.9 / 3, "dr_grpo": -0.9 / 8}[loss_type]
    assert grad[0, 1].item() == pytest.approx(a2)
    assert grad[0, 0].item() == 0.0 and grad[1, 0].item() == 0.0
    assert grad[0, 2].item() == 0.0 and grad[1, 1].item() == 0.0 and grad[1, 2].item() == 0.0


def test_k3_kl_by_hand():
    new, old, mask, adv = two_sequences()
    ref = torch.where(mask.bool(), new.detach(), torch.tensor(float("nan")))
    ref[0, 0] += math.log(2)  # d = ref - new = ln 2: K3 = 2 - ln 2 - 1
    k3 = 1 - math.log(2)
    out = token_loss(new, old, mask, adv, loss_type="dapo", normaliser=3.0, beta=0.1,
                     logp_ref=ref, **CLIP)
    assert out.loss.item() == pytest.approx((-1.28 - 0.9 + 0.4 + 0.1 * k3) / 3, abs=1e-6)
    assert out.kl.item() == pytest.approx(k3 / 3)
    out.loss.backward()
    # A1's policy term is clipped; its KL gradient: beta (1 - exp(d)) / 3 = 0.1 (1 - 2) / 3
    assert new.grad[0, 0].item() == pytest.approx(-0.1 / 3)
    assert new.grad[0, 2].item() == 0.0
    with pytest.raises(ValueError, match="logp_ref"):
        token_loss(new, old, mask, adv, loss_type="dapo", normaliser=3.0, beta=0.1, **CLIP)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_ratio_is_one_at_the_first_update(loss_type):
    old = torch.tensor([[-0.7, -1.3, -2.0], [-0.1, -0.4, -3.0]])
    new = old.clone().requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    adv = torch.tensor([[0.5, 0.5, 9.0], [-1.0, 2.0, 1.0]])  # per token
    norm = step_normaliser(loss_type, [2, 3], max_tokens=3)
    out = token_loss(new, old, mask, adv, loss_type=loss_type, normaliser=norm, **CLIP)
    assert out.ratio.item() == 1.0 and out.clip_fraction.item() == 0.0
    weighted = {"grpo": -((0.5 + 0.5) / 2 + (-1 + 2 + 1) / 3) / 2,
                "dapo": -(0.5 + 0.5 - 1 + 2 + 1) / 5, "dr_grpo": -(0.5 + 0.5 - 1 + 2 + 1) / 6}
    assert out.loss.item() == pytest.approx(weighted[loss_type])
    out.loss.backward()
    assert new.grad[0, 2].item() == 0.0  # masked, though its advantage is 9
    if loss_type == "dapo":
        close(new.grad, [[-0.1, -0.1, 0.0], [0.2, -0.4, -0.2]])  # -A / 5


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_gradient_accumulation_sums_to_the_whole_step(loss_type):
    new, old, mask, adv = two_sequences()
    norm = step_normaliser(loss_type, mask.sum(-1).tolist(), max_tokens=4)
    whole = token_loss(new, old, mask, adv, loss_type=loss_type, normaliser=norm, **CLIP).loss
    parts = sum(token_loss(new[i:i + 1], old[i:i + 1], mask[i:i + 1], adv[i:i + 1],
                           loss_type=loss_type, normaliser=norm, **CLIP).loss for i in (0, 1))
    assert parts.item() == pytest.approx(whole.item(), abs=1e-7)


@pytest.mark.parametrize("loss_type", ["grpo", "dapo", "dr_grpo"])
def test_empty_masks_and_zero_length_sequences_give_zero_not_nan(loss_type):
    for shape in ((2, 3), (2, 0), (0, 0)):
        new = torch.full(shape, float("nan"), requires_grad=True)
        mask = torch.zeros(shape, dtype=torch.long)
        norm = step_normaliser(loss_type, [0] * shape[0], max_tokens=4)
        out = token_loss(new, torch.full(shape, BAD), mask, torch.zeros(shape[0]),
                         loss_type=loss_type, normaliser=norm, beta=0.1,
                         logp_ref=torch.full(shape, BAD), **CLIP)
        assert out.loss.item() == 0.0 and out.tokens == 0
        assert out.kl.item() == 0.0 and out.ratio.item() == 0.0
        out.loss.backward()
        assert (new.grad == 0).all()


def test_zero_advantage_group_contributes_nothing():
    adv = episode_advantages(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), "group")
    new = torch.tensor([[-0.5, -1.0], [-2.0, -0.1]], requires_grad=True)
    out = token_loss(new, new.detach() - 0.3, torch.ones(2, 2), adv, loss_type="dapo",
                     normaliser=4.0, **CLIP)
    out.loss.backward()
    assert out.loss.item() == 0.0 and (new.grad == 0).all()


def test_normaliser_and_unknown_loss_type():
    assert step_normaliser("grpo", [3, 0, 2], 10) == 3.0
    assert step_normaliser("dapo", [3, 0, 2], 10) == 5.0
    assert step_normaliser("dr_grpo", [3, 0, 2], 10) == 30.0
    assert step_normaliser("dapo", [], 10) == 1.0
    with pytest.raises(ValueError, match="loss_type"):
        step_normaliser("ppo", [1], 10)
    with pytest.raises(ValueError, match="loss_type"):
        token_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1),
                   loss_type="ppo", normaliser=1.0, **CLIP)


# --- constrained decoding -----------------------------------------------------------------

def test_masked_logprobs_renormalise_over_the_allowed_tokens():
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 5.0]], requires_grad=True)
    allowed = torch.tensor([[True, True, False], [True, True, True]])
    got = masked_logprobs(logits, allowed, torch.tensor([0, 2]))
    # row 0: log(e^2 / (e^2 + e)) against the unmasked 2 - log(e^2 + e + 1); row 1 unmasked
    masked0 = -math.log(1 + math.exp(-1))
    assert got[0].item() == pytest.approx(masked0)
    assert got[0].item() != pytest.approx(2 - math.log(math.exp(2) + math.e + 1))
    assert got[1].item() == pytest.approx(logits[1].log_softmax(-1)[2].item())
    got.sum().backward()
    assert logits.grad[0, 2].item() == 0.0  # a forbidden token gets no gradient
    assert torch.isfinite(logits.grad).all()


def test_masked_ratio_ignores_what_the_grammar_forbids():
    # the update moves only a forbidden token's logit: the masked ratio stays exactly 1, the
    # unmasked one would not (the bias of using the unconstrained distribution)
    old = torch.tensor([[2.0, 1.0, 0.0]])
    new = torch.tensor([[2.0, 1.0, 3.0]])
    allowed, token = torch.tensor([[True, True, False]]), torch.tensor([0])
    masked = masked_logprobs(new, allowed, token) - masked_logprobs(old, allowed, token)
    assert masked.exp().item() == 1.0
    full = torch.ones_like(allowed)
    assert (masked_logprobs(new, full, token) - masked_logprobs(old, full, token)).exp() < 0.5


def test_masked_logprobs_reject_a_token_the_grammar_forbids():
    with pytest.raises(ValueError, match="outside its allowed set"):
        masked_logprobs(torch.zeros(1, 3), torch.tensor([[True, False, False]]), torch.tensor([1]))
    with pytest.raises(ValueError, match="must match"):
        masked_logprobs(torch.zeros(1, 3), torch.ones(1, 2, dtype=torch.bool), torch.tensor([0]))


# --- config -------------------------------------------------------------------------------

def test_config_defaults_and_help():
    from dataclasses import fields

    cfg = GRPOConfig()
    assert (cfg.enabled, cfg.init, cfg.loss_type, cfg.beta, cfg.scale_rewards) == (
        False, "dpo_step", "dapo", 0.0, "group")
    assert all(f.metadata.get("help") for f in fields(GRPOConfig))


@pytest.mark.parametrize("kwargs,match", [
    ({"init": "sft"}, "grpo.init"), ({"loss_type": "ppo"}, "grpo.loss_type"),
    ({"scale_rewards": "std"}, "grpo.scale_rewards"), ({"group_size": 1}, "grpo.group_size"),
    ({"steps": 0}, "grpo.steps"), ({"num_iterations": 0}, "grpo.num_iterations"),
    ({"epsilon": 0.3, "epsilon_high": 0.2}, "grpo.epsilon_high"), ({"beta": -1}, "grpo.beta"),
    ({"lr": 0}, "grpo.lr"), ({"format_cap": 0.6, "length_cap": 0.5}, "outcome"),
    ({"gamma": 1.5}, "grpo.gamma"), ({"max_resample": -1}, "grpo.max_resample"),
])
def test_config_errors_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GRPOConfig(**kwargs)


def test_clip_higher_lets_a_ratio_between_the_two_bounds_learn():
    # ratio 1.25 with A > 0: inside 1 + epsilon_high (1.28), outside a symmetric 1.2 clip
    old = torch.tensor([[-1.0]])
    for high, grad in ((0.28, -1.25), (0.2, 0.0)):
        new = (old + math.log(1.25)).requires_grad_()
        out = token_loss(new, old, torch.ones(1, 1), torch.tensor([1.0]), epsilon=0.2,
                         epsilon_high=high, loss_type="dapo", normaliser=1.0)
        out.loss.backward()
        assert new.grad.item() == pytest.approx(grad)
        assert out.clip_fraction.item() == (1.0 if grad == 0 else 0.0)
