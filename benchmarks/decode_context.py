"""How much of a decode step is the context: what attention shared across rows could save.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/decode_context.py

Every MiniShop prompt begins with the same system prompt and demonstration (~600 tokens of a
~1,000-token deep step), yet each row of a decode batch reads its own copy of that prefix's
keys and values at every step. Attention that reads the shared prefix once for all rows
(cascade attention) could save at most the difference between a step at the full context and
a step at the context without the prefix. This prints decode steps of the embedded model
(float32, CPU) at batch 8 and 32 and contexts 100, 600 and 970, each as ms per step and as a
ratio against the shortest context at the same batch (the baseline, run in the same process).
"""

from __future__ import annotations

import argparse

from throughput import context_kv, decode_rate

from offline_agent.policy import DEFAULT_MODEL, load_policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[100, 600, 970],
                    help="context lengths in tokens (the first is the baseline)")
    ap.add_argument("--batches", type=int, nargs="+", default=[8, 32], help="decode rows")
    ap.add_argument("--steps", type=int, default=16, help="decode steps per timing")
    ap.add_argument("--reps", type=int, default=2, help="timings per shape (best kept)")
    args = ap.parse_args()
    model = load_policy(DEFAULT_MODEL, device="cpu", dtype="float32").model
    context = [100 + i % 40000 for i in range(max(args.contexts))]  # any real token ids
    ms = {}
    for length in args.contexts:
        kv = context_kv(model, context[:length])
        for batch in args.batches:
            rate = decode_rate(model, kv, context[0], batch, args.steps, args.reps)
            ms[length, batch] = 1000 * batch / rate
    print("| context | " + " | ".join(f"batch {b}: ms/step (vs {args.contexts[0]})"
                                       for b in args.batches) + " |")
    print("|---|" + "---|" * len(args.batches))
    for length in args.contexts:
        cells = [f"{ms[length, b]:.0f} ({ms[length, b] / ms[args.contexts[0], b]:.2f}x)"
                 for b in args.batches]
        print(f"| {length} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
