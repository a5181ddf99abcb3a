"""One DPO optimizer step on 8 MiniShop step pairs: a baseline commit's training code vs this tree's.

The baseline is `offline_agent/training/` as of `--baseline` (default b1ba7ac, the code
before the trie attention), taken out of git into a temporary package; everything outside
that folder is this tree's, so only the training code differs. Each path loads the embedded
model, adds a fresh LoRA adapter (same seed), computes the reference log-probs of the pairs
(adapter disabled) and runs `--steps` optimizer steps on them with its own `train()`.

Time: the two paths run in one process, alternating, `--repeats` times each, so both see
the same machine load; the ratio is of their summed times. Losses of every step and the
adapter weights after the last step must agree to float tolerance (printed).

Peak memory: each path once more in its own child process, the same work; the peak is the
kernel's high-water mark of the child's resident memory (VmHWM in /proc/self/status), reset
through /proc/self/clear_refs after the model is loaded, so it counts what the reference
pass and the steps add (activations, gradients, optimizer state, allocator slack) and
nothing sampled: torch's own counters see only tensors, tracemalloc only Python objects.

    PYTHONPATH=. .venv/bin/python benchmarks/dpo_step.py              # timing + memory
    PYTHONPATH=. .venv/bin/python benchmarks/dpo_step.py --profile new  # where a step goes
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from minishop_pairs import step_pairs

ROOT = Path(__file__).resolve().parents[1]
MODEL = "embedded:smollm2-135m-instruct"


def baseline_package(commit: str, into: Path) -> str:
    """`offline_agent/training` at `commit`, importable as package `baseline_training`."""
    folder = into / "baseline_training"
    folder.mkdir()
    names = subprocess.run(["git", "-C", str(ROOT), "ls-tree", "--name-only", commit,
                            "offline_agent/training/"], check=True, capture_output=True,
                           text=True).stdout.split()
    for name in names:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{name}"], check=True,
                              capture_output=True, text=True).stdout
        (folder / Path(name).name).write_text(text)
    sys.path.insert(0, str(into))
    return "baseline_training"


def modules(package: str, **extra):
    return {**{name: importlib.import_module(f"{package}.{name}")
               for name in ("config", "dpo", "logprobs", "model", "trainer")}, **extra}


def all_paths(args) -> dict:
    """baseline and new (float32, as both train on CPU by default); new-bf16 if asked."""
    paths = {"baseline": modules(baseline_package(args.baseline, Path(tempfile.mkdtemp()))),
             "new": modules("offline_agent.training")}
    if args.bf16:
        paths["new-bf16"] = modules("offline_agent.training", dtype="bfloat16")
    return paths


def run_path(m: dict, pairs: list[dict], args, on_ready=lambda: None) -> dict:
    """Load, reference pass, `args.steps` steps; times, losses and the final adapter."""
    from accelerate import Accelerator

    cfg = m["config"].TrainConfig(batch_size=len(pairs), epochs=args.steps, max_steps=args.steps,
                                  save_every=10**6, lora_r=16, lora_alpha=32,
                                  dtype=m.get("dtype", "float32"))
    accelerator = Accelerator(cpu=True)
    model, tok = m["model"].load_base(MODEL, cfg, "cpu")
    model = m["model"].add_lora(model, cfg)
    items = [list(m["logprobs"].encode_pair(tok, p)) for p in pairs]
    on_ready()
    began = time.perf_counter()
    ref = m["dpo"].reference_logps(model, items, cfg.pack_tokens)
    reference = time.perf_counter() - began
    steps: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        m["trainer"].train(model, m["dpo"].DPOObjective(items, ref, cfg), cfg, Path(out),
                           accelerator, on_metrics=lambda s, x: steps.append(x))
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    return {"reference_s": reference, "step_s": [s["seconds"] for s in steps],
            "loss": [s["loss"] for s in steps], "ref": ref, "lora": lora}


def timing(args, pairs, paths: dict) -> dict:
    runs: dict = {name: [] for name in paths}
    for _ in range(args.repeats):
        for name, m in paths.items():
            runs[name].append(run_path(m, pairs, args))
            r = runs[name][-1]
            print(f"  {name:>8}: reference {r['reference_s']:6.1f} s, steps "
                  + ", ".join(f"{s:.1f} s" for s in r["step_s"]), flush=True)
    return runs


def memory_child(args) -> None:
    paths = all_paths(args)
    start = {}

    def reset():
        Path("/proc/self/clear_refs").write_text("5")
        start["rss"] = status("VmRSS")
    run_path(paths[args.child], step_pairs(args.pairs), args, on_ready=reset)
    print("RESULT " + json.dumps({"peak": status("VmHWM") - start["rss"],
                                  "hwm": status("VmHWM")}), flush=True)


def status(key: str) -> int:
    """A /proc/self/status field in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def memory(args, name: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--child", name],
                         capture_output=True, text=True)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not line:
        sys.exit(f"{name} memory child failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def profile(args, pairs, m: dict) -> None:
    """One step's reference pass and optimizer steps under torch.profiler, top ops."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        run_path(m, pairs, args)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


def report(args, pairs, runs: dict, mem: dict) -> None:
    """A row per path, then each path against the baseline: speed-ups, memory, differences."""
    total = {k: sum(r["reference_s"] + sum(r["step_s"]) for r in v) for k, v in runs.items()}
    step = {k: sum(sum(r["step_s"]) for r in v) / (len(v) * args.steps) for k, v in runs.items()}
    ref = {k: sum(r["reference_s"] for r in v) / len(v) for k, v in runs.items()}
    print(f"\n{len(pairs)} MiniShop step pairs, {args.steps} step(s), {args.repeats} repeat(s), "
          f"{torch.get_num_threads()} threads")
    print(f"{'':>10} {'reference s':>12} {'s/step':>8} {'total s':>8} {'peak MiB':>9}  losses")
    for k in runs:
        peak = f"{mem[k]['peak'] / 2**20:9.0f}" if mem else f"{'-':>9}"
        print(f"{k:>10} {ref[k]:12.1f} {step[k]:8.1f} {total[k]:8.1f} {peak}  "
              + " ".join(f"{x:.7f}" for x in runs[k][0]["loss"]))
    b = runs["baseline"][0]
    lora_max = max(v.abs().max().item() for v in b["lora"].values())
    for k in [k for k in runs if k != "baseline"]:
        n = runs[k][0]
        line = (f"{k}: speed-up over baseline: step {step['baseline'] / step[k]:.2f}x, "
                f"reference {ref['baseline'] / ref[k]:.2f}x, total {total['baseline'] / total[k]:.2f}x")
        if mem:
            line += (f"; peak memory {mem[k]['peak'] / mem['baseline']['peak']:.2f}x baseline's "
                     f"(VmHWM {mem[k]['hwm'] / 2**20:.0f} vs {mem['baseline']['hwm'] / 2**20:.0f} MiB)")
        print(line)
        loss = max(abs(x - y) for x, y in zip(b["loss"], n["loss"]))
        lora = max((b["lora"][w] - n["lora"][w]).abs().max().item() for w in b["lora"])
        print(f"  max |loss diff| {loss:.2e}; max |reference diff| "
              f"{(b['ref'] - n['ref']).abs().max().item():.2e}; max |adapter diff| {lora:.2e} "
              f"(of weights up to {lora_max:.2e})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", default="b1ba7ac", help="commit of the baseline training code")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per run")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each path, alternating")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory children")
    ap.add_argument("--bf16", action="store_true",
                    help="also run the new path with train.dtype bfloat16 (changes the losses)")
    ap.add_argument("--profile", choices=["baseline", "new", "new-bf16"],
                    help="profile one path instead")
    ap.add_argument("--rows", type=int, default=25, help="profile: ops listed")
    ap.add_argument("--child", choices=["baseline", "new", "new-bf16"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return memory_child(args)
    pairs = step_pairs(args.pairs)
    paths = all_paths(args)
    if args.profile:
        return profile(args, pairs, paths[args.profile])
    runs = timing(args, pairs, paths)
    mem = {} if args.no_memory else {k: memory(args, k) for k in paths}
    report(args, pairs, runs, mem)


if __name__ == "__main__":
    main()
