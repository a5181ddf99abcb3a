"""PEFT (LoRA adapters), imported and called without messages that are not the user's to act on.

Where bitsandbytes is installed, peft imports it (at peft's import, and each time it builds
LoRA layers, to offer its quantised layer types), quantising or not. bitsandbytes 0.50 on a
CPU with avx512_bf16 then logs that it could not fetch the kernel of its packed-weight
inference path ("Failed to load CPU gemm_4bit_forward from kernels-community ... pip install
kernels"). This project never runs that path (a LoRA run has no 4-bit layer, and QLoRA keeps
its layers off it: training/model.py), so `import_peft` drops that one message.

peft 0.21 reads transformers 5's deprecated `is_gradient_checkpointing` when it wraps a model,
a FutureWarning from peft's own line: `quiet_peft` ignores that one warning.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

KERNEL_NOTE = "Failed to load CPU gemm_4bit_forward"


def drop_kernel_note() -> None:
    """From now on, bitsandbytes' note about its avx512_bf16 inference kernel is not logged."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_not_kernel_note)


def _not_kernel_note(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(KERNEL_NOTE)


def import_peft():
    """The peft module (which may import bitsandbytes), bitsandbytes' kernel note dropped."""
    drop_kernel_note()
    import peft

    return peft


@contextmanager
def quiet_peft() -> Iterator[None]:
    """Inside: peft's read of transformers' deprecated `is_gradient_checkpointing` is silent."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                category=FutureWarning)
        yield


def merge_adapter(model, adapter: str):
    """`model` with the PEFT LoRA adapter in folder `adapter` merged into its weights."""
    peft = import_peft()
    with quiet_peft():
        return peft.PeftModel.from_pretrained(model, adapter).merge_and_unload()
