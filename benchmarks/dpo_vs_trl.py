"""Our DPO trainer vs trl.DPOTrainer: the same step-level pairs, model, LoRA config and batch size.

Step pairs come from MiniShop states (benchmarks/minishop_pairs.py: the env's real system
prompt, demonstration and observations). Each trainer runs in its own child process, both
at once (so both see the same load on a shared machine). Each child prints a line per
optimizer step as it goes; the parent reports each side as soon as it ends, and at
`--time-limit` seconds it cuts a side still running and reports it as a bound: k of n steps
done in t seconds of training means at least t / (k + 1) seconds per step (step k + 1 had
begun) and at most the tokens of k + 1 steps over t tokens/s.

Training tokens/s counts the same tokens for both: the lengths of prompt+chosen and
prompt+rejected of every pair trained on (our encoding), over every step (the first
included, for both). TRL trains with its own defaults otherwise: gradient checkpointing on
(DPOConfig's default; ours is off), its reference pass inside every step (ours once, before
training, reported apart).

Peak memory, the same for both: the kernel's high-water mark of the child's resident memory
(VmHWM, /proc/<pid>/status), reset by the child (/proc/self/clear_refs) once the model,
adapter and data are ready, so it counts what training adds; the child reports it after
every step and at exit, and the parent reads it itself right before cutting a child. On
GPU the same figure is host memory; torch.cuda.max_memory_allocated is printed beside it.

    PYTHONPATH=. .venv/bin/python benchmarks/dpo_vs_trl.py --pairs 24 --batch-size 8 --steps 3
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def status(key: str, pid: str = "self") -> int:
    """A /proc/<pid>/status field in bytes (0 once the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return next(int(x.split()[1]) * 1024 for x in lines if x.startswith(key + ":"))


def emit(kind: str, **data) -> None:
    print(f"{kind} " + json.dumps(data), flush=True)


def ready(**settings) -> None:
    """Reset this process's peak RSS to what it holds now; tell the parent."""
    import torch

    Path("/proc/self/clear_refs").write_text("5")
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    emit("READY", rss=status("VmRSS"), **settings)


def step_done(step: int, seconds: float) -> None:
    import torch

    cuda = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    emit("STEP", step=step, seconds=seconds, hwm=status("VmHWM"), cuda=cuda)


def run_ours(args, pairs) -> None:
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
    ready(gradient_checkpointing=cfg.gradient_checkpointing)
    began = time.perf_counter()
    ref = reference_logps(model, items, cfg.pack_tokens)
    emit("REFERENCE", seconds=time.perf_counter() - began)
    with tempfile.TemporaryDirectory() as out:
        train(model, DPOObjective(items, ref, cfg), cfg, Path(out), accelerator,
              on_metrics=lambda s, m: step_done(s, m["seconds"]))


def run_trl(args, pairs) -> None:
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
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.0,
                      target_modules=TrainConfig().target_modules, task_type="CAUSAL_LM")
    began = [0.0]

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            began[0] = time.perf_counter()

        def on_step_end(self, a, state, *rest, **k):
            step_done(state.global_step, time.perf_counter() - began[0])

    with tempfile.TemporaryDirectory() as out:
        config = DPOConfig(output_dir=out, per_device_train_batch_size=args.batch_size,
                           max_steps=args.steps, learning_rate=1e-5, beta=0.1, max_length=None,
                           report_to="none", save_strategy="no", logging_steps=1,
                           use_cpu=not cuda, bf16=cuda, dataloader_num_workers=0, seed=0)
        trainer = DPOTrainer(model=model, args=config, train_dataset=data,
                             processing_class=tok, peft_config=lora, callbacks=[Timer()])
        ready(gradient_checkpointing=config.gradient_checkpointing)
        trainer.train()


def child(args) -> None:
    from minishop_pairs import step_pairs
    from transformers import AutoTokenizer

    from offline_agent.policy.models import resolve_model
    from offline_agent.training.logprobs import encode_pair

    pairs = step_pairs(args.pairs)
    tok = AutoTokenizer.from_pretrained(resolve_model(args.model))
    emit("PAIRS", tokens=[sum(len(s.ids) for s in encode_pair(tok, p)) for p in pairs])
    (run_ours if args.child == "ours" else run_trl)(args, pairs)
    emit("DONE", hwm=status("VmHWM"))


class Side:
    """What the parent knows of one child, from its lines."""

    def __init__(self, name: str, args):
        self.name, self.args = name, args
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--child", name],
                                     stdout=subprocess.PIPE, stderr=self.err, text=True)
        self.tokens: list[int] = []
        self.rss = self.hwm = self.cuda = 0
        self.settings: dict = {}
        self.reference = None
        self.steps: list[float] = []
        self.ready_at = None
        self.cut_after = None  # seconds of training when cut at the time limit
        self.finished = False

    def read(self, lines: queue.Queue) -> None:
        for line in self.proc.stdout:
            kind, _, data = line.partition(" ")
            if kind in ("PAIRS", "READY", "REFERENCE", "STEP", "DONE"):
                lines.put((self, kind, json.loads(data)))
        lines.put((self, "EOF", {}))

    def take(self, kind: str, data: dict) -> None:
        if kind == "PAIRS":
            self.tokens = data["tokens"]
        elif kind == "READY":
            self.rss, self.ready_at = data.pop("rss"), time.monotonic()
            self.settings = data
        elif kind == "REFERENCE":
            self.reference = data["seconds"]
        elif kind in ("STEP", "DONE"):
            self.hwm = max(self.hwm, data["hwm"])
            self.cuda = max(self.cuda, data.get("cuda", 0))
            if kind == "STEP":
                self.steps.append(data["seconds"])

    def step_tokens(self, n: int) -> int:
        """Tokens of the first n steps: pairs in order, cycling (the same count for both)."""
        b = self.args.batch_size
        return sum(self.tokens[i % len(self.tokens)] for i in range(n * b))

    def cut(self) -> None:
        self.hwm = max(self.hwm, status("VmHWM", str(self.proc.pid)))
        self.cut_after = time.monotonic() - self.ready_at if self.ready_at else 0.0
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def result(self) -> dict:
        """s/step and tokens/s over every step; bounds (and bound=True) when cut."""
        peak = self.hwm - self.rss if self.hwm else 0
        if self.cut_after is None:
            secs = sum(self.steps)
            return {"s_step": secs / len(self.steps), "bound": False, "peak": peak,
                    "tps": self.step_tokens(len(self.steps)) / secs}
        train = max(self.cut_after - (self.reference or 0.0), 0.0)
        begun = len(self.steps) + 1
        return {"s_step": train / begun, "tps": self.step_tokens(begun) / max(train, 1e-9),
                "bound": True, "peak": peak}

    def line(self) -> str:
        r = self.result()
        ref = (f"reference {self.reference:.1f} s once" if self.reference is not None
               else "reference in each step")
        gc = "on" if self.settings.get("gradient_checkpointing") else "off"
        cuda = f", cuda max allocated {self.cuda / 2**20:.0f} MiB" if self.cuda else ""
        if r["bound"]:
            done = ", ".join(f"{x:.1f}" for x in self.steps) or "none"
            return (f"{self.name:>5}: CUT at the time limit after {len(self.steps)} of "
                    f"{self.args.steps} steps (done in {done} s; {self.cut_after:.0f} s since "
                    f"ready, {ref}): >= "
                    f"{r['s_step']:.1f} s/step, <= {r['tps']:.0f} train tokens/s; peak >= "
                    f"{r['peak'] / 2**20:.0f} MiB above ready (VmHWM {self.hwm / 2**20:.0f} MiB)"
                    f"; gradient checkpointing {gc}{cuda}")
        return (f"{self.name:>5}: {r['tps']:8.0f} train tokens/s over {len(self.steps)} steps "
                f"({r['s_step']:.1f} s/step; {ref}), peak {r['peak'] / 2**20:.0f} MiB above "
                f"ready (VmHWM {self.hwm / 2**20:.0f} MiB); gradient checkpointing {gc}{cuda}")


def watch(sides: list[Side], limit: float) -> None:
    """Print each step and each side as it ends; cut what still runs after `limit` s."""
    lines: queue.Queue = queue.Queue()
    for s in sides:
        threading.Thread(target=s.read, args=(lines,), daemon=True).start()
    start = time.monotonic()
    while not all(s.finished for s in sides):
        try:
            side, kind, data = lines.get(timeout=1.0)
        except queue.Empty:
            side = kind = None
        if side is not None and not side.finished:
            side.take(kind, data)
            if kind == "STEP":
                print(f"  [{time.monotonic() - start:6.0f} s] {side.name}: step {data['step']} "
                      f"of {side.args.steps} in {data['seconds']:.1f} s", flush=True)
            if kind == "EOF":
                side.finished = True
                if side.proc.wait() or not side.steps:
                    side.err.seek(0)
                    sys.exit(f"{side.name} failed:\n{side.err.read()[-3000:]}")
                print(side.line(), flush=True)
        if time.monotonic() - start > limit:
            for s in sides:
                if not s.finished:
                    s.cut()
                    s.finished = True
                    print(s.line(), flush=True)


def run_sides(sides: list[Side], limit: float) -> None:
    """Watch the children to the end or the limit; kill any still running, however it ends."""
    try:
        watch(sides, limit)
    finally:
        for side in sides:
            if side.proc.poll() is None:
                side.proc.kill()


def compare(ours: dict, trl: dict) -> str:
    """ours/trl ratios, with >= / <= where a side was cut."""
    if ours["bound"] and trl["bound"]:
        return "both sides cut: no ratio"
    speed = ">=" if trl["bound"] else "<=" if ours["bound"] else "="
    memory = "<=" if trl["bound"] else ">=" if ours["bound"] else "="
    return (f"speed: ours/trl {speed} {ours['tps'] / trl['tps']:.2f}x tokens/s; "
            f"memory: ours/trl {memory} {ours['peak'] / max(trl['peak'], 1):.2f}x peak")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded:smollm2-135m-instruct")
    ap.add_argument("--pairs", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--pack-tokens", type=int, default=3072)
    ap.add_argument("--time-limit", type=float, default=1200.0,
                    help="seconds after which a side still running is cut and reported as a bound")
    ap.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    print(f"{args.pairs} MiniShop step pairs, batch {args.batch_size}, {args.steps} steps, "
          f"LoRA r={args.lora_r}, time limit {args.time_limit:.0f} s; "
          f"{os.cpu_count()} CPUs, both trainers at once", flush=True)
    sides = [Side("ours", args), Side("trl", args)]
    run_sides(sides, args.time_limit)
    mean = sum(sides[0].tokens) / max(len(sides[0].tokens), 1)
    print(f"{mean:.0f} tokens per pair (prompt+chosen + prompt+rejected)")
    print(compare(sides[0].result(), sides[1].result()))


if __name__ == "__main__":
    main()
