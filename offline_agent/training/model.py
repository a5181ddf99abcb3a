"""The model a policy trains: the base (optionally 4-bit, QLoRA) with a fresh LoRA adapter.

With LoRA the reference model is the same network with its adapter disabled, so DPO holds
one model in memory.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

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
    kwargs = {"dtype": dtype}
    if cfg.quantization == "4bit":
        if adapter:
            raise ValueError("train.quantization=4bit cannot start from model.adapter: merge "
                             "the adapter into a full model first (train.merge) and train that")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=dtype)
        kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if cfg.quantization == "none":
        model = model.to(device)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    return model, tokenizer


def add_lora(model, cfg: TrainConfig):
    """Wrap `model` in a fresh LoRA adapter (seeded init); gradient checkpointing if asked."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.quantization == "4bit":
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=cfg.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False})
    elif cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    torch.manual_seed(cfg.seed)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def write_merged(model_id: str, adapter: str, out: str, cfg: TrainConfig,
                 base_adapter: str | None = None) -> None:
    """A full model with the adapter merged in, from a fresh full-precision base (also after
    QLoRA, whose base weights are 4-bit), with the tokenizer. `base_adapter`: the previous
    policy the adapter was trained on top of (fit_policy's `adapter`), merged in first."""
    from peft import PeftModel

    plain = TrainConfig(**{**vars(cfg), "quantization": "none"})
    base, tokenizer = load_base(model_id, plain, "cpu", base_adapter)
    merged = PeftModel.from_pretrained(base, adapter).merge_and_unload()
    merged.save_pretrained(out)
    tokenizer.save_pretrained(out)
