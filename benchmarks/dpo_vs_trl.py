"""Our DPO trainer vs trl.DPOTrainer: the same step-level pairs, model, LoRA config and batch size.

Step pairs come from MiniShop states (benchmarks/minishop_pairs.py: the env's real system
prompt, demonstration and observations). Each trainer runs in its own child
process (so peak memory is its own), both at once (so both see the same load on a shared
machine); the parent prints both and their ratios.

Training tokens/s counts the same tokens for both: the lengths of prompt+chosen and
prompt+rejected of every pair trained on (our encoding), over the steps after the first.
Peak memory: on CPU the highest RSS sampled every 10 ms during training minus the RSS
before it; on GPU torch.cuda.max_memory_allocated during training.

    .venv/bin/python benchmarks/dpo_vs_trl.py --pairs 24 --batch-size 8 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from minishop_pairs import step_pairs


class PeakMemory:
    """Peak memory of this process while the block runs, above what it held before (bytes)."""

    def __init__(self, cuda: bool):
        self.cuda, self.peak, self._stop = cuda, 0, threading.Event()

    def _rss(self) -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.cuda:
            import torch

            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
            return self
        self.base = self.peak = self._rss()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._rss())

    def __exit__(self, *exc):
        if self.cuda:
            import torch

            self.peak = torch.cuda.max_memory_allocated()
        else:
            self._stop.set()
            self._thread.join()
        self.used = self.peak - self.base


def run_ours(args, pairs, tokens) -> dict:
    from accelerate import Accelerator

    from offline_agent.training.config import TrainConfig
    from offline_agent.training.dpo import DPOObjective, reference_logps
    from offline_agent.training.logprobs import encode_pair
    from offline_agent.training.model import add_lora, load_base
    from offline_agent.training.trainer import train

    cfg = TrainConfig(batch_size=args.batch_size, max_steps=args.steps, epochs=100,
                      save_every=10**6, lr=1e-5, lora_r=args.lora_r,
                      lora_alpha=2 * args.lora_r, pack_tokens=args.pack_tokens)
    accelerator = Accelerator()
    model, tok = load_base(args.model, cfg, str(accelerator.device))
    model = add_lora(model, cfg)
    items = [list(encode_pair(tok, p)) for p in pairs]
    seconds = []
    with PeakMemory(accelerator.device.type == "cuda") as mem:
        began = time.perf_counter()
        ref = reference_logps(model, items, cfg.pack_tokens)
        ref_seconds = time.perf_counter() - began
        with tempfile.TemporaryDirectory() as out:
            train(model, DPOObjective(items, ref, cfg), cfg, Path(out), accelerator,
                  on_metrics=lambda s, m: seconds.append(m["seconds"]))
    return {"step_seconds": seconds, "reference_seconds": ref_seconds, "peak_bytes": mem.used}


def run_trl(args, pairs, tokens) -> dict:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    from offline_agent.chat import observation_role
    from offline_agent.policy.models import resolve_model
    from offline_agent.training.config import TrainConfig

    path = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(path)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    role = observation_role(tok)

    def rows(messages):
        return [{"role": role if m["role"] == "tool" else m["role"], "content": m["content"]}
                for m in messages]
    data = Dataset.from_list([{"prompt": rows(p["prompt"]), "chosen": p["chosen"],
                               "rejected": p["rejected"]} for p in pairs])
    targets = TrainConfig().target_modules
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                      target_modules=targets, task_type="CAUSAL_LM")
    seconds, began = [], [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            began[0] = time.perf_counter()

        def on_step_end(self, *a, **k):
            seconds.append(time.perf_counter() - began[0])

    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(output_dir=out, per_device_train_batch_size=args.batch_size,
                           max_steps=args.steps, learning_rate=1e-5, beta=0.1, max_length=None,
                           report_to="none", save_strategy="no", logging_steps=1,
                           use_cpu=not cuda, bf16=cuda, dataloader_num_workers=0, seed=0)
        trainer = DPOTrainer(model=model, args=config, train_dataset=data,
                             processing_class=tok, peft_config=lora, callbacks=[Timer()])
        with PeakMemory(cuda) as mem:
            trainer.train()
    return {"step_seconds": seconds, "reference_seconds": 0.0, "peak_bytes": mem.used}


def child(args) -> None:
    from transformers import AutoTokenizer

    from offline_agent.policy.models import resolve_model
    from offline_agent.training.logprobs import encode_pair

    pairs = step_pairs(args.pairs)
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    per_pair = [sum(len(s.ids) for s in encode_pair(tok, p)) for p in pairs]
    out = (run_ours if args.child == "ours" else run_trl)(args, pairs, per_pair)
    out["tokens_per_step"] = [sum(per_pair[i % len(pairs)] for i in range(s, s + args.batch_size))
                              for s in range(0, args.steps * args.batch_size, args.batch_size)]
    out["mean_pair_tokens"] = sum(per_pair) / len(per_pair)
    print("RESULT " + json.dumps(out), flush=True)


def summary(name: str, r: dict) -> dict:
    """Steady state: steps after the first (warm-up) step."""
    secs, toks = r["step_seconds"][1:], r["tokens_per_step"][1:]
    tps = sum(toks) / sum(secs)
    print(f"{name:>5}: {tps:8.0f} train tokens/s over {len(secs)} steps "
          f"({sum(secs) / len(secs):.1f} s/step; reference {r['reference_seconds']:.1f} s once), "
          f"peak {r['peak_bytes'] / 2**20:7.0f} MiB")
    return {"tps": tps, "peak": r["peak_bytes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--pack-tokens", type=int, default=3072)
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    procs = {name: subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--child", name],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for name in ("ours", "trl")}  # side by side: both see the same machine load
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate()
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            sys.exit(f"{name} failed:\n{out[-3000:]}\n{err[-3000:]}")
        results[name] = json.loads(line[-1][7:])
    print(f"{args.pairs} MiniShop step pairs ({results['ours']['mean_pair_tokens']:.0f} tokens "
          f"per pair: prompt+chosen + prompt+rejected), batch {args.batch_size}, "
          f"{args.steps} steps, LoRA r={args.lora_r}")
    ours, trl = summary("ours", results["ours"]), summary("trl", results["trl"])
    print(f"speed: ours/trl = {ours['tps'] / trl['tps']:.2f}x tokens/s; "
          f"memory: ours/trl = {ours['peak'] / max(trl['peak'], 1):.2f}x peak")


if __name__ == "__main__":
    main()
