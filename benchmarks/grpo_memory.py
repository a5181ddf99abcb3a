"""Peak resident memory of one MiniShop GRPO step, by the training settings that should bound
it, against the defaults (the named baseline).

A GRPO step samples G episodes of each of its tasks (MiniShop, up to 8 turns) and then runs
the update: forward and backward over packed tries of at most `train.pack_tokens` tokens,
whose activations backward keeps. Each setting runs one step from a fresh adapter on the
embedded model in its own child process, one after the other (so two peaks never add up);
the rollouts are seeded, so every setting updates on the same episodes. Printed per setting:
the child's VmHWM (the kernel's high-water mark of its resident memory; it covers loading,
rollouts and the update), the update's seconds and loss, and both as ratios to the defaults.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/grpo_memory.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dpo_vs_trl import emit, status

MODEL = "embedded:smollm2-135m-instruct"
SETTINGS = {  # name: train-config overrides
    "defaults": {},
    "gradient_checkpointing": {"gradient_checkpointing": True},
    "pack_tokens 1024": {"pack_tokens": 1024},
}


def one_step(overrides: dict, args) -> dict:
    """In the child: one GRPO step; its figures and the process's VmHWM."""
    from offline_agent.envs.base import load_env
    from offline_agent.training.config import TrainConfig
    from offline_agent.training.grpo.config import GRPOConfig
    from offline_agent.training.grpo.train import fit_grpo

    seen: list[dict] = []

    def make_env():
        return load_env("minishop", seed=args.seed, max_steps=8)

    cfg = GRPOConfig(steps=1, group_size=4, tasks_per_step=args.tasks, lr=5e-5,
                     save_every=10**6)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        fit_grpo(MODEL, None, make_env, make_env().tasks("train", args.tasks), cfg,
                 TrainConfig(lora_r=16, **overrides), Path(out), seed=0, max_batch=32,
                 on_metrics=lambda s, m: seen.append(m))
    m = seen[-1]
    return {"peak_mib": status("VmHWM") / 2**20, "update_s": m["update_seconds"], "loss": m["loss"],
            "agent_tokens": m["agent_tokens"], "step_s": time.perf_counter() - began}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=4, help="tasks per step (G = 4 each)")
    ap.add_argument("--seed", type=int, default=2, help="MiniShop's draw (run.seed)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        emit("RESULT", **one_step(SETTINGS[args.child], args))
        return
    results = {}
    for name in SETTINGS:
        out = subprocess.run([sys.executable, __file__, "--child", name, "--tasks",
                              str(args.tasks), "--seed", str(args.seed)],
                             capture_output=True, text=True)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{name}: the child failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
        results[name] = r = json.loads(line[7:])
        base = results["defaults"]
        print(f"{name:24s} peak {r['peak_mib']:7,.0f} MiB ({r['peak_mib'] / base['peak_mib']:.2f}x)"
              f"  update {r['update_s']:6.1f} s ({r['update_s'] / base['update_s']:.2f}x)"
              f"  loss {r['loss']:.6f}  agent tokens {r['agent_tokens']}  step {r['step_s']:.0f} s",
              flush=True)


if __name__ == "__main__":
    main()
