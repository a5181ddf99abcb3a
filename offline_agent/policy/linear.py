"""Linear layers through oneDNN instead of MKL on x86 CPUs, for inference in float32.

torch's `nn.Linear` on CPU calls MKL's sgemm. At the row counts a decode step has (1 to 16
rows: search decodes a few short actions at a time), MKL streams each weight from memory
slower than oneDNN's kernel for the same float32 weight, and at 2 to 8 rows it costs about
twice its 1-row product. On the idle 2-core AMD EPYC with avx512, a decode step of the
embedded model at context 970 ran 1.21-1.76x faster at 2 to 8 rows, 1.29x at 1 and 1.05x at
16, search's sampled call of 48 rows 1.32x, greedy MiniShop episodes 1.11x, a prefill 0.94x
(`benchmarks/decode_levers.py --levers onednn --threads 2`, docs/performance.md); on one
with AVX2 only, 1.11-1.31x at 2 to 16 rows, 0.94x at 1, a prefill 1.00x. Outputs
differ from MKL's by float rounding (~1e-6 relative), the size of the difference between two
batch shapes.

Only where no gradient is taken: torch's oneDNN linear op has no backward, so a model that
is trained while a policy holds it (GRPO) trains through `nn.Linear` as before.
"""

from __future__ import annotations

import torch

from ..cpu_dtype import on_x86


class OneDNNLinear(torch.nn.Linear):
    """`nn.Linear` (same parameters, same state dict) whose no-grad forward runs on oneDNN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled():
            return super().forward(x)
        return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")


def on_x86_with_onednn() -> bool:
    """The CPUs where it was measured (x86 with avx512, and with AVX2 only), with torch's
    oneDNN built in."""
    return torch.backends.mkldnn.is_available() and on_x86()


def use_onednn_linear(model: torch.nn.Module) -> None:
    """Switch the float32 linear layers of a model on an x86 CPU to OneDNNLinear. Left as they
    are: GPUs, other dtypes and other CPUs, where it has not been measured."""
    if model.device.type != "cpu" or not on_x86_with_onednn():
        return
    for module in model.modules():
        if type(module) is torch.nn.Linear and module.weight.dtype == torch.float32:
            module.__class__ = OneDNNLinear
