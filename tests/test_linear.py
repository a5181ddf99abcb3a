"""OneDNNLinear: the same function as nn.Linear, on oneDNN only where no gradient is taken."""

from __future__ import annotations

import pytest
import torch

from offline_agent.policy.hf import HFPolicy
from offline_agent.policy.linear import OneDNNLinear, on_x86_with_onednn, use_onednn_linear

X86 = on_x86_with_onednn()


def layer(bias: bool) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(0)
    plain = torch.nn.Linear(48, 80, bias=bias)
    fast = torch.nn.Linear(48, 80, bias=bias)
    fast.load_state_dict(plain.state_dict())
    fast.__class__ = OneDNNLinear
    return plain, fast


@pytest.mark.skipif(not X86, reason="oneDNN linear is switched on only on x86 CPUs")
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 48), (5, 48), (3, 7, 48)])
def test_no_grad_forward_equals_nn_linear(bias, shape):
    plain, fast = layer(bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        expected, out = plain(x), fast(x)
    assert out.shape == expected.shape
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_with_grad_it_is_nn_linear_and_trains():
    plain, fast = layer(bias=True)
    x = torch.randn(4, 48, requires_grad=True)
    y = x.detach().clone().requires_grad_()
    plain(x).square().sum().backward()
    fast(y).square().sum().backward()
    assert torch.equal(x.grad, y.grad)
    assert torch.equal(plain.weight.grad, fast.weight.grad)


@pytest.mark.skipif(not X86, reason="oneDNN linear is switched on only on x86 CPUs")
def test_policy_switches_float32_linears_and_keeps_weights(tiny_model_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([tokenizer("Find a red mug under $20").input_ids])
    with torch.no_grad():
        before = model(ids).logits
    HFPolicy(model, tokenizer)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is OneDNNLinear for m in linears)
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, before, atol=1e-4, rtol=1e-4)


def test_other_dtypes_are_left_alone(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    use_onednn_linear(model)
    assert all(type(m) is torch.nn.Linear for m in model.modules()
               if isinstance(m, torch.nn.Linear))
