"""The bfloat16 warning: said on an x86 CPU that emulates bfloat16, for CPU tensors only, and
by the two places a run loads a model (a policy, a training base)."""

import warnings

import pytest
import torch

from offline_agent import cpu_dtype
from offline_agent.policy.hf import HFPolicy
from offline_agent.training.config import TrainConfig
from offline_agent.training.model import load_base


@pytest.fixture
def cpu_flags(monkeypatch):
    """Set the CPU the module sees: (machine, avx512_bf16, amx_bf16)."""
    def set_cpu(machine: str, avx512_bf16: bool = False, amx_bf16: bool = False):
        monkeypatch.setattr(cpu_dtype.platform, "machine", lambda: machine)
        monkeypatch.setattr(torch.cpu, "get_capabilities",
                            lambda: {"avx512_bf16": avx512_bf16, "amx_bf16": amx_bf16})
    return set_cpu


def warned(dtype, device="cpu") -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cpu_dtype.warn_if_emulated_bf16(dtype, device, "model.dtype")
    return [str(w.message) for w in caught]


def test_warns_only_for_bfloat16_on_an_x86_cpu_that_emulates_it(cpu_flags):
    cpu_flags("x86_64")
    assert not cpu_dtype.native_bf16()
    [message] = warned(torch.bfloat16)
    assert message.startswith("model.dtype bfloat16:") and "use float32" in message
    assert warned(torch.float32) == []
    assert warned(torch.bfloat16, "cuda:0") == []


@pytest.mark.parametrize("machine, avx512_bf16, amx_bf16",
                         [("x86_64", True, False), ("AMD64", False, True), ("aarch64", False, False)])
def test_silent_where_bfloat16_is_native_or_not_judged(cpu_flags, machine, avx512_bf16, amx_bf16):
    cpu_flags(machine, avx512_bf16, amx_bf16)
    assert cpu_dtype.native_bf16()
    assert warned(torch.bfloat16) == []


def test_policy_and_training_base_say_it_when_they_load_bfloat16(cpu_flags, tiny_model_dir):
    cpu_flags("x86_64")
    with pytest.warns(UserWarning, match="^model.dtype bfloat16"):
        HFPolicy.from_pretrained(tiny_model_dir, device="cpu", dtype="bfloat16")
    with pytest.warns(UserWarning, match=r"^train.dtype \(grpo.dtype in GRPO\) bfloat16"):
        load_base(tiny_model_dir, TrainConfig(dtype="bfloat16"), "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # float32 loads say nothing
        HFPolicy.from_pretrained(tiny_model_dir, device="cpu", dtype="float32")
