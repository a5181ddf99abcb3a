"""A DPO step and a GRPO step in bfloat16 against float32 (the named baseline), same data.

`train.dtype: bfloat16` loads the frozen base in bfloat16; PEFT keeps the LoRA adapter's
weights (and so AdamW's master copy and its state) in float32 and casts at the adapter's
input, so only the base's matmuls run in bf16. This prints, per dtype, side by side in one
process (alternating, `--repeats` times, so both see the same machine load):
- DPO: the reference pass and `--steps` optimizer steps on 8 MiniShop step pairs
  (benchmarks/minishop_pairs.py), their seconds and losses (at step 1 the policy is the
  reference, so a loss other than ln 2 is the dtype's rounding between the two passes);
- GRPO: `--steps` online GRPO steps from a fresh adapter on MiniShop train tasks (rollouts
  through the model being trained, then the update), seconds per step split into rollouts
  and update, and the step's mean reward;
and the ratios, plus the adapter parameters' dtype after training (float32 expected).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/train_dtype.py --steps 2 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from minishop_pairs import step_pairs  # noqa: E402

DTYPES = ("float32", "bfloat16")
MODEL = "embedded:smollm2-135m-instruct"


def dpo(dtype: str, pairs, args) -> dict:
    """Load, reference pass, `args.steps` optimizer steps: seconds, losses, adapter dtype."""
    from accelerate import Accelerator

    from offline_agent.training import dpo as dpo_loss
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.logprobs import encode_pair
    from offline_agent.training.model import add_lora, load_base
    from offline_agent.training.trainer import train

    cfg = TrainConfig(batch_size=len(pairs), epochs=args.steps, max_steps=args.steps,
                      save_every=10**6, lora_r=16, lora_alpha=32, dtype=dtype)
    model, tokenizer = load_base(MODEL, cfg, "cpu")
    model = add_lora(model, cfg)
    items = [list(encode_pair(tokenizer, p)) for p in pairs]
    began = time.perf_counter()
    ref = dpo_loss.reference_logps(model, items, cfg.pack_tokens)
    reference = time.perf_counter() - began
    steps: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        train(model, dpo_loss.DPOObjective(items, ref, cfg), cfg, Path(out),
              Accelerator(cpu=True), on_metrics=lambda s, x: steps.append(x))
    dtypes = {str(p.dtype) for n, p in model.named_parameters() if "lora_" in n}
    step_s = [s["seconds"] for s in steps]
    return {"seconds": reference + sum(step_s), "reference_s": reference,
            "step_s": sum(step_s) / len(step_s), "loss": [s["loss"] for s in steps],
            "adapter_dtype": ",".join(sorted(dtypes))}


def grpo(dtype: str, args) -> dict:
    from offline_agent.envs.base import load_env
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.grpo.config import GRPOConfig
    from offline_agent.training.grpo.train import fit_grpo

    steps: list[dict] = []
    began = [time.perf_counter()]

    def on_metrics(step: int, m: dict) -> None:
        now = time.perf_counter()
        steps.append({**m, "step_seconds": now - began[0]})
        began[0] = now

    env = load_env("minishop", seed=0, max_steps=8)
    cfg = GRPOConfig(steps=args.steps, group_size=4, tasks_per_step=2, lr=1e-5,
                     save_every=10**6)
    with tempfile.TemporaryDirectory() as out:
        began[0] = time.perf_counter()
        fit_grpo(MODEL, None, lambda: load_env("minishop", seed=0, max_steps=8),
                 env.tasks("train", 8), cfg, TrainConfig(dtype=dtype, lora_r=16), Path(out),
                 seed=0, max_batch=32, on_metrics=on_metrics)
    update = sum(s.get("update_seconds", 0.0) for s in steps) / len(steps)
    total = sum(s["step_seconds"] for s in steps) / len(steps)
    return {"step_s": total, "update_s": update, "rollout_s": total - update,
            "reward": [round(s["reward_mean"], 3) for s in steps]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each dtype, alternating")
    ap.add_argument("--pairs", type=int, default=8)
    args = ap.parse_args()
    pairs = step_pairs(args.pairs)
    runs: dict = {(kind, d): [] for kind in ("dpo", "grpo") for d in DTYPES}
    for _ in range(args.repeats):
        for d in DTYPES:
            runs["dpo", d].append(dpo(d, pairs, args))
            print(f"dpo  {d:9s} {runs['dpo', d][-1]}", flush=True)
        for d in DTYPES:
            runs["grpo", d].append(grpo(d, args))
            print(f"grpo {d:9s} {runs['grpo', d][-1]}", flush=True)

    def mean(kind: str, d: str, key: str) -> float:
        return sum(r[key] for r in runs[kind, d]) / len(runs[kind, d])

    print(f"\n{args.repeats} repeat(s), {args.steps} step(s) each")
    for key in ("reference_s", "step_s", "seconds"):
        a, b = mean("dpo", "float32", key), mean("dpo", "bfloat16", key)
        print(f"DPO  {key:12s} float32 {a:7.1f} s  bfloat16 {b:7.1f} s  {a / b:.2f}x")
    for key in ("rollout_s", "update_s", "step_s"):
        a, b = mean("grpo", "float32", key), mean("grpo", "bfloat16", key)
        print(f"GRPO {key:12s} float32 {a:7.1f} s  bfloat16 {b:7.1f} s  {a / b:.2f}x")
    print("adapter dtype after bf16 training: " + runs["dpo", "bfloat16"][0]["adapter_dtype"])


if __name__ == "__main__":
    main()
