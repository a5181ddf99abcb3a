"""One RFT step and one outcome-DPO step (reference pass included) on a run's exported data:
a baseline commit's training code vs this tree's, side by side in one process.

The data are a real run's: `--export` is its export folder (`make demo` writes one), whose
RFT examples (successes and hindsight relabels) and trajectory pairs end with the episode's
last observation, unlike the benchmark step pairs of `dpo_step.py`. The baseline is
`offline_agent/training/` at `--baseline`, taken out of git as in `dpo_step.py`. Each
path loads the embedded model, adds a fresh LoRA adapter and runs one optimizer step on the
first `--items` examples (pairs); the paths alternate, their order reversed every repeat,
and the ratio is of the summed times. Losses must agree (printed).

    PYTHONPATH=. .venv/bin/python benchmarks/train_data_step.py --export RUN/export \\
        --baseline c6ae092 --repeats 3
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch
from dpo_step import MODEL, baseline_package, modules


def rows(export: Path, name: str) -> list[dict]:
    """A config's rows, all its shards (pipelines/export.py's layout)."""
    return pq.read_table(export / "data" / name).to_pylist()


def run(m: dict, kind: str, data: list[dict]) -> tuple[float, float, int]:
    """(seconds from the first encoding to the step's end, the step's loss, tokens packed)."""
    from accelerate import Accelerator

    cfg = m["config"].TrainConfig(batch_size=len(data), epochs=1, max_steps=1,
                                  save_every=10**6, lora_r=16, lora_alpha=32)
    model, tok = m["model"].load_base(MODEL, cfg, "cpu")
    torch.manual_seed(0)
    model = m["model"].add_lora(model, cfg)
    began = time.perf_counter()
    if kind == "rft":
        items = [[m["logprobs"].encode_example(tok, r)] for r in data]
        objective = m["rft"].RFTObjective(items)
    else:
        items = [list(m["logprobs"].encode_pair(tok, p)) for p in data]
        reference = m["dpo"].reference_logps(model, items, cfg.pack_tokens)
        objective = m["dpo"].DPOObjective(items, reference, cfg)
    steps: list[dict] = []
    with tempfile.TemporaryDirectory() as out:
        m["trainer"].train(model, objective, cfg, Path(out), Accelerator(cpu=True),
                           on_metrics=lambda s, x: steps.append(x))
    seconds = time.perf_counter() - began
    packed = sum(m["logprobs"].pack([s for i in g for s in items[i]]).ids.shape[1]
                 for g in m["logprobs"].groups(items, cfg.pack_tokens))
    return seconds, steps[-1]["loss"], packed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--export", type=Path, required=True, help="a run's export folder")
    ap.add_argument("--baseline", default="c6ae092", help="commit of the baseline training code")
    ap.add_argument("--items", type=int, default=8, help="examples (pairs) in the step")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each path, alternating")
    args = ap.parse_args()
    packages = {"baseline": baseline_package(args.baseline, Path(tempfile.mkdtemp())),
                "new": "offline_agent.training"}
    paths = {name: modules(package, rft=importlib.import_module(f"{package}.rft"))
             for name, package in packages.items()}
    data = {"rft": (rows(args.export, "rft") + rows(args.export, "hindsight"))[:args.items],
            "dpo_outcome": rows(args.export, "trajectory_pairs")[:args.items]}
    total = {(k, p): 0.0 for k in data for p in paths}
    for repeat in range(args.repeats):
        order = list(paths) if repeat % 2 == 0 else list(paths)[::-1]
        for kind in data:
            for name in order:
                seconds, loss, packed = run(paths[name], kind, data[kind])
                total[kind, name] += seconds
                print(f"  {kind:>11} {name:>8}: {seconds:6.1f} s, loss {loss:.7f}, "
                      f"{packed} tokens packed", flush=True)
    for kind in data:
        print(f"{kind} ({len(data[kind])} items, {args.repeats} repeats): baseline "
              f"{total[kind, 'baseline']:.1f} s, new {total[kind, 'new']:.1f} s, "
              f"{total[kind, 'baseline'] / total[kind, 'new']:.2f}x")


if __name__ == "__main__":
    main()
