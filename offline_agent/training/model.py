"""The model a policy trains: the base (optionally 4-bit, QLoRA) with a fresh LoRA adapter.

With LoRA the reference model is the same network with its adapter disabled, so DPO holds
one model in memory.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from offline_agent.cpu_dtype import warn_if_emulated_bf16
from offline_agent.optional_deps import require
from offline_agent.policy.adapters import drop_kernel_note, import_peft, merge_adapter, quiet_peft
from offline_agent.policy.models import resolve_model

from .config import TrainConfig


def train_dtype(cfg: TrainConfig, device: str) -> torch.dtype:
    """auto: bfloat16 on a GPU that supports it, else float32 (bf16 matmuls are slow on CPU)."""
    if cfg.dtype == "auto":
        bf16 = device.startswith("cuda") and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.dtype]


def load_base(model_id: str, cfg: TrainConfig, device: str, adapter: str | None = None):
    """(model, tokenizer): the base in the training dtype, 4-bit when cfg.quantization says so.
    `adapter` (a previous policy) is merged in first, so it becomes this training's reference."""
    path = resolve_model(model_id)
    tokenizer = AutoTokenizer.from_pretrained(path)
    dtype = train_dtype(cfg, device)
    warn_if_emulated_bf16(dtype, device, "train.dtype (grpo.dtype in GRPO)")
    if cfg.quantization == "4bit":
        if adapter:
            raise ValueError("train.quantization=4bit cannot start from model.adapter: merge "
                             "the adapter into a full model first (train.merge) and train that")
        return load_4bit(path, dtype, device), tokenizer
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    if adapter:
        model = merge_adapter(model, adapter)
    return model, tokenizer


def load_4bit(path: str, dtype: torch.dtype, device: str):
    """QLoRA's base: linear weights in NF4 (bitsandbytes, double-quantised), computing in
    `dtype`, every forward on bitsandbytes' training path.

    On a CPU with avx512_bf16, bitsandbytes 0.50 runs a 4-bit layer in eval mode without grad
    (the DPO reference pass) through a fused kernel: it first repacks the layer's weights,
    which fails unless in_features is a multiple of the blocksize (64) and out_features of
    32 (the tiny test model's 32 in: a reshape error), and the repacked layer then runs
    every later forward through that kernel, which passes no gradient to the layer's input
    (training gradients wrong) and differs from the training forward numerically. The
    layers here keep the one path that trains, on every CPU: any dims, a reference pass that
    is the training forward, the same numbers with and without avx512_bf16."""
    drop_kernel_note()  # about the kernel of the path the layers are kept off, below
    bnb = require("bitsandbytes")
    from transformers import BitsAndBytesConfig

    quantization = BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map={"": device},
                                                 quantization_config=quantization)
    for layer in model.modules():
        if isinstance(layer, bnb.nn.Linear4bit):
            layer.support_avx512bf16_for_cpu = False
    return model


def add_lora(model, cfg: TrainConfig):
    """Wrap `model` in a fresh LoRA adapter (seeded init); gradient checkpointing if asked."""
    peft = import_peft()
    if cfg.quantization == "4bit":  # freeze the base, cast its other weights to float32
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if cfg.gradient_checkpointing:  # non-reentrant: inputs need not require grad
        model.activation_checkpointing_enable(
            activation_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(cfg.seed)
    lora = peft.LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                           lora_dropout=cfg.lora_dropout,
                           target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    with quiet_peft():
        return peft.get_peft_model(model, lora)


def write_merged(model_id: str, adapter: str, out: str, cfg: TrainConfig,
                 base_adapter: str | None = None) -> None:
    """A full model with the adapter merged in, from a fresh full-precision base (also after
    QLoRA, whose base weights are 4-bit), with the tokenizer. `base_adapter`: the previous
    policy the adapter was trained on top of (fit_policy's `adapter`), merged in first."""
    plain = TrainConfig(**{**vars(cfg), "quantization": "none"})
    base, tokenizer = load_base(model_id, plain, "cpu", base_adapter)
    merged = merge_adapter(base, adapter)
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
